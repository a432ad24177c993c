"""Row-wise data for classifiers and regressors: the ``ndarray`` and ``csv`` iterators.

Every row of a table is one example: its features (a float vector, an image ``(C, H, W)``, or
a row of integer token ids) and its label (a class id ``0..C-1`` for ``task: classify``, one or
several floats for ``task: regress``). Batches are ``(batch_size, *feature_shape)`` float32
data and ``(batch_size, *label_shape)`` float32 labels. There is one bucket, whose key is the
feature shape (a tuple), so our BucketingModule trains these models unchanged.

Batches carry ``pad`` (padding rows at the end of the batch), ``index`` (the 0-based source row
of each batch row, -1 for padding) and ``num_tokens`` (non-zero ids of the real rows, for token
data; None otherwise). The last partial batch is padded, never dropped. Padding rows repeat
real rows of the same part as data and carry a label the loss and metrics ignore: -1 for
classification (``DataInfo.pad_id``: SoftmaxOutput ``ignore_label`` and the metrics' ``pad_id``),
NaN for regression (the regression head and metrics skip NaN targets).

Order: ``set_epoch(e)`` then ``reset()``. A train iterator with ``shuffle`` permutes all rows
with a generator seeded by ``(seed, epoch)``, so a resumed run replays the order; eval and
predict iterators read in file order.

Sharding (``num_parts`` > 1, one part per distributed worker): the rows (after the shuffle,
which is the same on every worker) are dealt out **strided**: part ``k`` gets rows ``k, k + P,
k + 2P, ...``. Every part runs the same number of batches, ``ceil(ceil(rows / P) /
batch_size)`` (``dist_sync`` hangs otherwise): a part that comes out shorter is **padded**
(never trimmed), and the log says how many padding rows each part got.

Roles (``DataContext.role``): ``train`` derives the number of classes (and, for token data, the
vocabulary size) from the data unless the options give them, and exposes them as ``vocab``
(a :class:`RowMeta`, which ``mxtrain fit`` saves as the run folder's ``vocab.json``). ``eval``
reuses the train iterator's, or the run folder's ``vocab.json`` (``DataContext.vocab_file``).
``predict`` (``mxtrain predict --input FILE``) reads features only (an ``.npy`` without labels,
an ``.npz`` without ``label_key``, a CSV without the label column are all accepted), one part,
every row, in input order; ``num_rows`` says how many rows it read.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import math
import zipfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mxnet as mx
import numpy as np

from mxtrain.data.array_options import (
    CLASSIFY_PAD_LABEL,
    TASK_CLASSIFY,
    TASK_REGRESS,
    ArrayDataInfo,
    CsvOptions,
    NDArrayOptions,
    RowOptions,
)
from mxtrain.data.base import DataContext, resolve_source
from mxtrain.errors import DataError, MxtrainError
from mxtrain.run.atomic import atomic_write_text
from mxtrain.user_files import (
    RELATIVE_TO_CONFIG,
    UnusableFile,
    as_error,
    open_file,
    read_file,
    read_regular,
)
from mxtrain.user_files import require_file as require_regular_file

log = logging.getLogger(__name__)

META_KIND = "mxtrain-rows"  # the "kind" of a vocab.json written by these iterators
MAX_EXACT_ID = 2**24  # token ids travel as float32, exact up to here
# What np.load and an .npz member read raise for a truncated or damaged file (a cut .npz is
# not a zip at all: BadZipFile; a damaged member fails its CRC or does not inflate).
_NUMPY_READ_ERRORS = (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error)
_SHOWN_CLASSES = 10  # describe() lists per-class counts up to this many classes

Where = Callable[[int], str]  # row number -> "file row 3" / "file:5" for messages


# --------------------------------------------------------------------------------------------
# What a trained model needs to read new rows (the run folder's vocab.json)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RowMeta:
    """The facts about the training rows that a model's shapes depend on.

    ``mxtrain fit`` saves it as ``vocab.json`` in the run folder (any train iterator's
    ``vocab`` is saved there), so that ``score``, ``predict`` and ``resume`` rebuild the model
    with the same number of classes and inputs however different their data is.
    """

    task: str
    num_classes: int | None  # classify only
    vocab_size: int | None  # integer (token id) data only
    feature_shape: tuple[int, ...]
    label_shape: tuple[int, ...]  # () or (K,) regression targets per row
    integer_data: bool
    feature_columns: tuple[str, ...] | None = None  # csv: the feature columns, in model order
    label_column: str | None = None  # csv

    def to_json(self) -> dict[str, Any]:
        out = {"kind": META_KIND, **dataclasses.asdict(self)}
        for key in ("feature_shape", "label_shape", "feature_columns"):
            if out[key] is not None:
                out[key] = list(out[key])
        return out

    def save(self, path: str | Path) -> None:
        """Write it as JSON (atomically: a crash leaves no partial file)."""
        atomic_write_text(Path(path), json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> RowMeta:
        """Read a file written by :meth:`save`; DataError if it is anything else."""
        try:
            raw = json.loads(read_file(Path(path), "data description").decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise DataError(f"The data description {path} cannot be read: {exc}.") from None
        if not isinstance(raw, dict) or raw.get("kind") != META_KIND:
            raise DataError(
                f"{path} was not written by the ndarray/csv iterators (it is, e.g., a language "
                "model's vocabulary), so it cannot describe row data.",
                hint="Score or predict with the iterator the run was trained with.",
            )
        try:
            columns = raw.get("feature_columns")
            return cls(
                task=str(raw["task"]),
                num_classes=None if raw["num_classes"] is None else int(raw["num_classes"]),
                vocab_size=None if raw["vocab_size"] is None else int(raw["vocab_size"]),
                feature_shape=tuple(int(d) for d in raw["feature_shape"]),
                label_shape=tuple(int(d) for d in raw["label_shape"]),
                integer_data=bool(raw["integer_data"]),
                feature_columns=None if columns is None else tuple(str(c) for c in columns),
                label_column=raw.get("label_column"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(f"The data description {path} is damaged ({exc!r}).") from None


# --------------------------------------------------------------------------------------------
# Builders (the registered factories)
# --------------------------------------------------------------------------------------------


def build_ndarray_iter(options: NDArrayOptions, context: DataContext) -> RowIter:
    """Rows of a ``.npy`` (+ labels ``.npy``) or ``.npz`` file, for ``context.role``."""
    predict = context.role == "predict"
    path = resolve_source(options.source, context.base_dir)
    want_labels = not predict
    if path.suffix == ".npz":
        data, labels, label_file = _load_npz(path, options, want_labels)
    else:
        data = _load_npy(path, "data file")
        labels, label_file = None, ""
        if want_labels:
            if options.labels is None:
                raise DataError(
                    f"The data file {path} is a .npy array of features, but no labels file "
                    "was given.",
                    hint="Set labels: FILE.npy (one label per row), or use an .npz file with "
                    f"'{options.data_key}' and '{options.label_key}' arrays.",
                )
            label_path = resolve_source(options.labels, context.base_dir)
            label_file = str(label_path)
            labels = _load_npy(label_path, "labels file")
    data = _check_table(data, str(path))
    if labels is not None and (labels.ndim == 0 or labels.shape[0] != data.shape[0]):
        count = "a single value" if labels.ndim == 0 else f"{labels.shape[0]} labels"
        raise DataError(
            f"The labels {label_file} hold {count}, but the data {path} has {data.shape[0]} rows.",
            hint="Give exactly one label per row of the data, in the same order.",
        )
    if options.max_rows is not None and not predict:
        data = data[: options.max_rows]
        labels = labels[: options.max_rows] if labels is not None else None
    if data.dtype.kind == "f":
        _check_finite(data, lambda i: f"{path} row {i}")
    return _finish(
        data,
        labels,
        lambda i: f"{label_file} row {i}",
        str(label_file),
        str(path),
        options,
        context,
    )


def build_csv_iter(options: CsvOptions, context: DataContext) -> RowIter:
    """Rows of a CSV file with a header line (see :class:`CsvOptions`)."""
    predict = context.role == "predict"
    path = resolve_source(options.source, context.base_dir)
    prior = prior_meta(context, str(path))
    columns = prior.feature_columns if prior is not None else None
    if columns is None and options.feature_columns is not None:
        columns = tuple(options.feature_columns)
    table = _read_csv(
        path,
        delimiter=options.delimiter,
        label_column=options.label_column,
        feature_columns=columns,
        need_label=not predict,
        max_rows=None if predict else options.max_rows,
    )
    data, labels, lines, names = table
    where = lambda i: f"{path}:{lines[i]}"  # noqa: E731
    _check_finite(data, where, names)
    return _finish(
        data,
        labels,
        lambda i: f"{path}:{lines[i]}: label column {options.label_column!r}",
        f"{path} (label column {options.label_column!r})",
        str(path),
        options,
        context,
        feature_columns=names,
        label_column=options.label_column,
        prior=prior,
    )


def _finish(
    data: np.ndarray,
    labels: np.ndarray | None,
    where_label: Where,
    label_source: str,
    source: str,
    options: NDArrayOptions | CsvOptions,
    context: DataContext,
    *,
    feature_columns: tuple[str, ...] | None = None,
    label_column: str | None = None,
    prior: RowMeta | None = None,
) -> RowIter:
    """Check labels against the task, settle the RowMeta and build the iterator."""
    role = context.role
    if prior is None:
        prior = prior_meta(context, source)
    task = options.task
    check_same_task(prior, task, source)
    integer = data.dtype.kind in "iu"
    if integer:
        data = _check_ids(data, source)
    shape = tuple(int(d) for d in data.shape[1:])
    if prior is not None:
        _check_shape(prior, data, shape, source)

    vocab_size = None
    if integer or (prior is not None and prior.integer_data):
        vocab_size = _vocab_size(data, prior, getattr(options, "vocab_size", None), source)

    num_classes: int | None = None
    label_shape: tuple[int, ...] = ()
    if task == TASK_CLASSIFY:
        if labels is not None:
            labels = class_labels(labels, where_label, label_source)
        num_classes = num_classes_of(labels, prior, options.num_classes, source, where_label)
    else:
        if labels is not None:
            labels = regression_targets(labels, where_label, label_source)
            label_shape = tuple(int(d) for d in labels.shape[1:])
            if prior is not None and prior.label_shape != label_shape:
                raise DataError(
                    f"The targets of {source} have shape {label_shape or 'scalar'} per row, but "
                    f"the model was trained on {prior.label_shape or 'scalar'} targets."
                )
        elif prior is not None:
            label_shape = prior.label_shape

    meta = RowMeta(
        task=task,
        num_classes=num_classes,
        vocab_size=vocab_size,
        feature_shape=prior.feature_shape if prior is not None else shape,
        label_shape=label_shape,
        integer_data=prior.integer_data if prior is not None else integer,
        feature_columns=feature_columns,
        label_column=label_column,
    )
    return RowIter(
        data, labels, meta=meta, **row_iter_settings(options, role, context.seed, source)
    )


def check_same_task(prior: RowMeta | None, task: str, source: str) -> None:
    """Data read for a trained model must use the task it was trained with."""
    if prior is not None and prior.task != task:
        raise DataError(
            f"The data {source} is read with task: {task}, but the model was trained with "
            f"task: {prior.task}.",
            hint=f"Use task: {prior.task} for all data of one model.",
        )


def row_iter_settings(options: RowOptions, role: str, seed: int, source: str) -> dict[str, Any]:
    """What every row iterator takes from its options and role: train shuffles, predict reads
    every row (one part), the others read their part."""
    predict = role == "predict"
    return {
        "batch_size": options.batch_size,
        "shuffle": options.shuffle and role == "train",
        "seed": seed,
        "num_parts": 1 if predict else options.num_parts,
        "part_index": 0 if predict else options.part_index,
        "source": source,
        "data_name": options.data_name,
        "label_name": options.label_name,
    }


# --------------------------------------------------------------------------------------------
# Reading files
# --------------------------------------------------------------------------------------------


def require_file(path: Path, what: str) -> None:
    """DataError unless the data file ``path`` is a regular file we may read."""
    require_regular_file(path, what, missing_hint=RELATIVE_TO_CONFIG)


def _unreadable_numpy_error(path: Path, what: str, exc: BaseException) -> MxtrainError:
    """The error to raise when np.load failed on ``path``: what is wrong with the file."""
    if isinstance(exc, OSError) and exc.errno is not None:  # not the content: say what it is
        return as_error(UnusableFile.from_os_error(path, exc), what)
    text = str(exc)
    try:
        head = read_regular(path, limit=5)
    except UnusableFile as problem:
        return as_error(problem, what)
    if head != b"\x93NUMPY" and not head.startswith(b"PK"):
        return DataError(
            f"The {what} {path} is not a NumPy file: it starts with neither the .npy header "
            "nor a zip (.npz) signature.",
            hint="Write it with np.save (one array) or np.savez (named arrays).",
        )
    if isinstance(exc, ValueError) and ("pickle" in text.lower() or "object" in text.lower()):
        return DataError(
            f"The {what} {path} is neither a plain NumPy array nor an .npz archive of them "
            "(loading it would unpickle Python objects, which mxtrain never does).",
            hint="Save numeric arrays with np.save / np.savez (no object or string arrays).",
        )
    return DataError(
        f"The {what} {path} cannot be read as a NumPy file ({type(exc).__name__}: {text}).",
        hint="Is it truncated or not written by np.save / np.savez?",
    )


def _load_npy(path: Path, what: str) -> np.ndarray:
    require_file(path, what)
    try:
        loaded = np.load(path, allow_pickle=False)
    except _NUMPY_READ_ERRORS as exc:
        raise _unreadable_numpy_error(path, what, exc) from None
    if not isinstance(loaded, np.ndarray):
        loaded.close()
        raise DataError(
            f"The {what} {path} is an .npz archive, not a single .npy array.",
            hint="Rename it to .npz and point source at it (data_key/label_key pick its arrays).",
        )
    return _numeric(loaded, path, what)


def _load_npz(
    path: Path, options: NDArrayOptions, want_labels: bool
) -> tuple[np.ndarray, np.ndarray | None, str]:
    require_file(path, "data file")
    try:
        archive = np.load(path, allow_pickle=False)
    except _NUMPY_READ_ERRORS as exc:
        raise _unreadable_numpy_error(path, "data file", exc) from None
    if isinstance(archive, np.ndarray):
        raise DataError(
            f"The data file {path} is a single .npy array, not an .npz archive.",
            hint="Rename it to .npy and give its labels with labels: FILE.npy.",
        )
    with archive:
        keys = sorted(archive.files)
        wanted = [options.data_key] + ([options.label_key] if want_labels else [])
        for key in wanted:
            if key not in keys:
                which = "data_key" if key == options.data_key else "label_key"
                raise DataError(
                    f"The data file {path} has no array {key!r} ({which}); it has "
                    f"{', '.join(map(repr, keys)) or 'none'}.",
                    hint=f"Set {which} to one of them.",
                )
        try:
            data = archive[options.data_key]
            labels = archive[options.label_key] if want_labels else None
        except _NUMPY_READ_ERRORS as exc:
            raise _unreadable_numpy_error(path, "data file", exc) from None
    where = f"{path} [{options.label_key!r}]"
    data = _numeric(data, path, f"data file [{options.data_key!r}]")
    if labels is not None:
        labels = _numeric(labels, path, f"labels [{options.label_key!r}] in")
    return data, labels, where


def _numeric(array: np.ndarray, path: Path, what: str) -> np.ndarray:
    if array.dtype.names is not None or array.dtype.kind not in "biuf":
        raise DataError(
            f"The {what} {path} holds {array.dtype} values; mxtrain needs numbers "
            "(integers, floats or booleans).",
            hint="Convert it, e.g. np.save(path, array.astype(np.float32)).",
        )
    if array.dtype.kind == "b":
        array = array.astype(np.float32)
    return array


def _check_table(data: np.ndarray, source: str) -> np.ndarray:
    if data.ndim < 2:
        raise DataError(
            f"The data {source} has shape {data.shape}; it must be (rows, features...) with "
            "one row per example.",
            hint="A single feature per row is shape (rows, 1): save array.reshape(-1, 1).",
        )
    if data.shape[0] == 0:
        raise DataError(f"The data {source} has no rows.", hint="Give at least one example.")
    if any(d == 0 for d in data.shape[1:]):
        raise DataError(f"The data {source} has rows of shape {data.shape[1:]}: no features.")
    return data


def _check_finite(data: np.ndarray, where: Where, columns: Sequence[str] | None = None) -> None:
    if data.dtype.kind != "f":
        return
    flat = data.reshape(data.shape[0], -1)
    ok = np.isfinite(flat)
    if ok.all():
        return
    bad_rows = np.flatnonzero(~ok.all(axis=1))
    row = int(bad_rows[0])
    col = int(np.flatnonzero(~ok[row])[0])
    value = flat[row, col]
    what = f"column {columns[col]!r}" if columns is not None else f"feature {col}"
    raise DataError(
        f"{where(row)}: {what} is {value} ({len(bad_rows)} row(s) have NaN or infinite values).",
        hint="Remove those rows or fill in the missing values before training.",
    )


def _check_ids(data: np.ndarray, source: str) -> np.ndarray:
    low, high = int(data.min()), int(data.max())
    if low < 0:
        row = int(np.flatnonzero((data < 0).reshape(data.shape[0], -1).any(axis=1))[0])
        raise DataError(
            f"{source} row {row}: token id {low} is negative; integer data are token ids "
            "(0 = padding).",
            hint="Save features as a float array, or shift the ids to start at 1.",
        )
    if high >= MAX_EXACT_ID:
        raise DataError(
            f"{source}: token id {high} is too large (ids must be below {MAX_EXACT_ID:,}).",
            hint="Save features as a float array if these are not token ids.",
        )
    return data


def _check_shape(prior: RowMeta, data: np.ndarray, shape: tuple[int, ...], source: str) -> None:
    if prior.integer_data and data.dtype.kind not in "iu":
        raise DataError(
            f"The data {source} holds {data.dtype} values, but the model reads integer token ids.",
            hint="Save the ids as an integer array (e.g. array.astype(np.int32)).",
        )
    if shape == prior.feature_shape:
        return
    if prior.integer_data and len(shape) == 1 and len(prior.feature_shape) == 1:
        return  # token rows of another length: a bucket of their own
    raise DataError(
        f"The data {source} has rows of shape {shape}, but the model was trained on rows of "
        f"shape {prior.feature_shape}.",
        hint="Give data with the training data's features, in the same layout.",
    )


def _vocab_size(data: np.ndarray, prior: RowMeta | None, option: int | None, source: str) -> int:
    high = int(data.max()) if data.dtype.kind in "iu" else 0
    if prior is not None and prior.vocab_size is not None:
        size, origin = prior.vocab_size, "the training data's vocabulary"
    elif option is not None:
        size, origin = option, "vocab_size"
    else:
        return max(high + 1, 2)
    if high >= size:
        row = int(np.flatnonzero((data >= size).reshape(data.shape[0], -1).any(axis=1))[0])
        raise DataError(
            f"{source} row {row}: token id {high} is outside {origin} (ids 0..{size - 1}).",
            hint="Map unknown tokens to an id the model knows, or set a larger vocab_size and "
            "train again.",
        )
    return size


def class_labels(labels: np.ndarray, where: Where, source: str) -> np.ndarray:
    if labels.ndim == 2 and labels.shape[1] == 1:
        labels = labels[:, 0]
    if labels.ndim != 1:
        raise DataError(
            f"The labels {source} must be one class id per row, shape (rows,), not {labels.shape}.",
            hint="For several real-valued targets per row use task: regress.",
        )
    if labels.dtype.kind == "f":
        bad = ~np.isfinite(labels) | (labels != np.round(labels))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise DataError(
                f"{where(i)}: label {labels[i]} is not an integer; classify labels are class "
                "ids 0..C-1.",
                hint="For real-valued targets use task: regress.",
            )
    negative = labels < 0
    if negative.any():
        i = int(np.flatnonzero(negative)[0])
        raise DataError(
            f"{where(i)}: label {labels[i]:g} is negative; classify labels are class ids 0..C-1.",
            hint="Map the classes to 0, 1, 2, ...",
        )
    if labels.size and labels.max() >= MAX_EXACT_ID:
        raise DataError(f"{where(int(labels.argmax()))}: class id {labels.max():g} is too large.")
    return labels.astype(np.float32)


def num_classes_of(
    labels: np.ndarray | None,
    prior: RowMeta | None,
    option: int | None,
    source: str,
    where: Where,
) -> int:
    if prior is not None and prior.num_classes is not None:
        if option is not None and option != prior.num_classes:
            raise DataError(
                f"The data {source} has num_classes: {option}, but the model was trained with "
                f"{prior.num_classes} classes.",
                hint="Leave num_classes out of eval sections: they reuse the training data's.",
            )
        size, origin = prior.num_classes, "the classes the model was trained on"
    elif option is not None:
        size, origin = option, "num_classes"
    elif labels is None:
        raise DataError(
            f"The number of classes of {source} is unknown: the data has no labels and there is "
            "no trained model's data description.",
            hint="Set num_classes, or predict from a run folder written by `mxtrain fit`.",
        )
    else:
        size = int(labels.max()) + 1
        if size < 2:
            raise DataError(
                f"The labels of {source} are all 0: a classifier needs at least two classes.",
                hint="Check the labels, or set num_classes if some classes are only missing "
                "from this data.",
            )
        return size
    if labels is not None and labels.size and labels.max() >= size:
        i = int(labels.argmax())
        raise DataError(
            f"{where(i)}: label {labels[i]:g} is not among {origin} (0..{size - 1}).",
            hint="Set num_classes to the true number of classes and train again."
            if origin == "num_classes"
            else "Eval data can only hold classes the training data has.",
        )
    return size


def regression_targets(labels: np.ndarray, where: Where, source: str) -> np.ndarray:
    if labels.ndim > 2:
        raise DataError(
            f"The targets {source} must have shape (rows,) or (rows, K), not {labels.shape}."
        )
    flat = labels.reshape(labels.shape[0], -1).astype(np.float64)
    bad = ~np.isfinite(flat).all(axis=1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise DataError(
            f"{where(i)}: target {labels[i]} is not a finite number "
            f"({int(bad.sum())} row(s) have NaN or infinite targets).",
            hint="Remove those rows before training.",
        )
    return labels.astype(np.float32)


def prior_meta(context: DataContext, source: str) -> RowMeta | None:
    """The training data's RowMeta: the train iterator's, else the run folder's vocab.json."""
    if context.role != "train":
        train_meta = getattr(context.train, "vocab", None)
        if isinstance(train_meta, RowMeta):
            return train_meta
    vocab_file = context.vocab_file
    if vocab_file is None:
        return None
    # the run folder's file: a relative path is relative to the current folder, as the run
    # folder given on the command line (the config's folder is tried second)
    path = Path(vocab_file).expanduser()
    if not path.is_file():
        path = resolve_source(str(vocab_file), context.base_dir)
    if not path.is_file():
        return None
    return RowMeta.load(path)


