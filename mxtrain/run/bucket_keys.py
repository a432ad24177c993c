"""Bucket keys read back from a run folder, checked before a model is unrolled or bound for
them.

A checkpoint's ``state.json`` records the training buckets (``bucket_keys``) and
``model_inputs.json`` the default bucket and the buckets the model was built for; score,
predict, resume and export unroll and bind the model for those keys. A key edited by hand
(``50000000``, ``-3``, ``"x"``) would have MXNet unroll a graph or allocate arrays for it,
for minutes and gigabytes, before anything failed; these checks refuse it first, naming the
file (a RunFolderError, exit 5).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mxtrain.errors import RunFolderError
from mxtrain.option_checks import MAX_SEQUENCE_LENGTH, MAX_TENSOR_ELEMENTS
from mxtrain.run.folder import RunFolder
from mxtrain.run.layout import STATE_FILE
from mxtrain.user_files import read_file

#: a model's training buckets: sequence lengths, or (source, target) length pairs
BucketKeys = tuple[int, ...] | tuple[tuple[int, int], ...]

#: what every model_inputs.json holds (export needs data_info too)
MODEL_INPUTS_KEYS = {"default_bucket_key", "provide_data"}


def as_tuples(value: Any) -> Any:
    """JSON lists back to the tuples they were (shapes, bucket keys), recursively."""
    return tuple(as_tuples(v) for v in value) if isinstance(value, list) else value


def key_problem(key: Any) -> str | None:
    """Why ``key`` cannot be a bucket key, or None: a sequence length is an integer from 1 to
    :data:`MAX_SEQUENCE_LENGTH`, a shape a tuple of positive integers whose product fits
    one array; a plugin's string key is taken as it is."""
    if isinstance(key, str):
        return None
    if isinstance(key, tuple):
        if not key or any(type(d) is not int or d < 1 for d in key):
            return "a shape key must be positive integers"
        if math.prod(key) > MAX_TENSOR_ELEMENTS:
            return f"a shape key must hold at most {MAX_TENSOR_ELEMENTS:,} elements"
        return None
    if type(key) is not int:
        return "a bucket key is a sequence length, a shape or a name"
    if not 1 <= key <= MAX_SEQUENCE_LENGTH:
        return f"a sequence length must be from 1 to {MAX_SEQUENCE_LENGTH:,}"
    return None


def _refuse(file: Path, what: str, value: Any, problem: str) -> RunFolderError:
    shown = json.dumps(value, default=str)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return RunFolderError(
        f"{file} holds impossible {what} {shown}: {problem}.",
        hint="The file was edited or damaged after training; restore it from a copy (or the "
        "run folder as `mxtrain fit` wrote it), or train the run again.",
    )


def check_keys(
    keys: Any, file: Path, what: str, *, trained: Sequence[Any] | None = None
) -> list[Any]:
    """``keys`` (decoded from ``file``: tuples for JSON lists) as a list, each a possible
    bucket key and, given ``trained`` (the buckets the model was built for), one of those;
    a RunFolderError naming ``file`` and ``what`` otherwise."""
    if not isinstance(keys, list | tuple) or not keys:
        raise _refuse(file, what, keys, "expected a non-empty list of bucket keys")
    for key in keys:
        problem = key_problem(key)
        if problem is None and trained is not None and key not in trained:
            problem = f"{key!r} is not one of the model's training buckets {list(trained)}"
        if problem is not None:
            raise _refuse(file, what, list(keys), problem)
    return list(keys)


def read_model_inputs(run: RunFolder) -> dict[str, Any] | None:
    """``model_inputs.json`` of ``run`` (None for a run trained before it was written), its
    default bucket key and buckets checked; a RunFolderError for a file that is not such a
    record."""
    file = run.model_inputs_file
    if not os.path.lexists(file):
        return None
    data = read_file(file, "model description", error=RunFolderError)  # a folder, a FIFO...
    try:
        saved = json.loads(data.decode("utf-8"))
    except ValueError as exc:  # UnicodeDecodeError included
        raise RunFolderError(
            f"The model description {file} is not UTF-8 JSON ({exc}).",
            hint="Restore it from a copy of the run folder, or train the run again.",
        ) from None
    if not isinstance(saved, dict) or not set(saved) >= MODEL_INPUTS_KEYS:
        raise _refuse(file, "model inputs", saved, "expected the record `mxtrain fit` writes")
    check_keys([as_tuples(saved["default_bucket_key"])], file, "default_bucket_key")
    if saved.get("buckets") is not None:
        check_keys(as_tuples(saved["buckets"]), file, "buckets")
    return saved


def trained_keys(saved: dict[str, Any]) -> list[Any]:
    """The buckets a :func:`read_model_inputs` record says the model was trained with."""
    return [as_tuples(k) for k in saved.get("buckets") or [saved["default_bucket_key"]]]


def checkpoint_keys(loaded: Any, run: RunFolder) -> list[Any] | None:
    """The bucket keys a loaded checkpoint's ``state.json`` records (None: none recorded),
    each possible and, where ``model_inputs.json`` lists them, one of the training buckets;
    a RunFolderError naming state.json otherwise."""
    keys = loaded.bucket_keys
    if keys is None:
        return None
    saved = read_model_inputs(run)
    trained = trained_keys(saved) if saved is not None else None
    return check_keys(keys, loaded.checkpoint.path / STATE_FILE, "bucket_keys", trained=trained)
