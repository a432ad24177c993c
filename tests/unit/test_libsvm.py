"""libsvm iterator: parsing, densified batches, order, sharding, roles and bad inputs."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing
from pathlib import Path

import numpy as np
import pytest

from mxtrain.data.arrays import RowMeta
from mxtrain.data.base import DataContext
from mxtrain.data.libsvm import LibsvmIter, build_libsvm_iter, read_libsvm
from mxtrain.data.sparse_image_options import LibsvmOptions
from mxtrain.errors import DataError

TEXT = """\
# a comment line
1 1:0.5 3:2
0 2:1.5   # trailing comment
2 4:-1 1:3

1 qid:7 2:2
0
"""
DENSE = np.array(
    [[0.5, 0, 2, 0], [0, 1.5, 0, 0], [3, 0, 0, -1], [0, 2, 0, 0], [0, 0, 0, 0]], np.float32
)
LABELS = [1, 0, 2, 1, 0]


def ctx(tmp: Path, role: str = "train", **kw) -> DataContext:
    return DataContext(role=role, seed=kw.pop("seed", 7), base_dir=tmp, **kw)


def libsvm(tmp: Path, role: str = "train", text: str = TEXT, **options) -> LibsvmIter:
    (tmp / "d.svm").write_text(text)
    options.setdefault("source", "d.svm")
    context = options.pop("context", None) or ctx(tmp, role)
    return build_libsvm_iter(LibsvmOptions(**options), context)


def batches(it: LibsvmIter, epoch: int = 0) -> list:
    it.set_epoch(epoch)
    it.reset()
    return list(it)


def test_options_are_documented_and_import_no_mxnet() -> None:
    hints = typing.get_type_hints(LibsvmOptions)
    for f in dataclasses.fields(LibsvmOptions):
        assert f.metadata["doc"], f.name
        assert f.name in hints
    code = (
        "import sys\n"
        "from mxtrain.registry import ITERATORS\n"
        "ITERATORS.get('libsvm').options_class()\n"
        "assert 'mxnet' not in sys.modules, 'mxnet was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    "bad",
    [{"num_features": 0}, {"zero_based": "yes"}, {"batch_size": 0}, {"task": "tag"}],
)
def test_options_reject_impossible_values(bad) -> None:
    with pytest.raises(ValueError) as info:
        LibsvmOptions(source="d.svm", **bad)
    assert str(info.value).startswith(next(iter(bad))), str(info.value)


def test_dense_batches_padding_index_and_describe(tmp_path: Path) -> None:
    it = libsvm(tmp_path, batch_size=2, shuffle=False)
    assert it.default_bucket_key == (4,) and it.buckets == [(4,)]
    assert it.provide_data[0].shape == (2, 4)
    assert it.data_info.num_classes == 3 and it.data_info.feature_shape == (4,)
    got = batches(it)
    assert len(got) == 3 and [b.pad for b in got] == [0, 0, 1]
    data = np.concatenate([b.data[0].asnumpy() for b in got])
    labels = np.concatenate([b.label[0].asnumpy() for b in got])
    np.testing.assert_array_equal(data[:5], DENSE)
    np.testing.assert_array_equal(labels, [*LABELS, -1])
    assert list(got[2].index) == [4, -1]
    text = it.describe()
    assert "5 LibSVM rows, 4 features (6 non-zeros" in text and "3 classes" in text


def test_zero_based_and_num_features_option(tmp_path: Path) -> None:
    it = libsvm(tmp_path, zero_based=True, num_features=8, shuffle=False, batch_size=5)
    assert it.default_bucket_key == (8,)
    first = batches(it)[0].data[0].asnumpy()
    assert first[0, 1] == 0.5 and first[0, 3] == 2 and first[2, 4] == -1


def test_shuffled_order_depends_on_seed_and_epoch(tmp_path: Path) -> None:
    text = "".join(f"{i % 2} {i % 7 + 1}:{i}\n" for i in range(40))
    a = libsvm(tmp_path, text=text, batch_size=8)

    def order(it, e):
        return [int(i) for b in batches(it, e) for i in b.index if i >= 0]

    assert order(a, 0) == order(a, 0) and order(a, 0) != order(a, 1)
    assert sorted(order(a, 1)) == list(range(40))
    # the data of each row follows it: value of its feature is its row number
    for b in batches(a, 1):
        d = b.data[0].asnumpy()
        for r, i in enumerate(b.index):
            assert d[r].sum() == i


def test_shards_have_equal_batches_and_cover_rows(tmp_path: Path) -> None:
    text = "".join(f"{i % 2} 1:{i}\n" for i in range(11))
    parts = [libsvm(tmp_path, text=text, batch_size=2, num_parts=3, part_index=k) for k in range(3)]
    lengths = [len(batches(p)) for p in parts]
    assert len(set(lengths)) == 1
    rows = sorted(int(i) for p in parts for b in batches(p) for i in b.index if i >= 0)
    assert rows == list(range(11))


def test_regression_targets(tmp_path: Path) -> None:
    it = libsvm(tmp_path, text="0.5 1:1\n-2.25 2:1\n", task="regress", batch_size=3)
    b = batches(it)[0]
    assert it.data_info.task == "regress"
    label = b.label[0].asnumpy()
    assert sorted(label[:2].tolist()) == [-2.25, 0.5] and np.isnan(label[2])


def test_eval_and_predict_reuse_num_features(tmp_path: Path) -> None:
    train = libsvm(tmp_path)
    train.vocab.save(tmp_path / "vocab.json")
    assert RowMeta.load(tmp_path / "vocab.json").feature_shape == (4,)
    (tmp_path / "e.svm").write_text("1 1:1\n")  # uses fewer features than training
    ev = build_libsvm_iter(LibsvmOptions(source="e.svm"), ctx(tmp_path, "eval", train=train))
    assert ev.default_bucket_key == (4,) and ev.data_info.num_classes == 3
    (tmp_path / "p.svm").write_text("2:1 4:1\n1 3:1\n")  # no label, then a label (ignored)
    pred = build_libsvm_iter(
        LibsvmOptions(source="p.svm", batch_size=4),
        ctx(tmp_path, "predict", vocab_file=tmp_path / "vocab.json"),
    )
    assert pred.num_rows == 2 and pred.has_labels is False
    d = batches(pred)[0].data[0].asnumpy()
    np.testing.assert_array_equal(d[:2], [[0, 1, 0, 1], [0, 0, 1, 0]])
    (tmp_path / "wide.svm").write_text("1 5:1\n")
    with pytest.raises(DataError, match=r"wide.svm:1: feature index 5 is beyond num_features"):
        build_libsvm_iter(LibsvmOptions(source="wide.svm"), ctx(tmp_path, "eval", train=train))
    with pytest.raises(DataError, match="trained with 4 features"):
        build_libsvm_iter(
            LibsvmOptions(source="e.svm", num_features=9), ctx(tmp_path, "eval", train=train)
        )


@pytest.mark.parametrize(
    ("text", "options", "match"),
    [
        ("1 1:1\n0 3:abc\n", {}, r"d.svm:2: in '3:abc', the value is not a number"),
        ("1 1:1\n0 x:1\n", {}, r"d.svm:2: in 'x:1', the index is not an integer"),
        ("1 1:1\n0 0:1\n", {}, r"d.svm:2: .* index 0 is below 1"),
        ("1 1:1 1:2\n", {}, r"d.svm:1: the index 1 occurs twice"),
        ("1 1:1\n0 7:1\n", {"num_features": 4}, r"d.svm:2: feature index 7 is beyond"),
        ("1 1:1\n0 5\n", {}, r"d.svm:2: '5' is not an 'index:value' pair"),
        ("1 1:1\nx 1:1\n", {}, r"d.svm:2: the label 'x' is not a number"),
        ("1 1:1\n1:1 2:2\n", {}, r"d.svm:2: the line starts with '1:1', not a label"),
        ("1 1:1\n0.5 1:2\n", {}, r"d.svm:2"),  # a class label must be an integer
        ("1 1:nan\n", {}, r"d.svm:1: .* not finite"),
        ("# nothing\n\n", {}, r"has no rows"),
    ],
)
def test_bad_files_name_file_and_line(tmp_path: Path, text: str, options, match: str) -> None:
    with pytest.raises(DataError, match=match):
        libsvm(tmp_path, text=text, **options)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"LibSVM file .*nope.svm does not exist"):
        build_libsvm_iter(LibsvmOptions(source="nope.svm"), ctx(tmp_path))


def test_read_libsvm_keeps_rows_sparse(tmp_path: Path) -> None:
    (tmp_path / "d.svm").write_text(TEXT)
    rows = read_libsvm(tmp_path / "d.svm", zero_based=False, need_label=True)
    assert rows.rows == 5 and rows.indices.size == 6 and rows.lines == [2, 3, 4, 6, 7]
    np.testing.assert_array_equal(rows.dense(np.array([4, 0]), 4), DENSE[[4, 0]])


def _stray_file(rows: int = 200, stray_line: int | None = 120, stray: int = 3_000_000) -> str:
    lines = [f"{i % 2} {1 + i % 40}:1 {41 + i % 60}:0.5" for i in range(rows)]
    if stray_line is not None:
        lines[stray_line - 1] += f" {stray}:1"
    return "\n".join(lines) + "\n"


def test_huge_index_is_a_data_error_naming_the_line(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"d.svm:2: in '1000000000000:1', the index 10+ is beyond"):
        libsvm(tmp_path, text="1 1:1\n0 1000000000000:1\n")
    with pytest.raises(DataError, match=r"d.svm:1: .* is beyond the largest supported"):
        libsvm(tmp_path, text=f"1 {10**30}:1\n0 2:1\n", num_features=4)


def test_inferred_width_from_a_stray_index_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DataError) as caught:
        libsvm(tmp_path, text=_stray_file())
    message = str(caught.value)
    assert "d.svm:120:" in message and "3,000,000" in message and "next largest (100)" in message
    assert "Fix the index on line 120" in message and "num_features: 3000000" in message
    # Setting the dimension explicitly is the documented way to accept it.
    it = libsvm(tmp_path, text=_stray_file(rows=20, stray_line=5), num_features=3_000_000)
    assert it.num_features == 3_000_000
    # Two stray indices defeat the gap test but not the used-columns test.
    text = _stray_file(stray_line=7, stray=2_500_000).replace("\n", " 3000000:1\n", 1)
    with pytest.raises(DataError, match=r"d.svm:1: the file uses only 102 distinct features"):
        libsvm(tmp_path, text=text)
    # Ordinary sparse files (a wide but well-used index range) still infer their width.
    assert libsvm(tmp_path, text=_stray_file(stray_line=None)).num_features == 100


def test_dense_batches_that_cannot_fit_are_refused(tmp_path: Path, monkeypatch) -> None:
    import mxtrain.data.libsvm as module

    monkeypatch.setattr(module, "available_memory", lambda: 2**30)
    with pytest.raises(DataError) as caught:
        libsvm(tmp_path, num_features=2_000_000, batch_size=64)
    message = str(caught.value)
    assert "64 x 2,000,000 float32 features: 0.48 GiB per batch" in message
    assert "1.00 GiB of memory is available" in message and "Lower batch_size" in message
    assert libsvm(tmp_path, num_features=2_000, batch_size=64).num_features == 2_000
