"""mlp, lenet, rnn_classifier: options, training in our BucketingModule, padding handling."""

from __future__ import annotations

import dataclasses
import typing

import mxnet as mx
import numpy as np
import pytest

from mxtrain.data.array_options import ArrayDataInfo
from mxtrain.data.arrays import RowIter, RowMeta
from mxtrain.data.base import DataInfo
from mxtrain.engine.bucketing import BucketingModule
from mxtrain.metrics import DeviceAccuracy, DeviceMSE
from mxtrain.models.classifier_options import LenetOptions, MlpOptions, RnnClassifierOptions
from mxtrain.models.classifiers import build_lenet, build_mlp, build_rnn_classifier


def rows_iter(x: np.ndarray, y: np.ndarray | None, task: str = "classify", **kw) -> RowIter:
    integer = x.dtype.kind in "iu"
    meta = RowMeta(
        task=task,
        num_classes=int(y.max()) + 1 if task == "classify" and y is not None else None,
        vocab_size=int(x.max()) + 1 if integer else None,
        feature_shape=tuple(x.shape[1:]),
        label_shape=tuple(y.shape[1:]) if task == "regress" and y is not None else (),
        integer_data=integer,
    )
    kw.setdefault("batch_size", 16)
    return RowIter(x, y, meta=meta, **kw)


def train(sym_gen, it: RowIter, epochs: int, metric, lr: float = 0.05) -> tuple[float, float]:
    """(metric after the first epoch, metric after the last) on the training data."""
    mx.random.seed(0)
    module = BucketingModule(sym_gen, it.default_bucket_key, mx.cpu())
    module.bind(it.provide_data, it.provide_label, for_training=True)
    module.init_params(mx.init.Xavier())
    module.init_optimizer(optimizer="adam", optimizer_params={"learning_rate": lr})
    values = []
    for epoch in range(epochs):
        it.set_epoch(epoch)
        it.reset()
        metric.reset()
        for batch in it:
            module.forward_backward(batch)
            module.update()
            module.update_metric(metric, batch.label)
        values.append(metric.get()[metric.name])
    return values[0], values[-1]


def blobs(rows: int = 192, dims: int = 6, classes: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    y = np.arange(rows) % classes
    centers = rng.normal(scale=3.0, size=(classes, dims))
    return (centers[y] + rng.normal(size=(rows, dims))).astype(np.float32), y


# --- options ----------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [MlpOptions, LenetOptions, RnnClassifierOptions])
def test_options_are_documented(cls) -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        assert f.metadata["doc"], f.name
        assert f.name in hints


@pytest.mark.parametrize(
    ("cls", "bad"),
    [
        (MlpOptions, {"hidden": [8, 0]}),
        (MlpOptions, {"hidden": 8}),
        (MlpOptions, {"activation": "gelu"}),
        (MlpOptions, {"dropout": 1.0}),
        (LenetOptions, {"channels": [4]}),
        (LenetOptions, {"kernel": 4}),
        (LenetOptions, {"hidden": 0}),
        (RnnClassifierOptions, {"num_hidden": 0}),
        (RnnClassifierOptions, {"mode": "rnn_tanh"}),
        (RnnClassifierOptions, {"cell": "cudnn"}),
        (RnnClassifierOptions, {"pooling": "sum"}),
        (RnnClassifierOptions, {"dropout": -0.1}),
    ],
)
def test_options_reject_impossible_values(cls, bad) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        cls(**bad)


def test_models_check_what_the_data_reports() -> None:
    with pytest.raises(ValueError, match="num_classes"):
        build_mlp(MlpOptions(), DataInfo(task="classify"))
    with pytest.raises(ValueError, match="task 'lm'"):
        build_mlp(MlpOptions(), DataInfo(num_classes=5, task="lm"))
    with pytest.raises(ValueError, match="vocab_size"):
        build_rnn_classifier(RnnClassifierOptions(), DataInfo(num_classes=2, task="classify"))
    with pytest.raises(ValueError, match="images"):
        build_lenet(
            LenetOptions(), ArrayDataInfo(num_classes=2, task="classify", feature_shape=(5,))
        )
    info = ArrayDataInfo(num_classes=2, vocab_size=9, task="classify", integer_data=True)
    with pytest.raises(ValueError, match="sequence_length"):
        build_rnn_classifier(RnnClassifierOptions(), info)((3, 4))


# --- training ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        MlpOptions(hidden=[16]),
        MlpOptions(hidden=[16, 8], activation="tanh", dropout=0.2, batch_norm=True),
        MlpOptions(hidden=[], activation="sigmoid"),
    ],
)
def test_mlp_learns_blobs(options: MlpOptions) -> None:
    x, y = blobs()
    it = rows_iter(x, y, batch_size=20, shuffle=True)  # 192 rows: the last batch is padded
    symbol, data_names, label_names = build_mlp(options, it.data_info)((6,))
    assert (data_names, label_names) == (("data",), ("softmax_label",))
    assert symbol.list_outputs() == ["softmax_output"]
    first, last = train(build_mlp(options, it.data_info), it, 6, DeviceAccuracy(pad_id=-1))
    assert last > 0.9, (first, last)


