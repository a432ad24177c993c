"""Images of an MXNet RecordIO file: the ``image_record`` iterator.

A thin wrapper around ``mx.io.ImageRecordIter`` (MXNet's C++ reader: decoding with its
built-in OpenCV, resizing, cropping, mirroring, mean/std normalisation and ``scale`` in
``preprocess_threads`` threads) that behaves like mxtrain's other iterators:

* batches are ``(batch_size, C, H, W)`` float32 images and ``(batch_size,)`` class ids, with
  one bucket whose key is the data shape ``(C, H, W)``; ``data_info`` says ``task: classify``
  with ``num_classes`` (an option: it is required for training, and eval, score and predict
  reuse the training value from the train iterator or the run folder's ``vocab.json``);
* the last partial batch is padded (``pad`` from ImageRecordIter, which fills it with images
  from the start of the file) and its padding rows get the label -1, which the loss and the
  metrics ignore;
* order: ``set_epoch(e)`` then ``reset()``. ImageRecordIter shuffles (and draws its random
  crops and mirrors) on its own, from its ``seed``; mxtrain rebuilds the reader at every
  ``reset()`` with a seed derived from (seed, epoch), so an epoch's order and augmentation
  depend on (seed, epoch) alone and a resumed run replays them (rebuilding also keeps
  ImageRecordIter's ``round_batch`` from carrying padding into the next epoch). The shuffle is
  ImageRecordIter's (within its decode buffer, see ``shuffle_chunk_size``), not a global
  permutation;
* ``num_parts``/``part_index`` use ImageRecordIter's partition of the file into byte ranges,
  so parts of images of different sizes may differ in length (by a batch or more):
  unlike the row iterators, equal batch counts per part are **not** guaranteed;
* ``index`` (the 0-based record of each batch row, -1 for padding) is filled when the order is
  the file's (eval and predict, one part); shuffled or sharded batches have ``index`` None.
  The predict role reads every record in file order without augmentation and reports
  ``num_rows`` (counted from the ``.idx`` file, or by scanning the ``.rec``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import mxnet as mx
import numpy as np

from mxtrain.data.array_options import CLASSIFY_PAD_LABEL, TASK_CLASSIFY, ArrayDataInfo
from mxtrain.data.arrays import RowMeta, prior_meta, require_file
from mxtrain.data.base import DataContext, resolve_source
from mxtrain.data.sparse_image_options import ImageRecordOptions
from mxtrain.errors import DataError
from mxtrain.mxnet_errors import mxnet_reason
from mxtrain.user_files import open_file

log = logging.getLogger(__name__)


def build_image_record_iter(options: ImageRecordOptions, context: DataContext) -> ImageRecordIter:
    """Images of ``options.source`` (a RecordIO file) for ``context.role``."""
    path = resolve_source(options.source, context.base_dir)
    require_file(path, "RecordIO file")
    index_path = _index_file(options, path, context.base_dir)
    prior = prior_meta(context, str(path))
    shape = tuple(int(d) for d in options.data_shape)
    if prior is not None:
        if prior.task != TASK_CLASSIFY or prior.feature_shape != shape:
            raise DataError(
                f"The data {path} is read as images of shape {shape} for task classify, but the "
                f"model was trained on rows of shape {prior.feature_shape} for task {prior.task}.",
                hint="Use the training data's data_shape.",
            )
        if options.num_classes is not None and options.num_classes != prior.num_classes:
            raise DataError(
                f"The data {path} has num_classes: {options.num_classes}, but the model was "
                f"trained with {prior.num_classes} classes.",
                hint="Leave num_classes out of eval sections: they reuse the training data's.",
            )
        num_classes = prior.num_classes
    else:
        num_classes = options.num_classes
    if num_classes is None:
        raise DataError(
            f"The number of classes of {path} is unknown: image_record needs num_classes.",
            hint="Set num_classes in the train section (labels are class ids 0..C-1).",
        )
    meta = RowMeta(
        task=TASK_CLASSIFY,
        num_classes=num_classes,
        vocab_size=None,
        feature_shape=shape,
        label_shape=(),
        integer_data=False,
    )
    return ImageRecordIter(options, meta, path, index_path, role=context.role, seed=context.seed)


def _index_file(options: ImageRecordOptions, rec: Path, base_dir: Path) -> Path | None:
    if options.path_imgidx is None:
        beside = rec.with_suffix(".idx")
        return beside if beside.is_file() else None
    index = resolve_source(options.path_imgidx, base_dir)
    if index.stem != rec.stem:
        # e.g. `mxtrain score --data other.rec` replaced source but not the index
        log.warning("%s: ignoring path_imgidx %s, which belongs to another file", rec, index)
        beside = rec.with_suffix(".idx")
        return beside if beside.is_file() else None
    require_file(index, "RecordIO index file")
    return index


def count_records(rec: Path, index: Path | None) -> int:
    """Records in ``rec``: the lines of its index, else a scan of the file."""
    if index is not None:
        with open_file(index, "RecordIO index file", encoding="utf-8") as handle:
            return sum(1 for line in handle if line.strip())
    reader = mx.recordio.MXRecordIO(str(rec), "r")
    count = 0
    try:
        while reader.read() is not None:
            count += 1
    finally:
        reader.close()
    return count


class ImageRecordIter(mx.io.DataIter):
    """``mx.io.ImageRecordIter`` with mxtrain's conventions (see the module docstring)."""

    def __init__(
        self,
        options: ImageRecordOptions,
        meta: RowMeta,
        rec: Path,
        index: Path | None,
        *,
        role: str,
        seed: int,
    ) -> None:
        super().__init__(options.batch_size)
        self.options = options
        self.meta = meta
        self.vocab = meta  # saved as the run folder's vocab.json
        self.source = str(rec)
        self.index_file = index
        self.role = role
        self.seed = int(seed)
        self.epoch = 0
        self.batch_size = options.batch_size
        train = role == "train"
        self.shuffle = options.shuffle and train
        self.augment = train and (options.rand_crop or options.rand_mirror)
        predict = role == "predict"
        self.num_parts = 1 if predict else options.num_parts
        self.part_index = 0 if predict else options.part_index
        self.file_order = not self.shuffle and self.num_parts == 1
        self.num_rows: int | None = (
            count_records(rec, index) if predict or index is not None else None
        )
        self.num_classes = int(meta.num_classes or 0)
        # batches per epoch: known for one part when the records were counted
        self.num_batches: int | None = (
            -(-self.num_rows // self.batch_size)
            if self.num_rows is not None and self.num_parts == 1
            else None
        )
        shape = meta.feature_shape
        self.default_bucket_key = shape
        self.buckets = [shape]
        self.provide_data = [
            mx.io.DataDesc(options.data_name, (self.batch_size, *shape), np.float32, "NCHW")
        ]
        self.provide_label = [
            mx.io.DataDesc(options.label_name, (self.batch_size,), np.float32, "N")
        ]
        self.data_info = ArrayDataInfo(
            num_classes=meta.num_classes,
            pad_id=CLASSIFY_PAD_LABEL,
            task=TASK_CLASSIFY,
            feature_shape=shape,
            label_shape=(),
            integer_data=False,
            data_name=options.data_name,
            label_name=options.label_name,
        )
        self._reader: Any = None
        self._position = 0
        self._batches = 0
        self.reset()

    # -- order --------------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order (and augmentation) the next ``reset()`` produces."""
        self.epoch = int(epoch)

    def epoch_seed(self, epoch: int | None = None) -> int:
        """ImageRecordIter's seed for ``epoch``: a function of (seed, epoch) alone."""
        epoch = self.epoch if epoch is None else epoch
        mixed = np.random.default_rng([self.seed % 2**64, epoch % 2**64]).integers(0, 2**31 - 1)
        return int(mixed)

    def _build(self) -> Any:
        o = self.options
        seed = self.epoch_seed()
        kwargs: dict[str, Any] = dict(
            path_imgrec=self.source,
            data_shape=tuple(self.meta.feature_shape),
            batch_size=self.batch_size,
            label_width=1,
            shuffle=self.shuffle,
            seed=seed,
            shuffle_chunk_seed=seed,
            seed_aug=seed,
            rand_crop=o.rand_crop and self.role == "train",
            rand_mirror=o.rand_mirror and self.role == "train",
            resize=o.resize,
            mean_r=o.mean_r,
            mean_g=o.mean_g,
            mean_b=o.mean_b,
            std_r=o.std_r,
            std_g=o.std_g,
            std_b=o.std_b,
            scale=o.scale,
            num_parts=self.num_parts,
            part_index=self.part_index,
            preprocess_threads=o.preprocess_threads,
            round_batch=True,  # pads the last batch and reports pad
            data_name=o.data_name,
            label_name=o.label_name,
        )
        if self.index_file is not None:
            kwargs["path_imgidx"] = str(self.index_file)
        try:
            return mx.io.ImageRecordIter(**kwargs)
        except mx.base.MXNetError as exc:
            reason = mxnet_reason(exc)
            hint = "Write it with im2rec or mx.recordio (MXIndexedRecordIO + pack)."
            if "bigger than the batch size" in reason:
                hint = "ImageRecordIter needs more images than batch_size: lower batch_size."
            raise DataError(
                f"The RecordIO file {self.source} cannot be read by ImageRecordIter: {reason}",
                hint=hint,
            ) from None

    def reset(self) -> None:
        """Start the epoch set by ``set_epoch`` (the reader is rebuilt with its seed)."""
        if self._reader is not None and hasattr(self._reader, "handle"):
            del self._reader
        self._reader = self._build()
        self._position = 0
        self._batches = 0

    def next(self) -> Any:
        """The next batch."""
        try:
            batch = self._reader.next()
        except StopIteration:
            raise
        except mx.base.MXNetError as exc:
            raise DataError(
                f"{self.source}: ImageRecordIter failed after {self._batches} batches: "
                f"{mxnet_reason(exc)}"
            ) from None
        self._batches += 1
        data = batch.data[0]
        label = batch.label[0].asnumpy().astype(np.float32).reshape(-1)
        pad = int(batch.pad or 0)
        real = self.batch_size - pad
        bad = (label[:real] < 0) | (label[:real] >= self.num_classes) | (label[:real] % 1 != 0)
        if bad.any():
            value = float(label[:real][bad][0])
            raise DataError(
                f"{self.source}: batch {self._batches} holds the label {value:g}, which is not "
                f"a class id 0..{self.num_classes - 1}.",
                hint="Set num_classes to the true number of classes; labels are class ids.",
            )
        if pad:
            label[real:] = CLASSIFY_PAD_LABEL
        index = None
        if self.file_order:
            index = np.full(self.batch_size, -1, dtype=np.int64)
            index[:real] = np.arange(self._position, self._position + real)
        self._position += real
        out = mx.io.DataBatch(
            data=[data],
            label=[mx.nd.array(label, dtype=np.float32)],
            pad=pad,
            index=index,
            bucket_key=self.default_bucket_key,
            provide_data=self.provide_data,
            provide_label=self.provide_label,
        )
        out.num_tokens = None
        return out

    def describe(self) -> str:
        """One line for the log."""
        o = self.options
        rows = "? images" if self.num_rows is None else f"{self.num_rows} images"
        text = (
            f"{self.source}: {rows} as {self.default_bucket_key} (RecordIO via "
            f"ImageRecordIter, {o.preprocess_threads} thread(s)); classify, "
            f"{self.num_classes} classes; batches of {self.batch_size}, last one padded"
        )
        if self.num_parts > 1:
            text += f"; part {self.part_index} of {self.num_parts} (byte ranges)"
        augment = [name for name in ("rand_crop", "rand_mirror") if getattr(o, name)]
        if self.role == "train" and augment:
            text += "; " + "+".join(augment)
        text += "; shuffled by (seed, epoch)" if self.shuffle else "; file order"
        return text