def _read_csv(
    path: Path,
    *,
    delimiter: str,
    label_column: str,
    feature_columns: Sequence[str] | None,
    need_label: bool,
    max_rows: int | None,
) -> tuple[np.ndarray, np.ndarray | None, list[int], tuple[str, ...]]:
    """(features float64 (rows, F), labels float64 or None, file line of each row, names)."""
    handle = open_file(
        path, "CSV file", missing_hint=RELATIVE_TO_CONFIG, encoding="utf-8-sig", newline=""
    )
    cells: list[list[str]] = []
    labels_raw: list[str] = []
    lines: list[int] = []
    with handle:
        reader = csv.reader(handle, delimiter=delimiter, strict=True)
        try:
            header = next(reader, None)
            if header is None:
                raise DataError(
                    f"The CSV file {path} is empty; it needs a header line naming the columns."
                )
            header = [h.strip() for h in header]
            _check_header(path, header)
            if label_column in header:
                label_at: int | None = header.index(label_column)
            elif need_label:
                raise DataError(
                    f"{path}:1: the header has no label column {label_column!r} (columns: "
                    f"{', '.join(header)}).",
                    hint="Set label_column to the name of the column that holds the labels.",
                )
            else:
                label_at = None
            if feature_columns is None:
                names = tuple(h for h in header if h != label_column)
                if not names:
                    raise DataError(f"{path}:1: the header has no feature columns.")
            else:
                names = tuple(feature_columns)
                missing = [c for c in names if c not in header]
                if missing:
                    raise DataError(
                        f"{path}:1: the header has no column {', '.join(map(repr, missing))} "
                        f"(columns: {', '.join(header)}).",
                        hint="The features must be the columns the model was trained on "
                        "(feature_columns).",
                    )
            picks = [header.index(c) for c in names]
            width = len(header)
            for row in reader:
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue  # a blank line
                if len(row) != width:
                    raise DataError(
                        f"{path}:{reader.line_num}: {len(row)} fields, but the header has "
                        f"{width} ({delimiter!r}-separated).",
                        hint="Every row needs a value for every column; quote fields that "
                        "contain the delimiter.",
                    )
                cells.append([row[i] for i in picks])
                if label_at is not None:
                    labels_raw.append(row[label_at])
                lines.append(reader.line_num)
                if max_rows is not None and len(cells) >= max_rows:
                    break
        except csv.Error as exc:
            raise DataError(f"{path}:{reader.line_num}: malformed CSV ({exc}).") from None
        except UnicodeDecodeError as exc:
            raise DataError(
                f"The CSV file {path} is not UTF-8 text (after line {reader.line_num}: {exc}).",
                hint="Convert it, e.g. 'iconv -f latin1 -t utf-8 in.csv > out.csv'.",
            ) from None
    if not cells:
        raise DataError(f"The CSV file {path} has a header but no rows.")
    data = _floats(cells, names, lines, path)
    labels = None
    if label_at is not None:
        labels = _floats([[v] for v in labels_raw], (label_column,), lines, path)[:, 0]
    return data, labels, lines, names