def test_mlp_regression_learns_a_linear_map_with_nan_padding() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(90, 4)).astype(np.float32)
    y = np.stack([x @ [1.0, -2.0, 0.5, 0.0], x @ [0.0, 1.0, 1.0, 1.0]], axis=1) + 0.3
    it = rows_iter(x, y.astype(np.float32), task="regress", batch_size=16)
    assert it.data_info.label_shape == (2,)
    symbol, _, _ = build_mlp(MlpOptions(hidden=[]), it.data_info)((4,))
    assert symbol.list_outputs() == ["regression_output"]
    first, last = train(build_mlp(MlpOptions(hidden=[]), it.data_info), it, 30, DeviceMSE(), 0.1)
    assert np.isfinite(first) and last < 0.01 < first


@pytest.mark.parametrize("shape", [(1, 8, 8), (8, 8), (3, 5, 7)])
def test_lenet_binds_and_learns(shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(2)
    y = np.arange(64) % 2
    x = rng.normal(scale=0.5, size=(64, *shape)).astype(np.float32)
    x[y == 1, ..., : shape[-1] // 2] += 1.5  # class 1: a bright left half
    it = rows_iter(x, y, batch_size=16, shuffle=True)
    options = LenetOptions(channels=[4, 6], kernel=3, hidden=16, dropout=0.1)
    names = build_lenet(options, it.data_info)(shape)[0].list_arguments()
    assert {"conv1_weight", "conv2_weight", "fc1_weight", "pred_weight"} <= set(names)
    _, last = train(build_lenet(options, it.data_info), it, 5, DeviceAccuracy(pad_id=-1))
    assert last > 0.9


def token_task(rows: int = 160, length: int = 8, seed: int = 3):
    """Label 1 when token 5 occurs; rows right-padded with 0."""
    rng = np.random.default_rng(seed)
    x = np.zeros((rows, length), dtype=np.int32)
    y = np.zeros(rows, dtype=np.int64)
    for i in range(rows):
        n = int(rng.integers(2, length + 1))
        ids = rng.choice([1, 2, 3, 4, 6, 7, 8], size=n)
        if i % 2:
            ids[rng.integers(0, n)] = 5
            y[i] = 1
        x[i, :n] = ids
    return x, y


@pytest.mark.parametrize(
    "options",
    [
        RnnClassifierOptions(num_embed=8, num_hidden=12, pooling="max"),
        RnnClassifierOptions(num_embed=8, num_hidden=12, pooling="mean", mode="gru"),
        RnnClassifierOptions(
            num_embed=8, num_hidden=12, pooling="last", bidirectional=True, cell="unfused"
        ),
    ],
)
def test_rnn_classifier_learns_token_presence(options: RnnClassifierOptions) -> None:
    x, y = token_task()
    it = rows_iter(x, y, batch_size=16, shuffle=True)
    assert it.data_info.vocab_size == 9
    _, last = train(build_rnn_classifier(options, it.data_info), it, 8, DeviceAccuracy(pad_id=-1))
    assert last > 0.85


@pytest.mark.parametrize("pooling", ["last", "mean", "max"])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize(("cell", "mode"), [("fused", "lstm"), ("unfused", "gru")])
def test_rnn_classifier_output_ignores_appended_padding(pooling, bidirectional, cell, mode) -> None:
    """The same rows padded to 5 and to 9 positions (two buckets) give the same output."""
    options = RnnClassifierOptions(
        num_embed=6,
        num_hidden=7,
        num_layers=2,
        mode=mode,
        cell=cell,
        bidirectional=bidirectional,
        pooling=pooling,
    )
    info = ArrayDataInfo(
        num_classes=3, vocab_size=10, pad_id=-1, task="classify", integer_data=True
    )
    module = BucketingModule(build_rnn_classifier(options, info), (9,), mx.cpu())
    module.bind([("data", (4, 9))], [("softmax_label", (4,))], for_training=False)
    mx.random.seed(5)
    module.init_params(mx.init.Uniform(0.5))
    short = np.array([[3, 1, 4, 1, 5], [9, 2, 6, 0, 0], [5, 0, 0, 0, 0], [0, 0, 0, 0, 0]])
    outputs = []
    for length in (5, 9):
        data = np.zeros((4, length), dtype=np.float32)
        data[:, :5] = short
        batch = mx.io.DataBatch(
            [mx.nd.array(data)],
            [mx.nd.array([0, 1, 2, -1])],
            bucket_key=(length,),
            provide_data=[mx.io.DataDesc("data", (4, length))],
            provide_label=[mx.io.DataDesc("softmax_label", (4,))],
        )
        module.forward(batch, is_train=False)
        outputs.append(module.get_outputs()[0].asnumpy())
    assert outputs[0].shape == (4, 3)
    np.testing.assert_allclose(outputs[0], outputs[1], rtol=1e-5, atol=1e-6)
    assert not np.allclose(outputs[0][0], outputs[0][1])  # rows do differ


# --- padding rows of a batch -----------------------------------------------------------------


def _gradients(symbol, data: np.ndarray, label: np.ndarray, params: dict) -> dict:
    req = {n: "write" for n in symbol.list_arguments()}
    req.update(data="null", softmax_label="null")
    ex = symbol.simple_bind(mx.cpu(), grad_req=req, data=data.shape, softmax_label=label.shape)
    for name, value in params.items():
        ex.arg_dict[name][:] = value
    ex.arg_dict["data"][:] = data
    ex.arg_dict["softmax_label"][:] = label
    ex.forward(is_train=True)
    ex.backward()
    return {n: g.asnumpy() for n, g in ex.grad_dict.items() if g is not None}


@pytest.mark.parametrize("task", ["classify", "regress"])
def test_padding_rows_get_no_gradient(task: str) -> None:
    info = ArrayDataInfo(
        num_classes=3 if task == "classify" else None,
        pad_id=-1 if task == "classify" else None,
        task=task,
        feature_shape=(4,),
    )
    symbol, _, _ = build_mlp(MlpOptions(hidden=[5]), info)((4,))
    rng = np.random.default_rng(4)
    data = rng.normal(size=(5, 4)).astype(np.float32)
    label = np.array([0, 2, 1, 0, 0], dtype=np.float32)
    shapes, _, _ = symbol.infer_shape(data=(5, 4), softmax_label=(5,))
    params = {
        n: rng.uniform(-0.5, 0.5, s)
        for n, s in zip(symbol.list_arguments(), shapes, strict=True)
        if n not in ("data", "softmax_label")
    }
    padded = label.copy()
    padded[3:] = -1 if task == "classify" else np.nan
    with_padding = _gradients(symbol, data, padded, params)
    only_real = _gradients(symbol, data[:3], label[:3], params)
    for name, grad in only_real.items():
        assert np.isfinite(with_padding[name]).all()
        np.testing.assert_allclose(with_padding[name], grad, rtol=1e-5, atol=1e-6)
