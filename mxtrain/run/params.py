"""MXNet parameter files: the one reader of ``arg:NAME`` / ``aux:NAME`` array files.

Checkpoints (``params.nd``) and the top-level ``<prefix>-NNNN.params`` files are read through
:func:`read_params` (and named by :func:`params_file_entries`); each caller words the error for its
reader (a checkpoint falls back to an older one, ``score`` names the epoch to pick instead).
Whether the arrays fit a model is :func:`param_problems`, the one check before MXNet sees them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mxtrain.errors import ConfigError, DataError, MxtrainError
from mxtrain.mxnet_errors import mxnet_reason
from mxtrain.user_files import UnusableFile, check_regular


class ParamsFileError(ValueError):
    """A parameter file that cannot be used; ``problem`` completes "the file ...".

    ``kind`` says which problem: ``unreadable`` (MXNet refused the file; ``detail`` is its
    reason), ``unnamed`` (arrays without names), ``entry`` (a name that is neither ``arg:``
    nor ``aux:``; ``detail`` is the name) or ``empty`` (no arrays at all).
    """

    def __init__(self, kind: str, problem: str, detail: str = "") -> None:
        super().__init__(problem)
        self.kind = kind
        self.problem = problem
        self.detail = detail


def load_named_arrays(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Every array of an ``mx.nd.save`` file by name (``{}`` for a saved empty dict)."""
    import mxnet as mx  # deferred: importing mxnet costs ~1 s for commands that only read

    try:
        check_regular(path)  # MXNet would hang on a FIFO and call unreadable files damaged
    except UnusableFile as exc:
        raise ParamsFileError("unreadable", exc.problem, exc.problem) from None
    try:
        loaded = mx.nd.load(os.fspath(path))
    except (mx.base.MXNetError, OSError) as exc:
        reason = mxnet_reason(exc)
        raise ParamsFileError("unreadable", f"cannot be read by MXNet ({reason})", reason) from exc
    if isinstance(loaded, list):
        if loaded:
            raise ParamsFileError("unnamed", "holds arrays without names")
        return {}  # mx.nd.save of an empty dict loads as []
    return dict(loaded)


def read_params(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(arg_params, aux_params)`` of a parameter file whose every entry is named
    ``arg:NAME`` or ``aux:NAME``; :class:`ParamsFileError` says what is wrong otherwise."""
    args: dict[str, Any] = {}
    auxs: dict[str, Any] = {}
    for key, value in load_named_arrays(path).items():
        kind, _, name = key.partition(":")
        if kind == "arg":
            args[name] = value
        elif kind == "aux":
            auxs[name] = value
        else:
            raise ParamsFileError("entry", f"has the entry {key!r} (expected arg:/aux: names)", key)
    if not args and not auxs:
        raise ParamsFileError("empty", "holds no parameters")
    return args, auxs


def params_file_entries(arg: Mapping[str, Any], aux: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of a parameter file (``arg:NAME``, ``aux:NAME``) for these arrays: what
    :func:`read_params` reads back."""
    entries = {f"arg:{k}": v for k, v in arg.items()}
    entries.update({f"aux:{k}": v for k, v in aux.items()})
    return entries


#: (arg shapes, aux shapes) of a model by name; None where a shape is not known
ParamShapes = tuple[Mapping[str, Sequence[int] | None], Mapping[str, Sequence[int] | None]]


def param_problems(
    model: ParamShapes,
    given: tuple[Mapping[str, Any], Mapping[str, Any]],
    *,
    source: str,
    allow_missing: bool = False,
    allow_extra: bool = False,
) -> list[str]:
    """Why the arrays ``given`` (arg_params, aux_params) do not fit a model whose parameter
    and auxiliary-state shapes are ``model``: names one side lacks (unless allowed) and
    shapes that differ, each a phrase naming ``source`` ("the checkpoint"); empty if they fit.

    The one comparison behind score, predict, export and resume: they check before handing
    the arrays to MXNet, whose own complaint is a C++ traceback.
    """
    problems = []
    for kind, shapes, arrays in (
        ("parameter", model[0], given[0]),
        ("auxiliary state", model[1], given[1]),
    ):
        missing = [n for n in shapes if n not in arrays]
        extra = sorted(set(arrays) - set(shapes))
        if missing and not allow_missing:
            problems.append(f"the model's {kind}s {', '.join(missing)} are not in {source}")
        if extra and not allow_extra:
            problems.append(f"{source} has {kind}s not in the network: {', '.join(extra)}")
        for name, want in shapes.items():
            if name in arrays and want is not None:
                have = tuple(int(d) for d in arrays[name].shape)
                if have != tuple(want):
                    problems.append(
                        f"{kind} {name} has shape {have} in {source} but the model needs "
                        f"{tuple(want)}"
                    )
    return problems


class ParamsMismatchError(DataError):
    """A parameter file that does not fit the model built from a config; ``problems`` are
    :func:`param_problems`' phrases."""

    def __init__(self, message: str, *, hint: str, params_file: Path, problems: list[str]):
        super().__init__(message, hint=hint)
        self.params_file = params_file
        self.problems = problems


def params_mismatch_error(
    params_file: Path, config_file: Path, problems: list[str], overrides: Sequence[str]
) -> MxtrainError:
    """The error for a checkpoint that does not fit the model built from ``config_file`` and
    the ``--set`` ``overrides``.

    A ``model.*`` override changes the model: a ConfigError naming it. Without one,
    config.yaml itself no longer matches its checkpoint (edited, or copied from another run):
    a ParamsMismatchError (exit 3).
    """
    model_changes = [o.strip() for o in overrides if o.strip().startswith("model.")]
    found = "; ".join(problems)
    if model_changes:
        return ConfigError(
            f"The checkpoint {params_file} does not fit the model built from {config_file} "
            f"with {', '.join(model_changes)}: {found}.",
            hint=f"{', '.join(model_changes)} change the model, whose shape the checkpoint "
            "fixes; leave them out (start a new run with `mxtrain fit` for another model).",
        )
    return ParamsMismatchError(
        f"The checkpoint {params_file} does not fit the model built from {config_file}: {found}.",
        hint=f"The model section of {config_file} was changed after training, or the params "
        "file and config.yaml come from different runs; use the run folder exactly as "
        "`mxtrain fit` wrote it.",
        params_file=params_file,
        problems=problems,
    )
