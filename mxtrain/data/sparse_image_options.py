"""Options of the ``libsvm`` and ``image_record`` iterators (no MXNet import: the config layer
reads them).

``libsvm`` serves rows of a LibSVM text file (``label idx:val idx:val ...``) for classification
or regression; ``image_record`` serves images of an MXNet RecordIO file (``.rec``, optionally
with its ``.idx``) for classification. See :mod:`mxtrain.data.libsvm` and
:mod:`mxtrain.data.image_record` for what the batches hold.

Construction checks the values as in :mod:`mxtrain.data.array_options`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from mxtrain.data import source_options as shared
from mxtrain.data.array_options import TASK_CLASSIFY, RowOptions
from mxtrain.errors import InvalidValue
from mxtrain.option_checks import (
    check_bool,
    check_positive_int,
    check_sharding,
    check_thread_count,
    documented,
    not_int,
)


@dataclass(frozen=True)
class LibsvmOptions(RowOptions):
    """Rows of a LibSVM text file: ``label idx:val idx:val ...``, one row per line.

    Indices are 1-based as in the LibSVM tools unless ``zero_based: true``; features that a
    row does not list are 0. Blank lines and ``#`` comments are skipped. Rows are kept sparse
    in memory and each batch is densified (``(batch_size, num_features)`` float32).
    """

    num_features: int | None = documented(
        None,
        "number of features (default: the largest index of the training file, "
        "+1 when zero_based); eval, score and predict reuse the training value (vocab.json)",
    )
    zero_based: bool = documented(
        False, "indices start at 0 (false: at 1, as written by the LibSVM tools)"
    )

    def validate(self) -> None:
        super().validate()
        check_bool("zero_based", self.zero_based)
        shared.check_optional_positive_int("num_features", self.num_features)
        if self.num_features is not None:
            shared.check_batch(
                "a densified batch", self.batch_size, ("num_features", self.num_features)
            )


@dataclass(frozen=True)
class ImageRecordOptions(shared.SourceOptions):
    """Images of an MXNet RecordIO file, decoded and augmented by ``mx.io.ImageRecordIter``."""

    source: str = field(
        metadata={"doc": shared.data_file_doc("the .rec file, ImageRecordIter's path_imgrec")}
    )
    data_shape: list[int] = field(
        metadata={"doc": "shape of one output image [channels, height, width] (channels 1 or 3)"},
    )
    num_classes: int | None = documented(
        None,
        "number of classes (labels are class ids 0..C-1); required for training, "
        "eval data reuses the training data's",
    )
    path_imgidx: str | None = documented(
        None,
        "the .idx index of source (default: source with the suffix .idx, if it "
        "exists); ignored, with a warning, when its name does not match source's",
    )
    task: Literal["classify"] = documented("classify", "classify (the only task of this iterator)")
    batch_size: int = shared.batch_size_field("images")
    shuffle: bool = shared.shuffle_field(
        "the images", "eval and predict iterators always read in file order"
    )
    rand_crop: bool = documented(False, "train only: random crops")
    rand_mirror: bool = documented(False, "train only: random mirroring")
    resize: int = documented(-1, "scale the shorter edge to this many pixels first (-1: keep)")
    mean_r: float = documented(0.0, "subtracted from the R channel")
    mean_g: float = documented(0.0, "subtracted from the G channel")
    mean_b: float = documented(0.0, "subtracted from the B channel")
    std_r: float = documented(1.0, "the R channel is divided by this")
    std_g: float = documented(1.0, "the G channel is divided by this")
    std_b: float = documented(1.0, "the B channel is divided by this")
    scale: float = documented(1.0, "multiply pixels by this after mean/std (e.g. 0.00390625)")
    num_parts: int = shared.num_parts_field(
        "split the file among this many workers (ImageRecordIter's byte-range "
        "partition: parts may differ in size by a batch)"
    )
    part_index: int = shared.part_index_field()
    preprocess_threads: int = documented(
        1, "decoding/augmentation threads of ImageRecordIter (at most 1024)"
    )
    data_name: str = shared.data_name_field()
    label_name: str = shared.label_name_field()

    def validate(self) -> None:
        """Raise ``InvalidValue`` naming the first impossible value."""
        shared.check_source(self.source, "the path of the .rec file")
        if self.path_imgidx is not None and (
            not isinstance(self.path_imgidx, str) or not self.path_imgidx.strip()
        ):
            raise InvalidValue("path_imgidx", "must be the path of the .idx file (or null)")
        shape = self.data_shape
        if (
            not isinstance(shape, list | tuple)
            or len(shape) != 3
            or any(not_int(d) or d < 1 for d in shape)
        ):
            raise InvalidValue("data_shape", f"must be [channels, height, width], not {shape!r}")
        if shape[0] not in (1, 3):
            raise InvalidValue("data_shape", f"must have 1 or 3 channels, not {shape[0]}")
        if self.task != TASK_CLASSIFY:
            raise InvalidValue("task", f"must be classify, not {self.task!r}")
        shared.check_num_classes(self.num_classes)
        check_positive_int("batch_size", self.batch_size)
        shared.check_batch(
            "a batch of images", self.batch_size, *(("data_shape", d) for d in shape)
        )
        if self.num_classes is not None:
            shared.check_batch(
                "the class probabilities of a batch",
                self.batch_size,
                ("num_classes", self.num_classes),
            )
        check_sharding(self.num_parts, self.part_index)
        check_thread_count("preprocess_threads", self.preprocess_threads)
        if not_int(self.resize) or (self.resize < 1 and self.resize != -1):
            raise InvalidValue("resize", f"must be a positive integer or -1, not {self.resize!r}")
        for name in ("std_r", "std_g", "std_b"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise InvalidValue(name, f"must be a positive number, not {value!r}")
        for name in ("mean_r", "mean_g", "mean_b", "scale"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidValue(name, f"must be a number, not {value!r}")
        if self.scale == 0:
            raise InvalidValue("scale", "must not be 0")
        for name in ("rand_crop", "rand_mirror", "shuffle"):
            check_bool(name, getattr(self, name))
        shared.check_input_names(self.data_name, self.label_name)
