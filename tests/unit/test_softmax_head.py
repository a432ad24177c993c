"""The engine's one-pass softmax head (model.loss: one_pass): the same gradients, loss and
probabilities as the graph formulations, on one device and on two, with and without padding."""

from __future__ import annotations

import mxnet as mx
import numpy as np
import pytest
from float_bounds import assert_close_at_scale, rnn_chain_roundings

from mxtrain.data.base import DataInfo
from mxtrain.engine.bucketing import BucketingModule
from mxtrain.engine.softmax_head import SoftmaxGradientHead, SoftmaxHeadSpec
from mxtrain.models.language_model_options import LstmLmOptions
from mxtrain.models.language_models import build_lstm_lm
from mxtrain.models.rnn_common import PROBABILITY_FLOOR

INFO = DataInfo(vocab_size=11, num_classes=11, pad_id=0)
SMALL = {"num_embed": 6, "num_hidden": 5, "num_layers": 2}
STEPS, BATCH = 5, 4


def _module(
    loss: str, ignore_padding: bool, contexts: list, probabilities: bool
) -> BucketingModule:
    options = LstmLmOptions(cell="fused", ignore_padding=ignore_padding, loss=loss, **SMALL)
    sym_gen = build_lstm_lm(options, INFO)
    head = None
    if loss == "one_pass":
        sym_gen, facts = sym_gen.softmax_head_variant(probabilities)
        head = SoftmaxHeadSpec(**facts)
    module = BucketingModule(sym_gen, STEPS, contexts, softmax_head=head)
    module.bind([("data", (BATCH, STEPS))], [("softmax_label", (BATCH, STEPS))], for_training=True)
    return module


def _step(module: BucketingModule, params: dict, labels: np.ndarray) -> tuple[dict, dict]:
    module.init_params(arg_params=params, allow_missing=False, force_init=True)
    batch = mx.io.DataBatch(
        [mx.nd.array((labels + 3) % 11)], [mx.nd.array(labels)], bucket_key=STEPS
    )
    module.forward(batch, is_train=True)
    outputs = dict(zip(module.output_names, module.get_outputs(), strict=True))
    module.backward()
    grads = {n: module.store.grads[n][0].asnumpy() for n in params}
    if len(module.store.grads[next(iter(params))]) > 1:  # several devices: their sum
        grads = {n: sum(g.asnumpy() for g in module.store.grads[n]) for n in params}
    return {n: o.asnumpy() for n, o in outputs.items()}, grads


@pytest.mark.parametrize("ignore_padding", [True, False])
@pytest.mark.parametrize("devices", [1, 2])
@pytest.mark.parametrize("probabilities", [True, False])
def test_one_pass_trains_like_softmax_output(ignore_padding, devices, probabilities) -> None:
    """Parameter gradients equal SoftmaxOutput's (and the softmax graph's) to float rounding;
    the loss is -log p(label), 0 on ignored padding; the probabilities (when the metrics read
    them) are the softmax's."""
    rng = np.random.default_rng(7)
    labels = rng.integers(0, 11, (BATCH, STEPS)).astype(np.float32)
    labels[0, 3:] = 0  # padding at the end of a row, and wherever pad id 0 was drawn
    contexts = [mx.cpu(i) for i in range(devices)]
    reference = _module("softmax_output", ignore_padding, [mx.cpu()], True)
    params = {
        n: mx.nd.array(rng.uniform(-0.5, 0.5, a.shape))
        for n, a in reference.store.params.items()
        for a in [a[0]]
    }
    classic_out, classic = _step(reference, params, labels)
    _, softmax = _step(_module("softmax", ignore_padding, [mx.cpu()], True), params, labels)
    module = _module("one_pass", ignore_padding, contexts, probabilities)
    outputs, grads = _step(module, params, labels)

    probs = classic_out["softmax_output"]
    flat = labels.reshape(-1).astype(int)
    nll = -np.log(probs[np.arange(flat.size), flat])
    if ignore_padding:
        nll[flat == 0] = 0
    names = ["softmax_output", "nll_output"] if probabilities else ["nll_output"]
    assert list(outputs)[: len(names)] == names
    # a few exp/log/sum roundings over 11 classes of logits of a few units: far below 1e-5
    np.testing.assert_allclose(outputs["nll_output"], nll, rtol=1e-5, atol=1e-6)
    if probabilities:
        np.testing.assert_allclose(outputs["softmax_output"], probs, rtol=1e-5, atol=1e-7)
    roundings = rnn_chain_roundings(STEPS, BATCH, INFO.vocab_size, **SMALL)
    for name in params:
        for want in (classic[name], softmax[name]):
            assert_close_at_scale(grads[name], want, roundings=roundings, err_msg=name)
    assert np.abs(grads["pred_weight"]).sum() > 0