def _check_header(path: Path, header: list[str]) -> None:
    for i, name in enumerate(header):
        if not name:
            raise DataError(
                f"{path}:1: column {i + 1} of the header has no name.",
                hint="Name every column in the header line.",
            )
    seen: set[str] = set()
    for name in header:
        if name in seen:
            raise DataError(f"{path}:1: the header names the column {name!r} twice.")
        seen.add(name)


def _floats(cells: list[list[str]], names: Sequence[str], lines: list[int], path: Path) -> Any:
    try:
        return np.array(cells, dtype=np.str_).astype(np.float64)
    except ValueError:
        pass
    for r, row in enumerate(cells):  # find the first bad cell, to name it
        for c, cell in enumerate(row):
            try:
                float(cell)
            except ValueError:
                shown = "empty" if not cell.strip() else f"{cell!r}, not a number"
                raise DataError(
                    f"{path}:{lines[r]}: column {names[c]!r} is {shown}.",
                    hint="Every feature and label cell must hold a number.",
                ) from None
    raise DataError(f"The CSV file {path} has cells that are not numbers.")  # pragma: no cover


# --------------------------------------------------------------------------------------------
# The iterator
# --------------------------------------------------------------------------------------------


def _layout(shape: tuple[int, ...], integer: bool) -> str | None:
    if len(shape) == 1:
        return "NT" if integer else "NC"
    return {2: "NHW", 3: "NCHW"}.get(len(shape))


