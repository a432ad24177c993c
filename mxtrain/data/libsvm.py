"""Sparse rows of a LibSVM text file: the ``libsvm`` iterator.

Each line is ``label idx:val idx:val ...`` (indices 1-based unless ``zero_based``; features a
line does not list are 0; blank lines and ``#`` comments are skipped). The rows are held in
memory in compressed sparse row form (NumPy ``indptr``/``indices``/``values``) and **each batch
is densified**: batches are ``(batch_size, num_features)`` float32, so the models that read
dense rows (``mlp``) train on it unchanged. *Read sparse, trained dense*: our
BucketingModule binds every input as a dense array (``simple_bind`` without a storage-type
dictionary), so CSR batches (``mx.nd.sparse.csr_matrix``) would only be densified by a
fallback copy on every batch; true sparse training (``stype='csr'`` inputs feeding a sparse
``dot``) would need engine support that mxtrain does not have.

Everything else follows the ``ndarray``/``csv`` row iterators (:mod:`mxtrain.data.arrays`):
``task: classify`` (class ids ``0..C-1``) or ``regress``, one bucket keyed by ``(num_features,)``,
the last batch padded (``pad``, ``index`` -1 for padding), ``set_epoch(e)`` + ``reset()``
seeded order, strided ``num_parts``/``part_index`` with equal batch counts, the predict role
without labels (a line may then hold only features), and the run folder's ``vocab.json``
(a :class:`~mxtrain.data.arrays.RowMeta` whose ``feature_shape`` is ``(num_features,)``), which
eval, score and predict reuse so that their files may use fewer features than the training file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mxnet as mx
import numpy as np

from mxtrain.data.array_options import TASK_CLASSIFY
from mxtrain.data.arrays import (
    RowIter,
    RowMeta,
    check_same_task,
    class_labels,
    num_classes_of,
    prior_meta,
    regression_targets,
    row_iter_settings,
)
from mxtrain.data.base import DataContext, resolve_source
from mxtrain.data.sparse_image_options import LibsvmOptions
from mxtrain.errors import DataError
from mxtrain.memory_plan import available_memory
from mxtrain.user_files import RELATIVE_TO_CONFIG, open_file

# The largest feature index a file may hold: MXNet (built without large-tensor support) sizes
# every dimension with a 32-bit integer, and Python would otherwise parse 10**30 happily.
MAX_FEATURE_INDEX = 2**31 - 1
# When num_features is inferred, a largest index this many times the next largest (and at least
# STRAY_GAP columns past it) is taken for a typo: one stray "3000000:1" in a file of 100
# features would otherwise make every dense batch (and the first weight matrix) 30,000x wider.
STRAY_FACTOR = 10
STRAY_GAP = 10_000
# ...and so is an inferred width above SPARSE_WIDTH of which the file uses under 1 % of columns.
SPARSE_WIDTH = 100_000
SPARSE_USED_FRACTION = 0.01
# A dense batch exists several times at once (NumPy batch, its NDArray, the bound input, the
# prefetched next batch); refuse widths where those copies cannot fit in the available memory.
DENSE_BATCH_COPIES = 4


@dataclass
class SparseRows:
    """Rows in CSR form: row ``r`` has ``values[indptr[r]:indptr[r+1]]`` at ``indices[...]``."""

    indptr: np.ndarray  # int64 (rows + 1,)
    indices: np.ndarray  # int64 (nnz,), 0-based columns
    values: np.ndarray  # float32 (nnz,)
    labels: np.ndarray | None  # float64 (rows,) or None when the file has no labels
    lines: list[int]  # the file line of each row

    @property
    def rows(self) -> int:
        return int(self.indptr.size - 1)

    def dense(self, rows: np.ndarray, num_features: int) -> np.ndarray:
        """The given rows as a dense float32 ``(len(rows), num_features)`` array."""
        out = np.zeros((rows.size, num_features), dtype=np.float32)
        starts = self.indptr[rows]
        counts = self.indptr[rows + 1] - starts
        total = int(counts.sum())
        if total:
            where = np.repeat(np.arange(rows.size), counts)
            first = np.repeat(np.cumsum(counts) - counts, counts)
            pos = np.arange(total) - first + np.repeat(starts, counts)
            out[where, self.indices[pos]] = self.values[pos]
        return out


def read_libsvm(
    path: Path, *, zero_based: bool, need_label: bool, max_rows: int | None = None
) -> SparseRows:
    """Parse a LibSVM file; DataError naming ``file:line`` for the first malformed token.

    With ``need_label`` false (predicting) a line's first token may be a feature instead of a
    label; labels that are there are then skipped, not returned.
    """
    indptr = [0]
    indices: list[int] = []
    values: list[float] = []
    labels: list[float] = []
    lines: list[int] = []
    first_index = 0 if zero_based else 1
    handle = open_file(path, "LibSVM file", missing_hint=RELATIVE_TO_CONFIG, encoding="utf-8")
    with handle:
        line_no = 0
        try:
            for line_no, line in enumerate(handle, start=1):
                tokens = line.split("#", 1)[0].split()
                if not tokens:
                    continue
                if ":" not in tokens[0]:
                    label_token, features = tokens[0], tokens[1:]
                    labels.append(_label(label_token, path, line_no))
                elif need_label:
                    raise DataError(
                        f"{path}:{line_no}: the line starts with {tokens[0]!r}, not a label.",
                        hint="Each line is 'label idx:val idx:val ...'.",
                    )
                else:
                    features = tokens
                seen: set[int] = set()
                for token in features:
                    column = _feature(token, path, line_no, first_index, seen)
                    if column is None:
                        continue  # qid:N (ranking data) carries no feature
                    indices.append(column)
                    values.append(_value(token, path, line_no))
                indptr.append(len(indices))
                lines.append(line_no)
                if max_rows is not None and len(lines) >= max_rows:
                    break
        except UnicodeDecodeError as exc:
            raise DataError(
                f"The LibSVM file {path} is not UTF-8 text (after line {line_no}: {exc})."
            ) from None
    if not lines:
        raise DataError(f"The LibSVM file {path} has no rows.")
    return SparseRows(
        indptr=np.asarray(indptr, dtype=np.int64),
        indices=np.asarray(indices, dtype=np.int64),
        values=np.asarray(values, dtype=np.float32),
        labels=np.asarray(labels, dtype=np.float64) if labels and need_label else None,
        lines=lines,
    )


def _label(token: str, path: Path, line_no: int) -> float:
    try:
        value = float(token)
    except ValueError:
        hint = "Multi-label rows ('1,3') are not supported." if "," in token else None
        raise DataError(
            f"{path}:{line_no}: the label {token!r} is not a number.", hint=hint
        ) from None
    if not math.isfinite(value):
        raise DataError(f"{path}:{line_no}: the label is {token!r}, not a finite number.")
    return value


def _feature(token: str, path: Path, line_no: int, first: int, seen: set[int]) -> int | None:
    name, sep, _ = token.partition(":")
    if not sep:
        raise DataError(
            f"{path}:{line_no}: {token!r} is not an 'index:value' pair.",
            hint="Each line is 'label idx:val idx:val ...', separated by spaces.",
        )
    if name == "qid":
        return None
    try:
        index = int(name)
    except ValueError:
        raise DataError(f"{path}:{line_no}: in {token!r}, the index is not an integer.") from None
    if index < first:
        raise DataError(
            f"{path}:{line_no}: in {token!r}, the index {index} is below {first}.",
            hint="Indices start at 1 in LibSVM files; set zero_based: true for files whose "
            "indices start at 0."
            if first
            else None,
        )
    if index > MAX_FEATURE_INDEX:
        raise DataError(
            f"{path}:{line_no}: in {token!r}, the index {index} is beyond the largest supported "
            f"feature index ({MAX_FEATURE_INDEX:,}).",
            hint=f"Fix the index on line {line_no} (a typo?); mxtrain batches LibSVM rows densely, "
            "so a feature count that large cannot be trained.",
        )
    column = index - first
    if column in seen:
        raise DataError(f"{path}:{line_no}: the index {index} occurs twice on the line.")
    seen.add(column)
    return column


def _value(token: str, path: Path, line_no: int) -> float:
    text = token.partition(":")[2]
    try:
        value = float(text)
    except ValueError:
        raise DataError(f"{path}:{line_no}: in {token!r}, the value is not a number.") from None
    if not math.isfinite(value):
        raise DataError(f"{path}:{line_no}: in {token!r}, the value is not finite.")
    return value


def build_libsvm_iter(options: LibsvmOptions, context: DataContext) -> LibsvmIter:
    """Rows of a LibSVM file (see :class:`LibsvmOptions`) for ``context.role``."""
    predict = context.role == "predict"
    path = resolve_source(options.source, context.base_dir)
    source = str(path)
    prior = prior_meta(context, source)
    task = options.task
    check_same_task(prior, task, source)
    sparse = read_libsvm(
        path,
        zero_based=options.zero_based,
        need_label=not predict,
        max_rows=None if predict else options.max_rows,
    )
    largest = int(sparse.indices.max()) + 1 if sparse.indices.size else 0
    if prior is not None:
        if len(prior.feature_shape) != 1 or prior.integer_data:
            raise DataError(
                f"The model was trained on rows of shape {prior.feature_shape}, not on LibSVM "
                "features."
            )
        num_features = prior.feature_shape[0]
        if options.num_features is not None and options.num_features != num_features:
            raise DataError(
                f"num_features is {options.num_features} for {source}, but the model was "
                f"trained with {num_features} features.",
                hint="Leave num_features out of eval/score/predict data (the training value "
                "is reused).",
            )
    elif options.num_features is not None:
        num_features = options.num_features
    else:
        num_features = largest
        if num_features == 0:
            raise DataError(
                f"The LibSVM file {source} lists no features at all, so their number cannot "
                "be inferred.",
                hint="Set num_features.",
            )
        _refuse_stray_index(sparse, source, options.zero_based)
    if largest > num_features:
        bad = int(np.argmax(sparse.indices >= num_features))
        row = int(np.searchsorted(sparse.indptr, bad, side="right") - 1)
        index = int(sparse.indices[bad]) + (0 if options.zero_based else 1)
        raise DataError(
            f"{source}:{sparse.lines[row]}: feature index {index} is beyond num_features "
            f"({num_features}: indices {0 if options.zero_based else 1}.."
            f"{num_features - (1 if options.zero_based else 0)}).",
            hint="Raise num_features, or check zero_based."
            if prior is None
            else "The model was trained with fewer features; rows must use the training features.",
        )
    _refuse_unfittable_batch(options.batch_size, num_features, source)

    lines = sparse.lines
    where = lambda i: f"{source}:{lines[i]}"  # noqa: E731
    labels = sparse.labels
    num_classes: int | None = None
    if task == TASK_CLASSIFY:
        if labels is not None:
            labels = class_labels(labels, where, source)
        num_classes = num_classes_of(labels, prior, options.num_classes, source, where)
    elif labels is not None:
        labels = regression_targets(labels, where, source)
    meta = RowMeta(
        task=task,
        num_classes=num_classes,
        vocab_size=None,
        feature_shape=(num_features,),
        label_shape=(),
        integer_data=False,
    )
    settings = row_iter_settings(options, context.role, context.seed, source)
    return LibsvmIter(sparse, labels, meta=meta, **settings)


def _line_of_column(sparse: SparseRows, column: int) -> int:
    """The file line of the first row that lists the 0-based ``column``."""
    position = int(np.argmax(sparse.indices == column))
    return sparse.lines[int(np.searchsorted(sparse.indptr, position, side="right") - 1)]


def _refuse_stray_index(sparse: SparseRows, source: str, zero_based: bool) -> None:
    """DataError when the inferred num_features comes from an implausible (stray) index."""
    columns = np.unique(sparse.indices)  # sorted, 0-based
    width = int(columns[-1]) + 1
    next_width = int(columns[-2]) + 1 if columns.size > 1 else 0
    stray = width > STRAY_FACTOR * next_width and width - next_width > STRAY_GAP
    sparse_use = width > SPARSE_WIDTH and columns.size < SPARSE_USED_FRACTION * width
    if not (stray or sparse_use):
        return
    offset = 0 if zero_based else 1
    index = width - 1 + offset
    line = _line_of_column(sparse, width - 1)
    if stray:
        why = (
            f"the largest feature index {index:,} is more than {STRAY_FACTOR}x the next largest "
            f"({next_width - 1 + offset:,})"
        )
    else:
        why = (
            f"the file uses only {columns.size:,} distinct features of the {width:,} that its "
            f"largest index ({index:,}) implies"
        )
    raise DataError(
        f"{source}:{line}: {why}, so num_features inferred from it ({width:,}) looks like a "
        f"stray index: every dense batch and the first weight matrix would be {width:,} "
        "columns wide.",
        hint=f"Fix the index on line {line} if it is a typo; if the data really has that many "
        f"features, set the dimension explicitly with num_features: {width} in this data "
        "section (e.g. --set data.train.num_features=N).",
    )


def _refuse_unfittable_batch(batch_size: int, num_features: int, source: str) -> None:
    """DataError when dense batches of this width cannot fit in the available memory."""
    batch_bytes = batch_size * num_features * np.dtype(np.float32).itemsize
    available = available_memory()
    if available is None or batch_bytes * DENSE_BATCH_COPIES <= available:
        return
    raise DataError(
        f"The LibSVM data {source} is read as dense batches of {batch_size} x {num_features:,} "
        f"float32 features: {_gib(batch_bytes)} per batch, held about {DENSE_BATCH_COPIES} "
        f"times at once ({_gib(batch_bytes * DENSE_BATCH_COPIES)}), but only "
        f"{_gib(available)} of memory is available.",
        hint="Lower batch_size or num_features (check for stray feature indices).",
    )


def _gib(size: int) -> str:
    return f"{size / 2**30:,.2f} GiB"


class LibsvmIter(RowIter):
    """A :class:`RowIter` whose rows are kept sparse and densified one batch at a time."""

    def __init__(
        self,
        sparse: SparseRows,
        labels: np.ndarray | None,
        *,
        meta: RowMeta,
        **kwargs: Any,
    ) -> None:
        # The row machinery (order, sharding, padding, labels) runs on a zero-width stand-in;
        # the features come from ``sparse`` in next().
        placeholder = np.zeros((sparse.rows, 0), dtype=np.float32)
        super().__init__(placeholder, labels, meta=meta, **kwargs)
        self.sparse = sparse
        self.num_features = meta.feature_shape[0]
        shape = (self.num_features,)
        self.default_bucket_key = shape
        self.buckets = [shape]
        self.provide_data = [
            mx.io.DataDesc(self.data_name, (self.batch_size, *shape), np.float32, "NC")
        ]

    def next(self) -> Any:
        """The next batch, its rows densified."""
        batch = super().next()
        assert self._fill is not None
        lo = (self._cursor - 1) * self.batch_size
        take = self._fill[lo : lo + self.batch_size]
        batch.data = [mx.nd.array(self.sparse.dense(take, self.num_features), dtype=np.float32)]
        batch.provide_data = self.provide_data
        return batch

    def describe(self) -> str:
        """One line for the log."""
        nnz = int(self.sparse.indices.size)
        density = nnz / max(1, self.num_rows * self.num_features)
        text = super().describe()
        rest = text.partition("; ")[2]
        return (
            f"{self.source}: {self.num_rows} LibSVM rows, {self.num_features} features "
            f"({nnz} non-zeros, density {density:.3g}; read sparse, batches dense); {rest}"
        )