def test_gradient_is_softmax_minus_onehot_with_ignored_rows_zero() -> None:
    """The head alone on fixed logits: softmax - onehot(label), rows of the ignored label 0,
    the probabilities (taken before backward) untouched by it."""
    logits = mx.nd.array([[1.0, 2.0, 3.0], [0.5, -1.0, 2.0], [3.0, 0.0, 0.0]])
    labels = np.array([2, 0, 1], dtype=np.float32)  # row 1's label is the ignored 0
    spec = SoftmaxHeadSpec("y", PROBABILITY_FLOOR, ignore_label=0, probabilities=True)
    head = SoftmaxGradientHead(spec, 1)
    probs, nll = head.forward(0, [logits], mx.nd.array(labels), labels, train=True)
    grad = head.gradient(0).asnumpy()
    z = logits.asnumpy().astype(np.float64)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    want = p.copy()
    want[0, 2] -= 1
    want[2, 1] -= 1
    want[1] = 0
    # float32 softmax over 3 values: a few roundings of u = 6e-8
    np.testing.assert_allclose(grad, want, rtol=0, atol=1e-6)
    np.testing.assert_allclose(probs.asnumpy(), p, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(nll.asnumpy(), [-np.log(p[0, 2]), 0, -np.log(p[2, 1])], rtol=1e-6)
    with pytest.raises(RuntimeError, match="training forward"):
        head.gradient(0)


def test_every_row_ignored_gives_a_zero_gradient_and_a_module_refuses_out_grads() -> None:
    head = SoftmaxGradientHead(SoftmaxHeadSpec("y", PROBABILITY_FLOOR, ignore_label=4), 1)
    labels = np.full(3, 4, dtype=np.float32)
    (nll,) = head.forward(0, [mx.nd.ones((3, 5))], mx.nd.array(labels), labels, train=True)
    assert not nll.asnumpy().any()
    assert not head.gradient(0).asnumpy().any()
    module = _module("one_pass", True, [mx.cpu()], False)
    module.init_params(mx.init.Uniform(0.1))
    batch = mx.io.DataBatch([mx.nd.ones((BATCH, STEPS))], [mx.nd.ones((BATCH, STEPS))])
    module.forward(batch, is_train=True)
    with pytest.raises(ValueError, match="out_grads"):
        module.backward(out_grads=[mx.nd.ones((BATCH * STEPS, 11))])


def _logits_module(contexts: list, gradient_input: bool) -> BucketingModule:
    """A bare logits graph: the head's gradient in out_grads, or through an input."""

    def sym_gen(key: int):
        logits = mx.sym.FullyConnected(
            mx.sym.Embedding(mx.sym.var("data"), input_dim=11, output_dim=3),
            num_hidden=11, flatten=False,
        ).reshape((-1, 11))  # fmt: skip
        label = mx.sym.BlockGrad(mx.sym.var("softmax_label").reshape((-1,)), name="keep")
        outputs = [logits, label]
        if gradient_input:
            outputs = [mx.sym.BlockGrad(logits), label]
            outputs.append(mx.sym.make_loss(logits * mx.sym.var("grad_in"), name="grad_in"))
        return mx.sym.Group(outputs), ("data",), ("softmax_label",)

    names = {"gradient_input": "grad_in", "gradient_output": "grad_in_loss"}
    spec = SoftmaxHeadSpec(
        label="softmax_label", probability_floor=PROBABILITY_FLOOR,
        **(names if gradient_input else {}),
    )  # fmt: skip
    module = BucketingModule(sym_gen, STEPS, contexts, softmax_head=spec)
    module.bind([("data", (BATCH, STEPS))], [("softmax_label", (BATCH, STEPS))], for_training=True)
    return module


@pytest.mark.parametrize("devices", [1, 2])
def test_only_a_gradient_in_out_grads_costs_every_bucket_a_logits_array(devices: int) -> None:
    """MXNet copies a gradient handed to backward into arrays each executor allocates of its
    own, which the memory estimate counts; a gradient input is a view of one shared array.
    Both ways train the same parameters, bit for bit (the product's gradient is exact)."""
    contexts = [mx.cpu(i) for i in range(devices)]
    out_grads = _logits_module(contexts, gradient_input=False)
    through_input = _logits_module(contexts, gradient_input=True)
    assert out_grads.output_gradient_bytes() == BATCH * STEPS * 11 * 4
    assert through_input.output_gradient_bytes() == 0
    assert "grad_in" not in through_input.param_names
    assert through_input.output_names == ["nll_output", "keep_output"]
    params = {"fullyconnected0_weight": None}
    labels = np.random.RandomState(2).randint(1, 11, (BATCH, STEPS))
    grads = []
    for module in (out_grads, through_input):
        module.init_params(mx.init.Uniform(0.5), force_init=True)
        if params["fullyconnected0_weight"] is None:
            params = {k: v.copy() for k, v in module.get_params()[0].items()}
        module.set_params(params, {})
        batch = mx.io.DataBatch([mx.nd.array(labels)], [mx.nd.array(labels)])
        module.forward_backward(batch)
        grads.append({n: module.grad_array(n).asnumpy() for n in module.param_names})
    for name, value in grads[0].items():
        assert np.array_equal(value, grads[1][name]), name


def test_the_lm_graph_hands_its_gradient_through_an_input() -> None:
    module = _module("one_pass", False, [mx.cpu()], probabilities=False)
    assert module.output_gradient_bytes() == 0
