"""gru_lm and rnn_tagger: options, parameter names, binding in our BucketingModule, gradients."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing

import mxnet as mx
import numpy as np
import pytest
from float_bounds import assert_close_at_scale, rnn_chain_roundings

from mxtrain.data.base import DataInfo
from mxtrain.engine.bucketing import BucketingModule
from mxtrain.models.language_model_options import GruLmOptions
from mxtrain.models.language_models import build_gru_lm
from mxtrain.models.tagger_options import RnnTaggerOptions
from mxtrain.models.taggers import build_rnn_tagger

LM_INFO = DataInfo(vocab_size=11, num_classes=11, pad_id=0, task="lm")
TAG_INFO = DataInfo(vocab_size=12, num_classes=6, pad_id=0, task="tag")
SMALL = {"num_embed": 6, "num_hidden": 5, "num_layers": 2}


def chain(steps: int, batch: int, *, directions: int = 1) -> int:
    """The condition factor of float32 comparisons on SMALL's networks (see float_bounds):
    the same function computed with other kernel shapes (a longer bucket, the fused cell)."""
    classes = max(LM_INFO.num_classes, TAG_INFO.num_classes)
    return rnn_chain_roundings(steps, batch, classes, directions=directions, **SMALL)


INPUTS = ("data", "softmax_label")


def test_importing_and_listing_does_not_import_mxnet() -> None:
    code = (
        "import sys\n"
        "import mxtrain.models.tagger_options, mxtrain.models.recurrent_options\n"
        "from mxtrain.registry import MODELS\n"
        "for name in ('gru_lm', 'rnn_tagger'):\n"
        "    MODELS.get(name).options_class()\n"
        "assert 'mxnet' not in sys.modules, 'mxnet was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("cls", [GruLmOptions, RnnTaggerOptions])
def test_every_option_is_documented(cls) -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        assert f.metadata["doc"], f.name
        assert f.name in hints


@pytest.mark.parametrize(
    ("cls", "bad"),
    [
        (GruLmOptions, {"num_embed": 0}),
        (GruLmOptions, {"num_layers": True}),
        (GruLmOptions, {"dropout": 1.0}),
        (GruLmOptions, {"cell": "lstm"}),
        (RnnTaggerOptions, {"num_hidden": -1}),
        (RnnTaggerOptions, {"dropout": -0.1}),
        (RnnTaggerOptions, {"cell": "rnn"}),
        (RnnTaggerOptions, {"fused": "yes"}),
        (RnnTaggerOptions, {"bidirectional": 1}),
    ],
)
def test_bad_options_name_the_key(cls, bad) -> None:
    name = next(iter(bad))
    with pytest.raises(ValueError, match=name):
        cls(**bad)


def test_fused_choices() -> None:
    assert GruLmOptions().fused and not GruLmOptions(cell="unfused").fused
    assert RnnTaggerOptions().use_fused and RnnTaggerOptions(fused="fused").use_fused
    assert not RnnTaggerOptions(fused="unfused").use_fused


def test_data_info_is_checked() -> None:
    with pytest.raises(ValueError, match=r"gru_lm.*vocab_size"):
        build_gru_lm(GruLmOptions(), DataInfo())
    with pytest.raises(ValueError, match=r"rnn_tagger.*num_classes"):
        build_rnn_tagger(RnnTaggerOptions(), DataInfo(vocab_size=5))
    with pytest.raises(ValueError, match="pad_id"):
        build_rnn_tagger(RnnTaggerOptions(), DataInfo(vocab_size=5, num_classes=4))
    with pytest.raises(ValueError, match="bucket keys"):
        build_rnn_tagger(RnnTaggerOptions(), TAG_INFO)((3, 4))


def _params(symbol) -> list[str]:
    return [n for n in symbol.list_arguments() if n not in INPUTS]


def _unfused_names(prefix: str, sides: str, layers: int = 2) -> list[str]:
    return [
        f"{prefix}{side}{i}_{part}_{kind}"
        for i in range(layers)
        for side in sides
        for part in ("i2h", "h2h")
        for kind in ("weight", "bias")
    ]


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (GruLmOptions(cell="fused", **SMALL), ["gru_parameters"]),
        (GruLmOptions(cell="unfused", **SMALL), _unfused_names("gru_", "l")),
    ],
)
def test_gru_lm_parameter_names(options, expected) -> None:
    symbol, data_names, label_names = build_gru_lm(options, LM_INFO)(4)
    assert (data_names, label_names) == (("data",), ("softmax_label",))
    assert _params(symbol) == ["embed_weight", *expected, "pred_weight", "pred_bias"]
    assert symbol.list_outputs() == ["softmax_output", "nll_output"]


@pytest.mark.parametrize(
    ("fused", "cell", "bidirectional", "expected"),
    [
        ("fused", "lstm", False, ["lstm_parameters"]),
        ("fused", "gru", True, [f"gru_{s}{i}_parameters" for i in (0, 1) for s in "lr"]),
        ("unfused", "lstm", True, _unfused_names("lstm_", "lr")),
        ("unfused", "gru", False, _unfused_names("gru_", "l")),
    ],
)
def test_tagger_parameter_names(fused, cell, bidirectional, expected) -> None:
    options = RnnTaggerOptions(fused=fused, cell=cell, bidirectional=bidirectional, **SMALL)
    symbol, _, _ = build_rnn_tagger(options, TAG_INFO)(4)
    assert sorted(_params(symbol)) == sorted(
        ["embed_weight", *expected, "pred_weight", "pred_bias"]
    )


def test_gru_lm_fused_and_unfused_compute_the_same_function() -> None:
    """The unfused names are those of FusedRNNCell.unfuse(): fused parameters convert."""
    fused, _, _ = build_gru_lm(GruLmOptions(cell="fused", **SMALL), LM_INFO)(4)
    unfused, _, _ = build_gru_lm(GruLmOptions(cell="unfused", **SMALL), LM_INFO)(4)
    shapes = {"data": (2, 4), "softmax_label": (2, 4)}
    ex_f = fused.simple_bind(mx.cpu(), grad_req="null", **shapes)
    ex_u = unfused.simple_bind(mx.cpu(), grad_req="null", **shapes)
    data = mx.nd.array([[1, 2, 3, 4], [5, 6, 7, 0]])
    rng = np.random.default_rng(0)
    params = {}
    for name, array in ex_f.arg_dict.items():
        if name not in INPUTS:
            array[:] = rng.uniform(-0.3, 0.3, array.shape)
            params[name] = array
    cell = mx.rnn.FusedRNNCell(SMALL["num_hidden"], num_layers=2, mode="gru", prefix="gru_")
    unpacked = cell.unfuse().pack_weights(cell.unpack_weights(dict(params)))
    for name, array in ex_u.arg_dict.items():
        if name not in INPUTS:
            array[:] = unpacked[name]
    ex_f.forward(is_train=False, data=data)
    ex_u.forward(is_train=False, data=data)
    assert_close_at_scale(
        ex_f.outputs[0].asnumpy(), ex_u.outputs[0].asnumpy(), roundings=chain(4, 2)
    )


def _tag_batch(rows: list[list[int]], labels: list[list[int]], length: int) -> mx.io.DataBatch:
    """Rows of token ids (padded with 0 to ``length``) and their labels (0 = padding)."""
    data = np.zeros((len(rows), length))
    label = np.zeros((len(rows), length))
    for r, (tokens, tags) in enumerate(zip(rows, labels, strict=True)):
        data[r, : len(tokens)] = tokens
        label[r, : len(tags)] = tags
    return mx.io.DataBatch(
        [mx.nd.array(data)],
        [mx.nd.array(label)],
        pad=0,
        bucket_key=length,
        provide_data=[mx.io.DataDesc("data", data.shape)],
        provide_label=[mx.io.DataDesc("softmax_label", label.shape)],
    )


TAGGERS = [
    {"fused": "fused", "cell": "lstm", "bidirectional": False},
    {"fused": "fused", "cell": "lstm", "bidirectional": True},
    {"fused": "fused", "cell": "gru", "bidirectional": True},
    {"fused": "unfused", "cell": "lstm", "bidirectional": True},
    {"fused": "unfused", "cell": "gru", "bidirectional": False},
]
ROWS = [[3, 4, 5], [6, 7, 8, 9, 10], [11, 1]]  # 1 = <unk>: a real token
LABELS = [[2, 3, 4], [5, 2, 2, 3, 4], [3, 5]]


@pytest.mark.parametrize("kind", TAGGERS)
@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_tagger_trains_in_our_bucketing_module_with_two_buckets(kind, dropout) -> None:
    sym_gen = build_rnn_tagger(RnnTaggerOptions(dropout=dropout, **kind, **SMALL), TAG_INFO)
    module = BucketingModule(sym_gen, 7, mx.cpu())
    module.bind([mx.io.DataDesc("data", (3, 7))], [mx.io.DataDesc("softmax_label", (3, 7))])
    mx.random.seed(0)
    module.init_params(mx.init.Xavier())
    module.init_optimizer(optimizer="adam", optimizer_params={"learning_rate": 0.05})
    before = module.get_params()[0]["pred_weight"].asnumpy()
    losses = []
    for step in range(12):
        length = 7 if step % 2 else 5
        module.forward(_tag_batch(ROWS, LABELS, length), is_train=True)
        out = module.get_outputs()[0].asnumpy()
        assert out.shape == (3 * length, TAG_INFO.num_classes)
        # 6 probabilities summed (gamma_6 ~ 4e-7) after the softmax's own normalisation
        np.testing.assert_allclose(out.sum(axis=1), 1.0, rtol=1e-5)
        probs = out.reshape(3, length, -1)
        losses.append(
            -np.mean(
                [
                    np.log(probs[r, t, y])
                    for r, tags in enumerate(LABELS)
                    for t, y in enumerate(tags)
                ]
            )
        )
        module.backward()
        module.update()
    assert not np.allclose(module.get_params()[0]["pred_weight"].asnumpy(), before)
    assert losses[-1] < losses[0]
    assert set(module.bucket_keys) == {5, 7}


def _gradients(kind: dict, length: int, rows: list[list[int]], labels: list[list[int]]) -> dict:
    symbol, _, _ = build_rnn_tagger(RnnTaggerOptions(**kind, **SMALL), TAG_INFO)(length)
    req = {n: ("null" if n in INPUTS else "write") for n in symbol.list_arguments()}
    shapes = {"data": (len(rows), length), "softmax_label": (len(rows), length)}
    executor = symbol.simple_bind(mx.cpu(), grad_req=req, **shapes)
    rng = np.random.default_rng(1)
    for name in sorted(executor.arg_dict):
        if name not in INPUTS:
            executor.arg_dict[name][:] = rng.uniform(-0.5, 0.5, executor.arg_dict[name].shape)
    batch = _tag_batch(rows, labels, length)
    executor.forward(is_train=True, data=batch.data[0], softmax_label=batch.label[0])
    executor.backward()
    out = executor.outputs[0].asnumpy().reshape(len(rows), length, -1)
    grads = {n: g.asnumpy().copy() for n, g in executor.grad_dict.items() if g is not None}
    return {"out": out, **grads}


@pytest.mark.parametrize("kind", TAGGERS)
def test_padding_positions_give_no_gradient(kind) -> None:
    """Padding, whether at the end of a row, a whole padding row or a longer bucket, changes
    neither the outputs at real positions nor any gradient."""
    short = _gradients(kind, 5, ROWS, LABELS)
    long = _gradients(kind, 9, [*ROWS, []], [*LABELS, []])  # 4 more steps and a padding row
    for r, tokens in enumerate(ROWS):
        n = len(tokens)
        assert_close_at_scale(long["out"][r, :n], short["out"][r, :n], roundings=chain(9, 4))
    for name in short:
        if name != "out":
            assert_close_at_scale(long[name], short[name], roundings=chain(9, 4), err_msg=name)
    nothing = _gradients(kind, 5, ROWS, [[0] * len(r) for r in ROWS])  # every label is padding
    for name, grad in nothing.items():
        if name != "out":
            assert not grad.any(), name


def test_bidirectional_fused_and_unfused_agree() -> None:
    """Both read right to left up to each row's length: per (layer, direction) the fused
    single-layer blob converts to the unfused cell's arrays."""
    shapes = {"data": (3, 6), "softmax_label": (3, 6)}
    kinds = {f: {"fused": f, "cell": "lstm", "bidirectional": True} for f in ("fused", "unfused")}
    ex = {
        f: build_rnn_tagger(RnnTaggerOptions(**k, **SMALL), TAG_INFO)(6)[0].simple_bind(
            mx.cpu(), grad_req="null", **shapes
        )
        for f, k in kinds.items()
    }
    rng = np.random.default_rng(2)
    converted: dict[str, np.ndarray] = {}
    for name, array in ex["fused"].arg_dict.items():
        if name in INPUTS:
            continue
        array[:] = rng.uniform(-0.4, 0.4, array.shape)
        if name.endswith("_parameters"):
            prefix = name[: -len("parameters")]
            cell = mx.rnn.FusedRNNCell(SMALL["num_hidden"], num_layers=1, prefix=prefix)
            packed = cell.unfuse().pack_weights(cell.unpack_weights({name: array}))
            for key, value in packed.items():
                converted[prefix + key[len(prefix) + len("l0_") :]] = value.asnumpy()
        else:
            converted[name] = array.asnumpy()
    for name, array in ex["unfused"].arg_dict.items():
        if name not in INPUTS:
            array[:] = converted[name]
    batch = _tag_batch(ROWS, LABELS, 6)
    outs = []
    for f in ("fused", "unfused"):
        ex[f].forward(is_train=False, data=batch.data[0], softmax_label=batch.label[0])
        outs.append(ex[f].outputs[0].asnumpy())
    assert_close_at_scale(outs[0], outs[1], roundings=chain(6, 3, directions=2))


def test_accuracy_metric_scores_tagger_outputs_without_padding() -> None:
    """The built-in accuracy reads (batch, time) labels against (batch * time, labels) outputs
    and skips label 0 (padding)."""
    from mxtrain.metrics import DeviceAccuracy

    rng = np.random.default_rng(3)
    labels = np.array([[2, 3, 4, 0, 0], [5, 2, 0, 0, 0]], dtype=np.float32)
    probs = rng.uniform(size=(10, TAG_INFO.num_classes)).astype(np.float32)
    probs[3:5, 0] = 10.0  # padding positions "predict" <pad>: must not count either way
    metric = DeviceAccuracy(pad_id=0)
    metric.update([mx.nd.array(labels)], [mx.nd.array(probs)])
    real = labels.ravel() != 0
    expected = (probs.argmax(axis=1) == labels.ravel())[real].mean()
    assert metric.get()["accuracy"] == pytest.approx(expected)
    assert metric.total_tokens == 5
