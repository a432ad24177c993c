"""ndarray and csv iterators: batches, padding, order, sharding, roles and every bad input."""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
import typing
from pathlib import Path

import numpy as np
import pytest

from mxtrain.data.array_options import CsvOptions, NDArrayOptions
from mxtrain.data.arrays import RowIter, RowMeta, build_csv_iter, build_ndarray_iter
from mxtrain.data.base import DataContext
from mxtrain.errors import DataError


def ctx(tmp: Path, role: str = "train", **kw) -> DataContext:
    return DataContext(role=role, seed=kw.pop("seed", 7), base_dir=tmp, **kw)


def save_blobs(tmp: Path, rows: int = 10, dims: int = 3, classes: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, dims)).astype(np.float32)
    y = np.arange(rows) % classes
    np.save(tmp / "x.npy", x)
    np.save(tmp / "y.npy", y)
    return x, y


def ndarray(tmp: Path, role: str = "train", context: DataContext | None = None, **options):
    options.setdefault("source", "x.npy")
    if options["source"].endswith(".npy") and role != "predict":
        options.setdefault("labels", "y.npy")
    return build_ndarray_iter(NDArrayOptions(**options), context or ctx(tmp, role))


def batches(it: RowIter, epoch: int = 0) -> list:
    it.set_epoch(epoch)
    it.reset()
    return list(it)


def real_rows(it: RowIter, epoch: int = 0) -> list[int]:
    return [int(i) for b in batches(it, epoch) for i in b.index if i >= 0]


# --- options ----------------------------------------------------------------------------------


