"""Options of the ``ndarray`` and ``csv`` iterators (no MXNet import: the config layer reads them).

Both iterators serve whole rows of a table (features, and a label per row) in fixed-size
batches for classification (``task: classify``: labels are integer class ids ``0..C-1``) or
regression (``task: regress``: float targets). See :mod:`mxtrain.data.arrays` for what the
batches hold, how shuffling and sharding work and what ``mxtrain predict`` reads.

Construction checks the values and raises ``InvalidValue`` naming the first impossible one; the
config loader turns that into a ``ConfigError`` pointing at the YAML file and line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from mxtrain.data import source_options as shared
from mxtrain.data.base import DataInfo
from mxtrain.errors import InvalidValue
from mxtrain.option_checks import (
    check_choice,
    check_positive_int,
    check_sharding,
    check_tensor,
    documented,
)

TASK_CLASSIFY = "classify"  # a softmax over num_classes per row; labels are class ids
TASK_REGRESS = "regress"  # real-valued outputs per row; labels are float targets
TASKS = (TASK_CLASSIFY, TASK_REGRESS)

#: Label value of the padding rows of a classification batch (ignored by loss and metrics).
CLASSIFY_PAD_LABEL = -1


@dataclass(frozen=True)
class ArrayDataInfo(DataInfo):
    """:class:`DataInfo` plus what a row-wise model needs to know about its inputs.

    ``pad_id`` is the label of padding rows (-1 for classification; regression pads with NaN
    targets and has no pad id). Token inputs (integer arrays) pad with id 0 inside rows.
    """

    feature_shape: tuple[int, ...] = ()  # shape of one row's features, e.g. (20,) or (1, 28, 28)
    label_shape: tuple[int, ...] = ()  # () for one label per row, (K,) for K regression targets
    integer_data: bool = False  # features are integer token ids (pad id 0)
    data_name: str = "data"  # the model's data input
    label_name: str = "softmax_label"  # the model's label input


@dataclass(frozen=True)
class RowOptions(shared.SourceOptions):
    """Options shared by the row iterators (``ndarray``, ``csv``, ``libsvm``)."""

    source: str = field(metadata={"doc": shared.data_file_doc("the data file")})
    task: Literal["classify", "regress"] = documented(
        "classify",
        "classify: labels are integer class ids 0..C-1 (a softmax per row); "
        "regress: labels are float targets (the model outputs values)",
    )
    num_classes: int | None = documented(
        None,
        "classify: number of classes (default: the largest training label + 1); "
        "eval data reuses the training data's",
    )
    batch_size: int = shared.batch_size_field("rows")
    shuffle: bool = shared.shuffle_field(
        "the rows", "eval and predict iterators always read in file order"
    )
    num_parts: int = shared.num_parts_field(
        "split the rows among this many workers (distributed training): part k gets "
        "rows k, k + num_parts, ... (strided, after shuffling); every part gets the same "
        "number of batches (short parts are padded, nothing is dropped)"
    )
    part_index: int = shared.part_index_field()
    max_rows: int | None = documented(None, "read only the first N rows (quick runs and tests)")
    data_name: str = shared.data_name_field()
    label_name: str = shared.label_name_field()

    def validate(self) -> None:
        """Raise ``InvalidValue`` naming the first impossible value."""
        shared.check_source(self.source, "the path of the data file")
        check_choice("task", self.task, TASKS)
        check_positive_int("batch_size", self.batch_size)
        check_sharding(self.num_parts, self.part_index)
        shared.check_optional_positive_int("max_rows", self.max_rows)
        shared.check_num_classes(self.num_classes)
        if self.num_classes is not None and self.task != TASK_CLASSIFY:
            raise InvalidValue("num_classes", "is only meaningful with task: classify")
        classes = [("num_classes", self.num_classes)] if self.num_classes is not None else []
        shared.check_batch("the class probabilities of a batch", self.batch_size, *classes)
        shared.check_input_names(self.data_name, self.label_name)


@dataclass(frozen=True)
class NDArrayOptions(RowOptions):
    """Rows of a NumPy array: a ``.npy`` file (labels in a second ``.npy``) or an ``.npz``.

    Float arrays are features; integer arrays are token ids (for ``rnn_classifier``: rows of
    ids right-padded with 0, which is never a real token).
    """

    #: what a csv-style (or mistyped) key most likely means here, for "Did you mean" hints
    key_synonyms: ClassVar[dict[str, str]] = {
        "label_column": "label_key",
        "feature_columns": "data_key",
        "label": "labels",
        "features": "source",
    }

    labels: str | None = documented(
        None,
        ".npy file of the labels, one per row of source (only for a .npy source; "
        "an .npz holds its labels under label_key); not read by `mxtrain predict`",
    )
    data_key: str = documented("data", "the features' key in an .npz source")
    label_key: str = documented("label", "the labels' key in an .npz source")
    vocab_size: int | None = documented(
        None,
        "integer (token id) data: number of ids, pad id 0 included (default: the "
        "largest training id + 1)",
    )

    def validate(self) -> None:
        super().validate()
        if not self.source.endswith((".npy", ".npz")):
            raise InvalidValue("source", f"must be a .npy or .npz file, not {self.source!r}")
        if self.labels is not None:
            if not isinstance(self.labels, str) or not self.labels.endswith(".npy"):
                raise InvalidValue("labels", f"must be a .npy file, not {self.labels!r}")
            if self.source.endswith(".npz"):
                raise InvalidValue(
                    "labels",
                    "is only for a .npy source: an .npz source holds its labels under "
                    f"label_key ({self.label_key!r})",
                )
        for name in ("data_key", "label_key"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise InvalidValue(name, f"must be a non-empty key, not {value!r}")
        if self.vocab_size is not None:
            check_positive_int("vocab_size", self.vocab_size)
            if self.vocab_size < 2:
                raise InvalidValue("vocab_size", "must be at least 2 (pad id 0 and a token)")
            check_tensor("vocab_size", "a one-hot row of the ids", [self.vocab_size])


@dataclass(frozen=True)
class CsvOptions(RowOptions):
    """Rows of a CSV file with a header line: one column is the label, the others features."""

    #: what an ndarray-style key most likely means here, for "Did you mean" hints
    key_synonyms: ClassVar[dict[str, str]] = {
        "label_key": "label_column",
        "labels": "label_column",
        "data_key": "feature_columns",
    }

    label_column: str = documented(
        "label", "name of the label column (may be absent from `mxtrain predict` inputs)"
    )
    feature_columns: list[str] | None = documented(
        None, "names of the feature columns, in this order (default: all but the label)"
    )
    delimiter: str = documented(",", "the field separator, one character")

    def validate(self) -> None:
        super().validate()
        if not isinstance(self.label_column, str) or not self.label_column:
            raise InvalidValue("label_column", f"must be a column name, not {self.label_column!r}")
        if not isinstance(self.delimiter, str) or len(self.delimiter) != 1:
            raise InvalidValue(
                "delimiter",
                f"must be exactly one character, not {self.delimiter!r} "
                r"(write '\t' in double quotes for tabs)",
            )
        if self.delimiter in ('"', "\n", "\r"):
            raise InvalidValue("delimiter", f"cannot be {self.delimiter!r}")
        if self.feature_columns is not None:
            columns = list(self.feature_columns)
            if not columns:
                raise InvalidValue("feature_columns", "must name at least one column (or be null)")
            if any(not isinstance(c, str) or not c for c in columns):
                raise InvalidValue("feature_columns", f"must be column names, got {columns}")
            if len(set(columns)) != len(columns):
                doubles = sorted({c for c in columns if columns.count(c) > 1})
                raise InvalidValue("feature_columns", f"lists {', '.join(doubles)} more than once")
            if self.label_column in columns:
                raise InvalidValue(
                    "feature_columns", f"includes the label column {self.label_column!r}"
                )
