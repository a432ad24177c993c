"""image_record iterator: a tiny PNG RecordIO file (written without OpenCV/PIL) read back."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import numpy as np
import pytest
from image_rec_helpers import bright_dark_images, write_image_rec

from mxtrain.data.arrays import RowMeta
from mxtrain.data.base import DataContext
from mxtrain.data.image_record import ImageRecordIter, build_image_record_iter
from mxtrain.data.sparse_image_options import ImageRecordOptions
from mxtrain.errors import DataError


def ctx(tmp: Path, role: str = "train", **kw) -> DataContext:
    return DataContext(role=role, seed=kw.pop("seed", 5), base_dir=tmp, **kw)


@pytest.fixture
def rec(tmp_path: Path) -> Path:
    images, labels = bright_dark_images(10, size=8)
    return write_image_rec(tmp_path, "toy", images, labels)[0]


def image_iter(tmp: Path, role: str = "train", **options) -> ImageRecordIter:
    options.setdefault("source", "toy.rec")
    options.setdefault("data_shape", [3, 8, 8])
    options.setdefault("num_classes", 2)
    options.setdefault("batch_size", 4)
    context = options.pop("context", None) or ctx(tmp, role)
    return build_image_record_iter(ImageRecordOptions(**options), context)


def epoch(it: ImageRecordIter, e: int = 0) -> list:
    it.set_epoch(e)
    it.reset()
    return list(it)


def test_options_documented_and_checked() -> None:
    hints = typing.get_type_hints(ImageRecordOptions)
    for f in dataclasses.fields(ImageRecordOptions):
        assert f.metadata["doc"], f.name
        assert f.name in hints
    for bad in (
        {"data_shape": [8, 8]},
        {"data_shape": [2, 8, 8]},
        {"num_classes": 1},
        {"batch_size": 0},
        {"part_index": 1},
        {"std_r": 0},
        {"resize": 0},
    ):
        with pytest.raises(ValueError) as info:
            ImageRecordOptions(**{"source": "a.rec", "data_shape": [3, 8, 8], **bad})
        assert str(info.value).startswith(next(iter(bad))), str(info.value)


def test_batches_shapes_labels_and_padding(tmp_path: Path, rec: Path) -> None:
    it = image_iter(tmp_path, "eval")
    assert it.default_bucket_key == (3, 8, 8) and it.buckets == [(3, 8, 8)]
    assert it.provide_data[0].shape == (4, 3, 8, 8) and it.provide_label[0].shape == (4,)
    assert it.data_info.task == "classify" and it.data_info.num_classes == 2
    assert it.num_rows == 10 and it.num_batches == 3
    for _ in range(2):  # the same every epoch (the reader is rebuilt: no carried overflow)
        got = epoch(it)
        assert [b.pad for b in got] == [0, 0, 2]
        labels = np.concatenate([b.label[0].asnumpy() for b in got])
        np.testing.assert_array_equal(labels, [0, 1] * 5 + [-1, -1])
        assert list(got[2].index) == [8, 9, -1, -1]
        data = np.concatenate([b.data[0].asnumpy() for b in got])[:10]
        brightness = data.mean(axis=(1, 2, 3))
        assert (brightness[labels[:10] == 1] > 150).all()
        assert (brightness[labels[:10] == 0] < 100).all()
    assert "10 images as (3, 8, 8)" in it.describe()


def test_shuffle_is_seeded_by_epoch(tmp_path: Path, rec: Path) -> None:
    it = image_iter(tmp_path, rand_mirror=True, scale=1 / 255)

    def labels(e):
        return np.concatenate([b.label[0].asnumpy() for b in epoch(it, e)]).tolist()

    assert labels(0) == labels(0)
    assert sorted(v for v in labels(1) if v >= 0) == [0] * 5 + [1] * 5
    assert epoch(it)[0].index is None  # shuffled: record numbers unknown
    assert epoch(it)[0].data[0].asnumpy().max() <= 1.0


def test_eval_reuses_classes_and_predict_reads_in_order(tmp_path: Path, rec: Path) -> None:
    train = image_iter(tmp_path)
    train.vocab.save(tmp_path / "vocab.json")
    assert RowMeta.load(tmp_path / "vocab.json").feature_shape == (3, 8, 8)
    ev = build_image_record_iter(
        ImageRecordOptions(source="toy.rec", data_shape=[3, 8, 8], batch_size=4),
        ctx(tmp_path, "eval", train=train),
    )
    assert ev.data_info.num_classes == 2
    pred = build_image_record_iter(
        ImageRecordOptions(source="toy.rec", data_shape=[3, 8, 8], batch_size=3, shuffle=True),
        ctx(tmp_path, "predict", vocab_file=tmp_path / "vocab.json"),
    )
    index = [int(i) for b in epoch(pred) for i in b.index if i >= 0]
    assert index == list(range(10)) and pred.num_rows == 10
    with pytest.raises(DataError, match="model was trained on rows of shape"):
        build_image_record_iter(
            ImageRecordOptions(source="toy.rec", data_shape=[1, 8, 8]),
            ctx(tmp_path, "eval", train=train),
        )


def test_parts_split_the_file(tmp_path: Path, rec: Path) -> None:
    seen = []
    for k in range(2):
        it = image_iter(tmp_path, "eval", num_parts=2, part_index=k, batch_size=2)
        seen += [b.label[0].asnumpy()[: 2 - b.pad].tolist() for b in epoch(it)]
    assert sum(len(s) for s in seen) == 10


def test_bad_inputs(tmp_path: Path, rec: Path) -> None:
    with pytest.raises(DataError, match=r"RecordIO file .*missing.rec does not exist"):
        image_iter(tmp_path, source="missing.rec")
    with pytest.raises(DataError, match=r"more images than batch_size"):
        image_iter(tmp_path, batch_size=32)
    with pytest.raises(DataError, match=r"needs num_classes"):
        image_iter(tmp_path, num_classes=None)
    images, _ = bright_dark_images(4, size=8)
    write_image_rec(tmp_path, "big", images, [0, 1, 5, 1])
    with pytest.raises(DataError, match=r"big.rec: batch 1 holds the label 5"):
        epoch(image_iter(tmp_path, "eval", source="big.rec"))
    (tmp_path / "junk.rec").write_bytes(b"not a recordio file at all")
    with pytest.raises(DataError, match=r"junk\.rec"):
        epoch(image_iter(tmp_path, "eval", source="junk.rec", path_imgidx=None))