def test_importing_options_does_not_import_mxnet() -> None:
    code = (
        "import sys\n"
        "import mxtrain.data.array_options, mxtrain.models.classifier_options\n"
        "from mxtrain.registry import ITERATORS, MODELS\n"
        "for n in ('ndarray', 'csv'): ITERATORS.get(n).options_class()\n"
        "for n in ('mlp', 'lenet', 'rnn_classifier'): MODELS.get(n).options_class()\n"
        "assert 'mxnet' not in sys.modules, 'mxnet was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("cls", [NDArrayOptions, CsvOptions])
def test_every_option_is_documented(cls) -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        assert f.metadata["doc"], f.name
        assert f.name in hints


@pytest.mark.parametrize(
    ("cls", "bad"),
    [
        (NDArrayOptions, {"source": ""}),
        (NDArrayOptions, {"source": "x.txt"}),
        (NDArrayOptions, {"batch_size": 0}),
        (NDArrayOptions, {"num_parts": 0}),
        (NDArrayOptions, {"part_index": 2, "num_parts": 2}),
        (NDArrayOptions, {"max_rows": 0}),
        (NDArrayOptions, {"num_classes": 1}),
        (NDArrayOptions, {"num_classes": 3, "task": "regress"}),
        (NDArrayOptions, {"task": "tag"}),
        (NDArrayOptions, {"labels": "y.csv"}),
        (NDArrayOptions, {"source": "d.npz", "labels": "y.npy"}),
        (NDArrayOptions, {"vocab_size": 1}),
        (NDArrayOptions, {"data_name": "x", "label_name": "x"}),
        (CsvOptions, {"source": "d.csv", "delimiter": ";;"}),
        (CsvOptions, {"source": "d.csv", "feature_columns": []}),
        (CsvOptions, {"source": "d.csv", "feature_columns": ["a", "a"]}),
        (CsvOptions, {"source": "d.csv", "feature_columns": ["a", "label"]}),
    ],
)
def test_options_reject_impossible_values(cls, bad) -> None:
    with pytest.raises(ValueError) as info:
        cls(**{"source": "x.npy", **bad})
    named = [k for k in bad if k != "source"] or ["source"]
    assert any(str(info.value).startswith(k) for k in named), str(info.value)


# --- batches ----------------------------------------------------------------------------------


def test_batches_shapes_padding_and_index(tmp_path: Path) -> None:
    x, y = save_blobs(tmp_path, rows=10)
    it = ndarray(tmp_path, "eval", batch_size=4)
    assert it.default_bucket_key == (3,)
    assert it.buckets == [(3,)]
    assert it.provide_data[0].shape == (4, 3) and it.provide_label[0].shape == (4,)
    assert it.data_info.task == "classify" and it.data_info.num_classes == 3
    assert it.data_info.pad_id == -1 and it.num_batches == len(it) == 3
    got = batches(it)
    assert [b.pad for b in got] == [0, 0, 2]
    assert [b.bucket_key for b in got] == [(3,)] * 3
    last = got[-1]
    assert last.index.tolist() == [8, 9, -1, -1]
    assert last.label[0].asnumpy().tolist() == [y[8], y[9], -1, -1]
    np.testing.assert_array_equal(last.data[0].asnumpy()[:2], x[8:10])
    assert np.isfinite(last.data[0].asnumpy()).all()  # padding rows repeat real rows
    assert last.num_tokens is None  # float features: no tokens
    assert real_rows(it) == list(range(10))  # eval: file order, every row once
    assert "10 rows of shape (3,)" in it.describe() and "3 classes" in it.describe()


def test_npz_with_custom_keys_and_max_rows(tmp_path: Path) -> None:
    x = np.arange(24, dtype=np.float32).reshape(6, 2, 2)
    np.savez(tmp_path / "d.npz", feats=x, target=np.array([0, 1, 2, 0, 1, 2]))
    it = ndarray(
        tmp_path, source="d.npz", data_key="feats", label_key="target", batch_size=4, max_rows=5
    )
    assert it.num_rows == 5 and it.default_bucket_key == (2, 2)
    assert it.provide_data[0].layout == "NHW"
    got = batches(it)
    assert sum(b.data[0].shape[0] - b.pad for b in got) == 5


def test_regression_targets_pad_with_nan(tmp_path: Path) -> None:
    save_blobs(tmp_path, rows=5)
    np.save(tmp_path / "t.npy", np.arange(10, dtype=np.float64).reshape(5, 2))
    it = ndarray(tmp_path, "eval", labels="t.npy", task="regress", batch_size=4)
    assert it.data_info.task == "regress" and it.data_info.pad_id is None
    assert it.data_info.label_shape == (2,) and it.data_info.num_classes is None
    assert it.provide_label[0].shape == (4, 2)
    last = batches(it)[-1]
    labels = last.label[0].asnumpy()
    assert labels[0].tolist() == [8.0, 9.0] and np.isnan(labels[1:]).all()


def test_integer_rows_are_token_ids(tmp_path: Path) -> None:
    ids = np.array([[3, 4, 0], [5, 0, 0], [1, 2, 6]], dtype=np.int32)
    np.savez(tmp_path / "t.npz", data=ids, label=np.array([0, 1, 1]))
    it = ndarray(tmp_path, source="t.npz", batch_size=2, shuffle=False)
    assert it.data_info.vocab_size == 7 and it.data_info.integer_data
    assert it.provide_data[0].layout == "NT"
    assert [b.num_tokens for b in batches(it)] == [3, 3]  # padding rows not counted
    with_option = ndarray(tmp_path, source="t.npz", batch_size=2, vocab_size=50)
    assert with_option.data_info.vocab_size == 50


# --- order and sharding ------------------------------------------------------------------------


def test_order_depends_on_seed_and_epoch_only(tmp_path: Path) -> None:
    save_blobs(tmp_path, rows=40)
    first = ndarray(tmp_path, batch_size=8)
    again = ndarray(tmp_path, batch_size=8)
    assert real_rows(first, 3) == real_rows(again, 3)
    assert real_rows(first, 0) != real_rows(first, 1)
    assert sorted(real_rows(first, 1)) == list(range(40))
    other_seed = ndarray(tmp_path, context=ctx(tmp_path, seed=8), batch_size=8)
    assert real_rows(other_seed, 0) != real_rows(first, 0)
    # the same batches again after reset() within an epoch; labels follow their rows
    one = batches(first, 2)
    two = batches(first, 2)
    assert [b.index.tolist() for b in one] == [b.index.tolist() for b in two]
    _, y = save_blobs(tmp_path, rows=40)
    for b in one:
        real = b.index >= 0
        assert b.label[0].asnumpy()[real].tolist() == y[b.index[real]].tolist()
    fixed = ndarray(tmp_path, batch_size=8, shuffle=False)
    assert real_rows(fixed, 0) == real_rows(fixed, 5) == list(range(40))
    evaluated = ndarray(tmp_path, "eval", batch_size=8, shuffle=True)
    assert real_rows(evaluated, 4) == list(range(40))  # eval never shuffles


@pytest.mark.parametrize(
    ("rows", "parts", "batch"), [(10, 3, 2), (33, 4, 8), (17, 2, 4), (9, 9, 1)]
)
@pytest.mark.parametrize("shuffle", [False, True])
def test_shards_have_equal_batches_and_cover_every_row_once(
    tmp_path: Path, rows: int, parts: int, batch: int, shuffle: bool, caplog
) -> None:
    caplog.set_level(logging.INFO, logger="mxtrain.data.arrays")
    save_blobs(tmp_path, rows=rows)
    its = [
        ndarray(tmp_path, batch_size=batch, num_parts=parts, part_index=k, shuffle=shuffle)
        for k in range(parts)
    ]
    assert len({it.num_batches for it in its}) == 1
    epoch_rows = [real_rows(it, 2) for it in its]
    assert sorted(r for rows_of_part in epoch_rows for r in rows_of_part) == list(range(rows))
    whole = ndarray(tmp_path, batch_size=batch, shuffle=shuffle)
    full = [int(i) for i in whole.epoch_rows(2) if i >= 0]
    for k, mine in enumerate(epoch_rows):
        assert mine == full[k::parts]  # strided over the (shuffled) order
    if parts > 1:
        assert "padded, not trimmed" in caplog.text


def test_more_parts_than_rows_is_an_error(tmp_path: Path) -> None:
    save_blobs(tmp_path, rows=3)
    with pytest.raises(DataError, match="fewer than num_parts"):
        ndarray(tmp_path, num_parts=4, part_index=0)


# --- roles: eval reuses train, predict without labels -------------------------------------------


def test_eval_reuses_training_classes_and_checks_shapes(tmp_path: Path) -> None:
    save_blobs(tmp_path, rows=12, classes=4)
    train = ndarray(tmp_path)
    np.save(tmp_path / "vx.npy", np.zeros((3, 3), dtype=np.float32))
    np.save(tmp_path / "vy.npy", np.array([0, 1, 1]))
    evaluated = ndarray(
        tmp_path, source="vx.npy", labels="vy.npy", context=ctx(tmp_path, "eval", train=train)
    )
    assert evaluated.data_info.num_classes == 4  # not 2, although only 0 and 1 occur
    np.save(tmp_path / "vy.npy", np.array([0, 1, 4]))
    with pytest.raises(DataError, match=r"vy.npy row 2: label 4 is not among the classes"):
        ndarray(
            tmp_path, source="vx.npy", labels="vy.npy", context=ctx(tmp_path, "eval", train=train)
        )
    np.save(tmp_path / "vx.npy", np.zeros((3, 5), dtype=np.float32))
    np.save(tmp_path / "vy.npy", np.array([0, 1, 1]))
    with pytest.raises(DataError, match=r"rows of shape \(5,\).*trained on rows of shape \(3,\)"):
        ndarray(
            tmp_path, source="vx.npy", labels="vy.npy", context=ctx(tmp_path, "eval", train=train)
        )
    with pytest.raises(DataError, match="task: regress"):
        ndarray(tmp_path, task="regress", context=ctx(tmp_path, "eval", train=train))


def test_meta_round_trip_and_predict_without_labels(tmp_path: Path) -> None:
    x, _ = save_blobs(tmp_path, rows=9)
    train = ndarray(tmp_path, num_parts=2, part_index=1, max_rows=5)
    train.vocab.save(tmp_path / "vocab.json")
    assert RowMeta.load(tmp_path / "vocab.json") == train.meta
    np.save(tmp_path / "new.npy", x[::-1])
    predict = build_ndarray_iter(
        NDArrayOptions(source="new.npy", labels="y.npy", num_parts=2, part_index=1, max_rows=5),
        ctx(tmp_path, "predict", vocab_file=tmp_path / "vocab.json"),
    )
    assert predict.num_rows == 9 and predict.num_parts == 1  # every row, one part
    assert predict.data_info.num_classes == 3
    got = batches(predict)
    assert real_rows(predict) == list(range(9))  # input order
    np.testing.assert_array_equal(got[0].data[0].asnumpy()[:9], x[::-1])
    np.savez(tmp_path / "feats.npz", data=x)  # no label array
    build_ndarray_iter(
        NDArrayOptions(source="feats.npz"),
        ctx(tmp_path, "predict", vocab_file=tmp_path / "vocab.json"),
    )
    (tmp_path / "lm.json").write_text(json.dumps({"tokens": ["<pad>"]}))
    with pytest.raises(DataError, match="not written by the ndarray/csv iterators"):
        ndarray(tmp_path, "eval", context=ctx(tmp_path, "eval", vocab_file=tmp_path / "lm.json"))
    with pytest.raises(DataError, match=r"number of classes .* is unknown"):
        build_ndarray_iter(NDArrayOptions(source="new.npy"), ctx(tmp_path, "predict"))


# --- bad inputs -------------------------------------------------------------------------------


def _raises(match: str, tmp: Path, **options) -> None:
    with pytest.raises(DataError, match=match):
        ndarray(tmp, **options)


def test_bad_ndarray_files(tmp_path: Path) -> None:
    x, y = save_blobs(tmp_path, rows=6)
    _raises(r"data file .*missing.npy does not exist", tmp_path, source="missing.npy")
    _raises(r"labels file .*nolabels.npy does not exist", tmp_path, labels="nolabels.npy")
    with pytest.raises(DataError, match="no labels file was given"):
        build_ndarray_iter(NDArrayOptions(source="x.npy"), ctx(tmp_path))

    np.save(tmp_path / "flat.npy", np.arange(6.0))
    _raises(r"flat.npy has shape \(6,\); it must be \(rows, features", tmp_path, source="flat.npy")
    np.save(tmp_path / "empty.npy", np.zeros((0, 3)))
    _raises(r"empty.npy has no rows", tmp_path, source="empty.npy", labels="empty.npy")
    np.save(tmp_path / "short.npy", y[:4])
    _raises(
        r"short.npy hold 4 labels, but the data .*x.npy has 6 rows", tmp_path, labels="short.npy"
    )

    np.save(tmp_path / "frac.npy", np.array([0, 1, 2.5, 0, 1, 2]))
    _raises(r"frac.npy row 2: label 2.5 is not an integer", tmp_path, labels="frac.npy")
    np.save(tmp_path / "neg.npy", np.array([0, 1, -2, 0, 1, 2]))
    _raises(r"neg.npy row 2: label -2 is negative", tmp_path, labels="neg.npy")
    np.save(tmp_path / "zeros.npy", np.zeros(6, dtype=int))
    _raises(r"all 0: a classifier needs at least two classes", tmp_path, labels="zeros.npy")
    _raises(r"y.npy row 2: label 2 is not among num_classes", tmp_path, num_classes=2)
    np.save(tmp_path / "wide.npy", np.zeros((6, 2), dtype=int))
    _raises(r"one class id per row", tmp_path, labels="wide.npy")

    bad = x.copy()
    bad[4, 1] = np.nan
    np.save(tmp_path / "nan.npy", bad)
    _raises(r"nan.npy row 4: feature 1 is nan", tmp_path, source="nan.npy")
    targets = np.arange(6.0)
    targets[3] = np.inf
    np.save(tmp_path / "inf.npy", targets)
    _raises(
        r"inf.npy row 3: target inf is not a finite", tmp_path, labels="inf.npy", task="regress"
    )

    np.save(tmp_path / "obj.npy", np.array([{"a": 1}] * 6, dtype=object), allow_pickle=True)
    _raises(r"obj.npy .*unpickle", tmp_path, source="obj.npy")
    (tmp_path / "junk.npy").write_bytes(b"\x00\x01 definitely not numpy" * 10)
    _raises(r"junk.npy is not a NumPy file", tmp_path, source="junk.npy")
    np.save(tmp_path / "cut.npy", x)
    (tmp_path / "cut.npy").write_bytes((tmp_path / "cut.npy").read_bytes()[:-20])
    _raises(r"cut.npy cannot be read as a NumPy file .*truncated", tmp_path, source="cut.npy")
    np.save(tmp_path / "text.npy", np.array([["a", "b"]] * 6))
    _raises(r"text.npy holds <U1 values; mxtrain needs numbers", tmp_path, source="text.npy")
    with open(tmp_path / "zip.npy", "wb") as handle:
        np.savez(handle, data=x)
    _raises(r"zip.npy is an .npz archive", tmp_path, source="zip.npy")
    np.save(tmp_path / "negid.npy", np.array([[1, 2], [3, -1], [1, 1], [1, 1], [1, 1], [2, 2]]))
    _raises(r"negid.npy row 1: token id -1 is negative", tmp_path, source="negid.npy")
    np.save(tmp_path / "ids.npy", np.array([[1, 2], [3, 9], [1, 1], [1, 1], [1, 1], [2, 2]]))
    _raises(
        r"ids.npy row 1: token id 9 is outside vocab_size", tmp_path, source="ids.npy", vocab_size=5
    )

    np.savez(tmp_path / "d.npz", features=x, label=y)
    _raises(
        r"d.npz has no array 'data' \(data_key\); it has 'features', 'label'",
        tmp_path,
        source="d.npz",
    )
    _raises(
        r"d.npz has no array 'y' \(label_key\)",
        tmp_path,
        source="d.npz",
        data_key="features",
        label_key="y",
    )


def test_damaged_npz_archives_are_data_errors(tmp_path: Path) -> None:
    x, y = save_blobs(tmp_path, rows=6)
    np.savez(tmp_path / "d.npz", data=x, label=y)
    whole = (tmp_path / "d.npz").read_bytes()
    for cut in (4, len(whole) // 2, len(whole) - 10):  # no zip directory: BadZipFile
        (tmp_path / "cut.npz").write_bytes(whole[:cut])
        _raises(r"cut.npz cannot be read as a NumPy file .*truncated", tmp_path, source="cut.npz")
    np.savez_compressed(tmp_path / "z.npz", data=np.arange(600.0).reshape(6, 100), label=y)
    damaged = bytearray((tmp_path / "z.npz").read_bytes())
    damaged[100:110] = bytes(10)  # inside the compressed 'data' member: CRC or inflate error
    (tmp_path / "bad.npz").write_bytes(bytes(damaged))
    _raises(r"bad.npz cannot be read as a NumPy file", tmp_path, source="bad.npz")
    np.savez(tmp_path / "obj.npz", data=np.array([{"a": 1}] * 6, dtype=object), label=y)
    _raises(r"obj.npz .*unpickle", tmp_path, source="obj.npz")


# --- csv --------------------------------------------------------------------------------------


def write(tmp: Path, name: str, text: str) -> str:
    (tmp / name).write_text(text, encoding="utf-8")
    return name


def csv_iter(tmp: Path, source: str, role: str = "train", **options) -> RowIter:
    return build_csv_iter(CsvOptions(source=source, **options), ctx(tmp, role))


def test_csv_columns_delimiter_and_blank_lines(tmp_path: Path) -> None:
    src = write(tmp_path, "d.csv", "b;label;a\n1;0;2\n\n3;1;4\n5;2;6\n")
    it = csv_iter(tmp_path, src, delimiter=";", batch_size=2, shuffle=False)
    assert it.meta.feature_columns == ("b", "a")
    got = batches(it)
    assert got[0].data[0].asnumpy().tolist() == [[1, 2], [3, 4]]
    assert got[1].label[0].asnumpy().tolist() == [2, -1]
    chosen = csv_iter(tmp_path, src, delimiter=";", feature_columns=["a"], batch_size=3)
    assert chosen.default_bucket_key == (1,)
    assert sorted(batches(chosen)[0].data[0].asnumpy()[:, 0].tolist()) == [2, 4, 6]
    # predict: no label column, columns found by name (another order), input order kept
    chosen.vocab.save(tmp_path / "vocab.json")
    pred = write(tmp_path, "p.csv", "a;b\n9;0\n8;0\n")
    predicted = build_csv_iter(
        CsvOptions(source=pred, delimiter=";", feature_columns=["a"]),
        ctx(tmp_path, "predict", vocab_file=tmp_path / "vocab.json"),
    )
    assert batches(predicted)[0].data[0].asnumpy()[:2, 0].tolist() == [9, 8]
    assert predicted.data_info.num_classes == 3


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", r"bad.csv is empty; it needs a header"),
        ("a,label\n", r"bad.csv has a header but no rows"),
        ("a,b\n1,2\n", r"bad.csv:1: the header has no label column 'label'"),
        ("a,a,label\n1,2,0\n", r"bad.csv:1: the header names the column 'a' twice"),
        ("a,,label\n1,2,0\n", r"bad.csv:1: column 2 of the header has no name"),
        ("a,label\n1,0\n2\n", r"bad.csv:3: 1 fields, but the header has 2"),
        ("a,label\n1,0\n2,1,3\n", r"bad.csv:3: 3 fields, but the header has 2"),
        ("a,label\n1,0\nabc,1\n", r"bad.csv:3: column 'a' is 'abc', not a number"),
        ("a,label\n1,0\n,1\n", r"bad.csv:3: column 'a' is empty"),
        ("a,label\n1,0\n2,1\nnan,1\n", r"bad.csv:4: column 'a' is nan"),
        ("a,label\n1,0\n2,1.5\n", r"bad.csv:3: label column 'label': label 1.5 is not an integer"),
        ("a,label\n1,0\n2,x\n", r"bad.csv:3: column 'label' is 'x', not a number"),
        ('a,label\n1,0\n"2,1\n', r"bad.csv:\d+: malformed CSV"),
    ],
)
def test_bad_csv_rows_name_file_and_line(tmp_path: Path, text: str, match: str) -> None:
    write(tmp_path, "bad.csv", text)
    with pytest.raises(DataError, match=match):
        csv_iter(tmp_path, "bad.csv")


def test_csv_missing_feature_column_and_file(tmp_path: Path) -> None:
    write(tmp_path, "d.csv", "a,label\n1,0\n2,1\n")
    with pytest.raises(DataError, match=r"d.csv:1: the header has no column 'z'"):
        csv_iter(tmp_path, "d.csv", feature_columns=["z"])
    with pytest.raises(DataError, match=r"CSV file .*nope.csv does not exist"):
        csv_iter(tmp_path, "nope.csv")
    (tmp_path / "latin.csv").write_bytes(b"a,label\n1,0\n\xe9,1\n")
    with pytest.raises(DataError, match="not UTF-8"):
        csv_iter(tmp_path, "latin.csv")