def _check_rows(
    rows: int, labels: np.ndarray | None, num_parts: int, part_index: int, source: str
) -> None:
    """A label per row, and a row at least for each of the ``num_parts`` parts."""
    if labels is not None and labels.shape[0] != rows:
        raise ValueError(f"{labels.shape[0]} labels for {rows} rows")
    if not 0 <= part_index < num_parts:
        raise ValueError(f"part_index {part_index} is not in 0..{num_parts - 1}")
    if rows < num_parts:
        raise DataError(
            f"The data {source} has {rows} rows, fewer than num_parts ({num_parts}): some "
            "parts would get no rows at all.",
            hint="Use fewer parts or more data.",
        )


class RowIter(mx.io.DataIter):
    """Fixed-size batches of rows (see the module docstring for padding, order and sharding).

    ``data`` is ``(rows, *feature_shape)``; ``labels`` ``(rows,)`` class ids, ``(rows,)`` or
    ``(rows, K)`` regression targets, or None (predicting: the label input is bound but unused,
    filled with the padding label, or 0 for regression).
    """

    def __init__(
        self,
        data: np.ndarray,
        labels: np.ndarray | None,
        *,
        meta: RowMeta,
        batch_size: int,
        shuffle: bool = False,
        seed: int = 0,
        num_parts: int = 1,
        part_index: int = 0,
        source: str = "<rows>",
        data_name: str = "data",
        label_name: str = "softmax_label",
    ) -> None:
        super().__init__(batch_size)
        rows = int(data.shape[0])
        _check_rows(rows, labels, num_parts, part_index, source)
        self.meta = meta
        self.vocab = meta  # what `mxtrain fit` saves in the run folder (vocab.json)
        self.source = source
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = int(seed)
        self.epoch = 0
        self.num_parts = num_parts
        self.part_index = part_index
        self.data_name = data_name
        self.label_name = label_name
        self.num_rows = rows
        self.integer_data = data.dtype.kind in "iu"
        self._data = np.ascontiguousarray(data, dtype=np.float32)
        regress = meta.task == TASK_REGRESS
        self._pad_label = np.nan if regress else float(CLASSIFY_PAD_LABEL)
        self.has_labels = labels is not None
        if labels is None:
            fill = 0.0 if regress else float(CLASSIFY_PAD_LABEL)
            labels = np.full((rows, *meta.label_shape), fill, dtype=np.float32)
        self._labels = np.ascontiguousarray(labels, dtype=np.float32)
        self._row_tokens = (
            (self._data != 0).reshape(rows, -1).sum(axis=1) if self.integer_data else None
        )

        shape = tuple(int(d) for d in data.shape[1:])
        self.default_bucket_key = shape
        self.buckets = [shape]
        self.provide_data = [
            mx.io.DataDesc(
                data_name, (batch_size, *shape), np.float32, _layout(shape, self.integer_data)
            )
        ]
        label_shape = tuple(self._labels.shape[1:])
        self.provide_label = [
            mx.io.DataDesc(
                label_name, (batch_size, *label_shape), np.float32, "NC" if label_shape else "N"
            )
        ]
        self.data_info = ArrayDataInfo(
            vocab_size=meta.vocab_size,
            num_classes=meta.num_classes,
            pad_id=None if regress else CLASSIFY_PAD_LABEL,
            task=meta.task,
            feature_shape=meta.feature_shape,
            label_shape=meta.label_shape,
            integer_data=meta.integer_data,
            data_name=data_name,
            label_name=label_name,
        )
        per_part = -(-rows // num_parts)
        self.num_batches = max(1, -(-per_part // batch_size))
        self.part_rows = len(range(part_index, rows, num_parts))
        self.padding_rows = self.num_batches * batch_size - self.part_rows
        if num_parts > 1:
            self._log_part()
        self._order: np.ndarray | None = None
        self._fill: np.ndarray | None = None
        self._built_epoch: int | None = None
        self._cursor = 0
        self.reset()

    def _log_part(self) -> None:
        """Say which rows this worker's part holds and how it is padded (distributed)."""
        log.info(
            "%s: part %d of %d gets every %d-th row of the %s order, starting at "
            "position %d: %d rows; every part runs %d batches of %d, so %d padding rows "
            "are added to this part (padded, not trimmed: padding is ignored by loss and "
            "metrics)",
            self.source,
            self.part_index,
            self.num_parts,
            self.num_parts,
            "shuffled" if self.shuffle else "file",
            self.part_index,
            self.part_rows,
            self.num_batches,
            self.batch_size,
            self.padding_rows,
        )

    # -- order --------------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next ``reset()`` produces."""
        self.epoch = int(epoch)

    def epoch_rows(self, epoch: int | None = None) -> np.ndarray:
        """This part's source rows for ``epoch`` in batch order, -1 for padding rows."""
        epoch = self.epoch if epoch is None else epoch
        rows = np.arange(self.num_rows, dtype=np.int64)
        if self.shuffle:
            rng = np.random.default_rng([self.seed % 2**64, epoch % 2**64])
            rows = rng.permutation(self.num_rows).astype(np.int64)
        mine = rows[self.part_index :: self.num_parts]
        out = np.full(self.num_batches * self.batch_size, -1, dtype=np.int64)
        out[: mine.size] = mine
        return out

    def reset(self) -> None:
        """Start the epoch set by ``set_epoch``; its order depends on (seed, epoch) alone."""
        self._cursor = 0
        if self._order is not None and (not self.shuffle or self._built_epoch == self.epoch):
            return
        order = self.epoch_rows()
        real = order[order >= 0]
        # padding rows repeat this part's own rows as data (their labels mark them as padding)
        self._fill = np.where(order >= 0, order, real[np.arange(order.size) % real.size])
        self._order = order
        self._built_epoch = self.epoch

    def next(self) -> Any:
        """The next batch."""
        if self._cursor >= self.num_batches:
            raise StopIteration
        assert self._order is not None and self._fill is not None
        lo = self._cursor * self.batch_size
        hi = lo + self.batch_size
        self._cursor += 1
        index = self._order[lo:hi]
        take = self._fill[lo:hi]
        real = index >= 0
        data = self._data[take]
        label = self._labels[take]
        pad = int((~real).sum())
        if pad:
            label[~real] = self._pad_label
        batch = mx.io.DataBatch(
            data=[mx.nd.array(data, dtype=np.float32)],
            label=[mx.nd.array(label, dtype=np.float32)],
            pad=pad,
            index=index.copy(),
            bucket_key=self.default_bucket_key,
            provide_data=self.provide_data,
            provide_label=self.provide_label,
        )
        tokens = None
        if self._row_tokens is not None:
            tokens = int(self._row_tokens[index[real]].sum())
        batch.num_tokens = tokens
        return batch

    def __len__(self) -> int:
        return self.num_batches

    def class_counts(self) -> np.ndarray | None:
        """Rows per class (classification data with labels), else None."""
        if self.meta.task != TASK_CLASSIFY or not self.has_labels:
            return None
        ids = self._labels.astype(np.int64)
        return np.bincount(ids[ids >= 0], minlength=self.meta.num_classes or 0)

    def describe(self) -> str:
        """One line for the log."""
        meta = self.meta
        kind = "token ids" if self.integer_data else "float"
        text = f"{self.source}: {self.num_rows} rows of shape {self.default_bucket_key} ({kind})"
        if meta.vocab_size is not None:
            text += f", vocab {meta.vocab_size}"
        if meta.task == TASK_CLASSIFY:
            text += f"; classify, {meta.num_classes} classes"
            counts = self.class_counts()
            if counts is not None and counts.size <= _SHOWN_CLASSES:
                text += " (rows per class " + "/".join(str(int(c)) for c in counts) + ")"
        else:
            shape = meta.label_shape
            text += f"; regress, {math.prod(shape) if shape else 1} target(s) per row"
        text += f"; {self.num_batches} batches of {self.batch_size}"
        if self.num_parts > 1:
            text += f", part {self.part_index} of {self.num_parts} (strided, {self.part_rows} rows)"
        text += f", {self.padding_rows} padding rows"
        text += "; shuffled by (seed, epoch)" if self.shuffle else "; file order"
        return text
