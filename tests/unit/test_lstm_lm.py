"""lstm_lm: options, parameter names, fused/unfused bind + forward/backward, padding gradient."""

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
from mxtrain.models.language_model_options import LstmLmOptions
from mxtrain.models.language_models import build_lstm_lm

INFO = DataInfo(vocab_size=11, num_classes=11, pad_id=0)
SMALL = {"num_embed": 6, "num_hidden": 5, "num_layers": 2}


def chain_roundings(steps: int, batch: int) -> int:
    """The condition factor of float32 comparisons on SMALL's LM (see float_bounds)."""
    return rnn_chain_roundings(steps, batch, INFO.vocab_size, **SMALL)


def test_importing_models_and_data_options_does_not_import_mxnet() -> None:
    code = (
        "import sys\n"
        "import mxtrain.models.language_model_options, mxtrain.data.bucket_sentence_options\n"
        "import mxtrain.data.vocab\n"
        "from mxtrain.registry import MODELS\n"
        "MODELS.get('lstm_lm').options_class()\n"
        "assert 'mxnet' not in sys.modules, 'mxnet was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_options_docs_and_validation() -> None:
    hints = typing.get_type_hints(LstmLmOptions)
    for f in dataclasses.fields(LstmLmOptions):
        assert f.metadata["doc"], f.name
        assert f.name in hints
    assert LstmLmOptions().fused
    assert not LstmLmOptions(cell="unfused").fused
    for bad in (
        {"num_embed": 0},
        {"num_hidden": -1},
        {"num_layers": 0},
        {"num_layers": True},
        {"dropout": 1.0},
        {"dropout": -0.1},
        {"cell": "gru"},
    ):
        name = next(iter(bad))
        with pytest.raises(ValueError, match=name):
            LstmLmOptions(**bad)


def test_data_info_must_give_sizes() -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        build_lstm_lm(LstmLmOptions(), DataInfo())
    with pytest.raises(ValueError, match="pad_id"):
        build_lstm_lm(LstmLmOptions(), DataInfo(vocab_size=5, num_classes=5))
    build_lstm_lm(LstmLmOptions(ignore_padding=False), DataInfo(vocab_size=5, num_classes=5))
    with pytest.raises(ValueError, match="bucket keys"):
        build_lstm_lm(LstmLmOptions(), INFO)((3, 4))


@pytest.mark.parametrize(
    ("cell", "lstm_params"),
    [
        ("fused", ["lstm_parameters"]),
        (
            "unfused",
            [
                f"lstm_l{i}_{p}_{w}"
                for i in (0, 1)
                for p in ("i2h", "h2h")
                for w in ("weight", "bias")
            ],
        ),
    ],
)
def test_parameter_names_and_interface(cell, lstm_params) -> None:
    symbol, data_names, label_names = build_lstm_lm(LstmLmOptions(cell=cell, **SMALL), INFO)(4)
    assert (data_names, label_names) == (("data",), ("softmax_label",))
    assert symbol.list_arguments() == [
        "data",
        "embed_weight",
        *lstm_params,
        "pred_weight",
        "pred_bias",
        "softmax_label",
    ]
    # probabilities first (what metrics and predict read), then the trained loss
    assert symbol.list_outputs() == ["softmax_output", "nll_output"]
    classic, _, _ = build_lstm_lm(LstmLmOptions(cell=cell, loss="softmax_output", **SMALL), INFO)(4)
    assert classic.list_outputs() == ["softmax_output"]
    assert classic.list_arguments() == symbol.list_arguments()


def _batch(rng: np.random.Generator, batch: int, length: int) -> mx.io.DataBatch:
    data = mx.nd.array(rng.integers(1, 11, (batch, length)))
    label = mx.nd.array(rng.integers(0, 11, (batch, length)))
    return mx.io.DataBatch(
        [data],
        [label],
        bucket_key=length,
        provide_data=[mx.io.DataDesc("data", (batch, length))],
        provide_label=[mx.io.DataDesc("softmax_label", (batch, length))],
    )


@pytest.mark.parametrize("cell", ["fused", "unfused"])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_binds_and_trains_two_buckets(cell, dropout) -> None:
    sym_gen = build_lstm_lm(LstmLmOptions(cell=cell, dropout=dropout, **SMALL), INFO)
    module = mx.mod.BucketingModule(sym_gen, default_bucket_key=7, context=mx.cpu())
    module.bind([("data", (3, 7))], [("softmax_label", (3, 7))])
    mx.random.seed(0)
    module.init_params(mx.init.Xavier())
    module.init_optimizer(optimizer="sgd", optimizer_params={"learning_rate": 0.1})
    rng = np.random.default_rng(0)
    before = module.get_params()[0]["pred_weight"].asnumpy()
    for length in (7, 4, 7):
        batch = _batch(rng, 3, length)
        module.forward(batch, is_train=True)
        out = module.get_outputs()[0].asnumpy()
        assert out.shape == (3 * length, 11)
        # 11 probabilities summed (gamma_11 ~ 7e-7) after the softmax's own normalisation
        np.testing.assert_allclose(out.sum(axis=1), 1.0, rtol=1e-5)
        module.backward()
        module.update()
    assert not np.allclose(module.get_params()[0]["pred_weight"].asnumpy(), before)


@pytest.mark.parametrize("loss", ["softmax", "log_softmax", "nll", "softmax_output"])
@pytest.mark.parametrize("ignore_padding", [True, False])
def test_padding_labels_get_no_gradient(ignore_padding, loss) -> None:
    symbol, _, _ = build_lstm_lm(
        LstmLmOptions(cell="fused", ignore_padding=ignore_padding, loss=loss, **SMALL), INFO
    )(3)
    req = {name: "write" for name in symbol.list_arguments()}
    req.update(data="null", softmax_label="null")
    executor = symbol.simple_bind(mx.cpu(), grad_req=req, data=(2, 3), softmax_label=(2, 3))
    for name, array in executor.arg_dict.items():
        if name not in ("data", "softmax_label"):
            array[:] = mx.nd.random.uniform(-0.5, 0.5, array.shape)
    executor.arg_dict["data"][:] = mx.nd.array([[1, 2, 3], [4, 5, 6]])
    executor.arg_dict["softmax_label"][:] = 0  # every position is padding
    executor.forward(is_train=True)
    executor.backward()
    grad = np.abs(executor.grad_dict["pred_weight"].asnumpy()).sum()
    assert (grad == 0) == ignore_padding


def test_fused_and_unfused_compute_the_same_function() -> None:
    """The unfused parameter names are those of FusedRNNCell.unfuse(): checkpoints convert."""
    fused, _, _ = build_lstm_lm(LstmLmOptions(cell="fused", **SMALL), INFO)(4)
    unfused, _, _ = build_lstm_lm(LstmLmOptions(cell="unfused", **SMALL), INFO)(4)
    shapes = {"data": (2, 4), "softmax_label": (2, 4)}
    ex_f = fused.simple_bind(mx.cpu(), grad_req="null", **shapes)
    ex_u = unfused.simple_bind(mx.cpu(), grad_req="null", **shapes)
    data = mx.nd.array([[1, 2, 3, 4], [5, 6, 7, 0]])
    params = {}
    for name, array in ex_f.arg_dict.items():
        if name == "data":
            array[:] = data
        elif name != "softmax_label":
            array[:] = mx.nd.random.uniform(-0.3, 0.3, array.shape)
            params[name] = array
    cell = mx.rnn.FusedRNNCell(SMALL["num_hidden"], num_layers=2, mode="lstm", prefix="lstm_")
    # fused blob -> per-gate arrays -> the unfused cells' arrays
    unpacked = cell.unfuse().pack_weights(cell.unpack_weights(dict(params)))
    for name, array in ex_u.arg_dict.items():
        if name == "data":
            array[:] = data
        elif name != "softmax_label":
            array[:] = unpacked[name]
    ex_f.forward(is_train=False)
    ex_u.forward(is_train=False)
    assert_close_at_scale(
        ex_f.outputs[0].asnumpy(), ex_u.outputs[0].asnumpy(), roundings=chain_roundings(4, 2)
    )


def _loss_run(loss, ignore_padding, params, rng, labels, probabilities=True):
    sym_gen = build_lstm_lm(
        LstmLmOptions(cell="fused", ignore_padding=ignore_padding, loss=loss, **SMALL), INFO
    )
    if not probabilities:
        sym_gen = sym_gen.without_probabilities()
    symbol, _, _ = sym_gen(5)
    req = {name: "write" for name in symbol.list_arguments()}
    req.update(data="null", softmax_label="null")
    ex = symbol.simple_bind(mx.cpu(), grad_req=req, data=(3, 5), softmax_label=(3, 5))
    if not params:
        params.update(
            {
                n: mx.nd.array(rng.uniform(-0.5, 0.5, a.shape))
                for n, a in ex.arg_dict.items()
                if n not in ("data", "softmax_label")
            }
        )
    for name, value in params.items():
        ex.arg_dict[name][:] = value
    ex.arg_dict["data"][:] = labels + 1
    ex.arg_dict["softmax_label"][:] = labels
    ex.forward(is_train=True)
    ex.backward()
    outputs = {n: o.asnumpy() for n, o in zip(symbol.list_outputs(), ex.outputs, strict=True)}
    return outputs, {n: ex.grad_dict[n].asnumpy() for n in params}


@pytest.mark.parametrize("ignore_padding", [True, False])
@pytest.mark.parametrize("loss", ["softmax", "log_softmax", "nll"])
@pytest.mark.parametrize("probabilities", [True, False])
def test_every_loss_gives_softmax_output_gradients_and_outputs(
    ignore_padding, loss, probabilities
) -> None:
    """Every formulation trains exactly like SoftmaxOutput (and like log_softmax, the default
    before measuring chose), up to float rounding; without probabilities the loss comes
    first and is -log p(label)."""
    rng = np.random.default_rng(5)
    params: dict = {}
    labels = mx.nd.array(rng.integers(0, 11, (3, 5)))  # pad id 0 appears
    classic, classic_grads = _loss_run("softmax_output", ignore_padding, params, rng, labels)
    _old, old_grads = _loss_run("log_softmax", ignore_padding, params, rng, labels)
    outputs, grads = _loss_run(loss, ignore_padding, params, rng, labels, probabilities)
    probs = classic["softmax_output"]
    if probabilities:
        assert list(outputs) == ["softmax_output", "nll_output"]
        # the heads share the logits and differ in a few exp/log/sum roundings over the 11
        # classes (logits of a few units): far below 1e-5 relative
        np.testing.assert_allclose(outputs["softmax_output"], probs, rtol=1e-5, atol=1e-7)
    else:
        assert list(outputs) == ["nll_output"]
    flat = labels.asnumpy().reshape(-1).astype(int)
    nll = -np.log(probs[np.arange(flat.size), flat])
    if ignore_padding:
        nll[flat == 0] = 0
    # -log p from another head: the probabilities' few roundings above, in absolute terms
    np.testing.assert_allclose(outputs["nll_output"], nll, rtol=1e-5, atol=1e-6)
    for name in params:
        for reference in (classic_grads, old_grads):
            assert_close_at_scale(
                grads[name], reference[name], roundings=chain_roundings(5, 3), err_msg=name
            )
    assert any(np.abs(g).sum() > 0 for g in grads.values())


def test_softmax_loss_survives_an_underflowing_label_probability() -> None:
    """A label probability that underflows to 0 gives a finite loss and finite gradients."""
    from mxtrain.models.rnn_common import PROBABILITY_FLOOR, loss_heads

    logits, label = mx.sym.Variable("logits"), mx.sym.Variable("label")
    group = mx.sym.Group(loss_heads(logits, label, "softmax", None))
    ex = group.simple_bind(
        mx.cpu(), logits=(2, 3), label=(2,), grad_req={"logits": "write", "label": "null"}
    )
    ex.arg_dict["logits"][:] = mx.nd.array([[200.0, 0.0, 0.0], [1.0, 2.0, 3.0]])
    ex.arg_dict["label"][:] = mx.nd.array([1, 2])
    ex.forward(is_train=True)
    ex.backward()
    nll = ex.outputs[1].asnumpy()
    assert nll[0] == pytest.approx(-np.log(np.float32(PROBABILITY_FLOOR)), rel=1e-5)
    assert np.isfinite(ex.grad_dict["logits"].asnumpy()).all()


def test_unmeasured_choices_build_what_they_always_built() -> None:
    """An unresolved auto (a library call, an old run folder): fused cell; nll is log_softmax."""
    assert LstmLmOptions().fused
    assert LstmLmOptions(loss="nll").loss_formulation == "log_softmax"
    assert LstmLmOptions(loss="auto").loss_formulation == "softmax"
    with pytest.raises(ValueError, match="loss"):
        LstmLmOptions(loss="sigmoid")
