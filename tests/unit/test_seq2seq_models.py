"""rnn_seq2seq and transformer_seq2seq: options, shapes, parameter names, padding, label
smoothing, and the encoder + decoder-step graphs against the teacher-forced training graph."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import mxnet as mx
import numpy as np
import pytest
from click.testing import CliRunner
from float_bounds import assert_close_at_scale, gamma

from mxtrain.cli.main import cli
from mxtrain.data.base import DataInfo, Seq2SeqInfo
from mxtrain.engine.bucketing import BucketingModule
from mxtrain.errors import InvalidValue
from mxtrain.metrics import DevicePerplexity
from mxtrain.models.rnn_seq2seq import build_rnn_seq2seq
from mxtrain.models.seq2seq_common import MASKED_SCORE, smoothed_softmax_loss
from mxtrain.models.seq2seq_options import RnnSeq2SeqOptions, TransformerSeq2SeqOptions
from mxtrain.models.transformer_seq2seq import build_transformer_seq2seq
from mxtrain.registry import ITERATORS

INFO = Seq2SeqInfo(vocab_size=9, num_classes=11, pad_id=0)
SHARED = Seq2SeqInfo(vocab_size=11, num_classes=11, pad_id=0, shared_vocab=True)
BOS, EOS = INFO.bos_id, INFO.eos_id
RNN_SMALL = {"num_embed": 4, "num_hidden": 5, "num_layers": 2}
TRANSFORMER_SMALL = {
    "model_size": 8,
    "num_heads": 2,
    "ffn_size": 6,
    "num_layers": 2,
    "decoder_layers": 1,
    "dropout": 0.0,
}
TRAINING_INPUTS = ("source", "target", "target_label")

#: (name, builder, options, data info): every attention type, tied, shared and untied, with and
#: without input feeding
MODELS = [
    ("rnn_dot", build_rnn_seq2seq, RnnSeq2SeqOptions(attention="dot", **RNN_SMALL), INFO),
    (
        "rnn_general_tied",
        build_rnn_seq2seq,
        RnnSeq2SeqOptions(attention="general", tie_embeddings=True, **RNN_SMALL),
        INFO,
    ),
    ("rnn_mlp", build_rnn_seq2seq, RnnSeq2SeqOptions(attention="mlp", **RNN_SMALL), INFO),
    (
        "rnn_mlp_fed",
        build_rnn_seq2seq,
        RnnSeq2SeqOptions(attention="mlp", input_feeding=True, **RNN_SMALL),
        INFO,
    ),
    (
        "rnn_mlp_fed_narrow_encoder",
        build_rnn_seq2seq,
        RnnSeq2SeqOptions(attention="mlp", input_feeding=True, encoder_hidden=3, **RNN_SMALL),
        INFO,
    ),
    (
        "rnn_general_tied_fed",
        build_rnn_seq2seq,
        RnnSeq2SeqOptions(
            attention="general", tie_embeddings=True, input_feeding=True, **RNN_SMALL
        ),
        INFO,
    ),
    (
        "rnn_mlp_shared_tied",
        build_rnn_seq2seq,
        RnnSeq2SeqOptions(share_embeddings=True, tie_embeddings=True, **RNN_SMALL),
        SHARED,
    ),
    (
        "transformer",
        build_transformer_seq2seq,
        TransformerSeq2SeqOptions(tie_embeddings=False, **TRANSFORMER_SMALL),
        INFO,
    ),
    (
        "transformer_shared_tied",
        build_transformer_seq2seq,
        TransformerSeq2SeqOptions(share_embeddings=True, **TRANSFORMER_SMALL),
        SHARED,
    ),
]
IDS = [m[0] for m in MODELS]
UNTIED = [m for m in MODELS if not m[2].tie_embeddings]

SOURCES = [[4, 5, 6], [7, 8, 1, 4, 5], [6]]  # 1 = <unk>: a real token
TARGETS = [[5, 6, 7, 8], [9, 10], [4, 1, 5]]


def chain(options: Any, source_len: int, target_len: int, batch: int, vocab: int) -> int:
    """The condition factor of float32 comparisons of one model computed two ways (see
    float_bounds.assert_close_at_scale): roundings along the longest chain of the forward and
    backward pass.

    RNN: per step, layer and direction a gate dot over 4 * H + max(E, 2H) values and ~5
    nonlinearities, over source and target steps; attention sums over the S source positions
    and the H-wide memory; the output's softmax over the vocabulary (two passes); a gradient
    also sums over every position of the batch. Transformer: per layer, dots over d, the FFN's
    width and the attended positions (S + T) and ~10 normalisation and softmax roundings."""
    steps = source_len + target_len
    if isinstance(options, RnnSeq2SeqOptions):
        hidden, embed, layers = options.num_hidden, options.num_embed, options.num_layers
        per_step = 4 * hidden + max(embed, 2 * hidden) + 5
        forward = steps * layers * 2 * per_step + 4 * (source_len + 2 * hidden)
    else:
        size = options.model_size
        per_layer = 4 * size + options.ffn_size + 2 * steps + 10
        forward = (options.num_layers + 2 * options.decoders) * per_layer
    return forward + 2 * vocab + steps * batch


def make_batch(
    sources: list[list[int]], targets: list[list[int] | None], source_len: int, target_len: int
) -> dict[str, np.ndarray]:
    """The arrays of one parallel_text batch (padding 0 after the tokens; a target None: a
    padding row, as a batch filled up with padding has)."""
    rows = len(sources)
    arrays = {
        name: np.zeros((rows, n))
        for name, n in zip(TRAINING_INPUTS, (source_len, target_len, target_len), strict=True)
    }
    for r, (src, tgt) in enumerate(zip(sources, targets, strict=True)):
        arrays["source"][r, : len(src)] = src
        if tgt is None:
            continue
        arrays["target"][r, : len(tgt) + 1] = [BOS, *tgt]
        arrays["target_label"][r, : len(tgt) + 1] = [*tgt, EOS]
    return arrays


def random_params(symbol: Any, shapes: dict[str, tuple], seed: int = 0) -> dict[str, np.ndarray]:
    """Random values for every parameter of ``symbol`` (layer-norm gains around 1)."""
    names, arg_shapes = symbol.list_arguments(), symbol.infer_shape(**shapes)[0]
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in zip(names, arg_shapes, strict=True):
        if name not in shapes:
            value = rng.uniform(-0.5, 0.5, shape)
            params[name] = value + 1 if name.endswith("_gamma") else value
    return params


def bind(symbol: Any, shapes: dict[str, tuple], params: dict, *, grads: bool = False) -> Any:
    """An executor of ``symbol`` on the CPU with ``params`` copied in (gradients of the
    parameters only, when asked)."""
    req = {n: ("write" if grads and n in params else "null") for n in symbol.list_arguments()}
    executor = symbol.simple_bind(mx.cpu(), grad_req=req, **shapes)
    for name, array in executor.arg_dict.items():
        if name in params:
            array[:] = params[name]
    return executor


def train_graph(builder: Any, options: Any, info: DataInfo, key: tuple[int, int], rows: int):
    symbol, data_names, label_names = builder(options, info)(key)
    assert (data_names, label_names) == (("source", "target"), ("target_label",))
    shapes = dict(
        zip(TRAINING_INPUTS, ((rows, key[0]), (rows, key[1]), (rows, key[1])), strict=True)
    )
    return symbol, shapes


def test_importing_and_listing_does_not_import_mxnet() -> None:
    code = (
        "import sys\n"
        "from mxtrain.registry import MODELS\n"
        "for name in ('rnn_seq2seq', 'transformer_seq2seq'):\n"
        "    MODELS.get(name).options_class()()\n"
        "assert 'mxnet' not in sys.modules, 'mxnet was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    ("cls", "bad", "says"),
    [
        (RnnSeq2SeqOptions, {"attention": "luong"}, "dot, general, mlp"),
        (RnnSeq2SeqOptions, {"num_hidden": 0}, "positive integer"),
        (RnnSeq2SeqOptions, {"encoder_hidden": 0}, "positive integer"),
        (RnnSeq2SeqOptions, {"dropout": 1.0}, r"\[0, 1\)"),
        (RnnSeq2SeqOptions, {"label_smoothing": 1.0}, r"\[0, 1\)"),
        (RnnSeq2SeqOptions, {"label_smoothing": True}, "number"),
        (RnnSeq2SeqOptions, {"tie_embeddings": "yes"}, "true or false"),
        (TransformerSeq2SeqOptions, {"num_heads": 3}, "divide model_size"),
        (TransformerSeq2SeqOptions, {"model_size": 7, "num_heads": 7}, "even"),
        (TransformerSeq2SeqOptions, {"decoder_layers": -1}, "positive integer"),
        (TransformerSeq2SeqOptions, {"ffn_size": 2**21}, "at most"),
        (TransformerSeq2SeqOptions, {"label_smoothing": -0.1}, r"\[0, 1\)"),
        (TransformerSeq2SeqOptions, {"share_embeddings": 1}, "true or false"),
    ],
)
def test_bad_options_name_the_key(cls, bad, says) -> None:
    key = "num_heads" if "num_heads" in bad and "model_size" not in bad else next(iter(bad))
    with pytest.raises(InvalidValue, match=says) as caught:
        cls(**bad)
    assert caught.value.key == key


@pytest.mark.parametrize("builder", [build_rnn_seq2seq, build_transformer_seq2seq])
def test_data_and_bucket_keys_are_checked(builder) -> None:
    options = RnnSeq2SeqOptions if builder is build_rnn_seq2seq else TransformerSeq2SeqOptions
    with pytest.raises(InvalidValue, match="vocab_size"):
        builder(options(), DataInfo())
    with pytest.raises(InvalidValue) as caught:
        builder(options(share_embeddings=True), INFO)
    assert caught.value.key == "share_embeddings" and "shared_vocab" in str(caught.value)
    sym_gen = builder(options(), INFO)
    for key in (7, (3,), (3, 0), (2, True), "3,4"):
        with pytest.raises(InvalidValue, match=r"\(source length, target length\)"):
            sym_gen(key)


@pytest.mark.parametrize(("name", "builder", "options", "info"), MODELS, ids=IDS)
@pytest.mark.parametrize(("source_len", "target_len"), [(5, 5), (7, 3), (1, 9)])
def test_shapes_of_the_three_graphs(name, builder, options, info, source_len, target_len) -> None:
    rows, max_steps = 3, 6
    sym_gen = builder(options, info)
    symbol, shapes = train_graph(builder, options, info, (source_len, target_len), rows)
    assert symbol.list_outputs() == ["softmax_output"]
    assert symbol.infer_shape(**shapes)[1] == [(rows * target_len, info.num_classes)]
    carried = sym_gen.input_shapes(source_len, rows, max_steps)
    encoder = sym_gen.encoder(source_len, max_steps)
    names = (*sym_gen.static_names, *sym_gen.state_names)
    produced = encoder.infer_shape(source=(rows, source_len))[1]
    assert produced == [carried[n] for n in names]
    assert carried["prev_token"] == (rows,) and carried["step"] == (1,)
    assert all(carried[n][0] == rows for n in names)  # batch on axis 0 for all
    step = sym_gen.decoder_step(source_len, max_steps)
    assert set(carried) <= set(step.list_arguments())
    step_outputs = step.infer_shape(**carried)[1]
    assert step_outputs == [(rows, info.num_classes), *(carried[n] for n in sym_gen.state_names)]


def test_encoder_hidden_sizes_each_direction_of_the_encoder() -> None:
    """encoder_hidden 3 of num_hidden 5: each direction's fused LSTM holds 4 gates of 3
    units (first layer over the 4-wide embedding, second over both directions' 6)."""
    options = RnnSeq2SeqOptions(encoder_hidden=3, **RNN_SMALL)
    encoder = build_rnn_seq2seq(options, INFO).encoder(4, 6)
    arg_shapes = encoder.infer_shape(source=(2, 4))[0]
    shapes = dict(zip(encoder.list_arguments(), arg_shapes, strict=True))
    gates, units = 4, 3
    assert shapes["encoder_l0_parameters"] == (gates * units * (4 + units) + 2 * gates * units,)
    assert shapes["encoder_l1_parameters"] == (gates * units * (6 + units) + 2 * gates * units,)
    assert shapes["encoder_proj_weight"] == (5, 6)  # both directions -> num_hidden


def _parameters(symbol: Any, inputs: typing.Iterable[str]) -> set[str]:
    return set(symbol.list_arguments()) - set(inputs)


@pytest.mark.parametrize(("name", "builder", "options", "info"), MODELS, ids=IDS)
def test_encoder_and_step_use_the_training_graphs_parameters(name, builder, options, info):
    sym_gen = builder(options, info)
    training = _parameters(sym_gen((4, 5))[0], TRAINING_INPUTS)
    encoder = _parameters(sym_gen.encoder(4, 6), ["source"])
    step = _parameters(sym_gen.decoder_step(4, 6), sym_gen.input_shapes(4, 2, 6))
    assert encoder | step == training
    assert "decoder_parameters" in step or "decoder0_self_query_weight" in step
    assert ("output_weight" in training) != options.tie_embeddings
    shared = "embed_weight" in training
    assert shared == options.share_embeddings
    assert shared or {"source_embed_weight", "target_embed_weight"} <= training


def step_by_step(sym_gen: Any, params: dict, batch: dict, max_steps: int) -> np.ndarray:
    """The log-probabilities of every target position from the encoder graph run once and
    the decoder-step graph run per position on its carried states, fed the batch's target
    tokens (teacher forcing): (N * T, V) in the training graph's row order."""
    rows, source_len = batch["source"].shape
    target_len = batch["target"].shape[1]
    encoder = bind(sym_gen.encoder(source_len, max_steps), {"source": (rows, source_len)}, params)
    outputs = encoder.forward(is_train=False, source=mx.nd.array(batch["source"]))
    names = (*sym_gen.static_names, *sym_gen.state_names)
    carried = {n: out.copy() for n, out in zip(names, outputs, strict=True)}
    shapes = sym_gen.input_shapes(source_len, rows, max_steps)
    step = bind(sym_gen.decoder_step(source_len, max_steps), shapes, params)
    log_probs = []
    for t in range(target_len):
        outputs = step.forward(
            is_train=False,
            prev_token=mx.nd.array(batch["target"][:, t]),
            step=mx.nd.array([t]),
            **carried,
        )
        log_probs.append(outputs[0].asnumpy())
        new_states = zip(sym_gen.state_names, outputs[1:], strict=True)
        carried.update((n, out.copy()) for n, out in new_states)
    return np.stack(log_probs, axis=1).reshape(rows * target_len, -1)


@pytest.mark.parametrize(("name", "builder", "options", "info"), MODELS, ids=IDS)
@pytest.mark.parametrize(("source_len", "target_len", "max_steps"), [(6, 5, 5), (5, 7, 9)])
def test_step_by_step_decoding_equals_the_training_graph(
    name, builder, options, info, source_len, target_len, max_steps
) -> None:
    """Teacher-forced steps give the training graph's log-probabilities at every position
    (padding included), whatever the cache size beyond the target length."""
    sym_gen = builder(options, info)
    symbol, shapes = train_graph(builder, options, info, (source_len, target_len), 3)
    params = random_params(symbol, shapes)
    batch = make_batch(SOURCES, TARGETS, source_len, target_len)
    training = bind(symbol, shapes, params)
    probs = training.forward(is_train=False, **{k: mx.nd.array(v) for k, v in batch.items()})
    expected = np.log(probs[0].asnumpy().astype(np.float64))
    got = step_by_step(sym_gen, params, batch, max_steps)
    vocab = info.num_classes
    assert_close_at_scale(got, expected, roundings=chain(options, source_len, max_steps, 3, vocab))


def _attention_reference(attention: str, params: dict, queries, memory, real) -> np.ndarray:
    """The attentional states tanh(W_c [context; h]) in float64, from the formulas of
    rnn_seq2seq's docstring (dot: h . m; general: h . W m; mlp: v . tanh(W h + b + U m))."""
    if attention == "dot":
        scores = np.einsum("nqh,nsh->nqs", queries, memory)
    elif attention == "general":
        keys = memory @ params["attention_key_weight"].T
        scores = np.einsum("nqh,nsh->nqs", queries, keys)
    else:
        keys = memory @ params["attention_key_weight"].T
        projected = queries @ params["attention_query_weight"].T + params["attention_query_bias"]
        energy = np.tanh(projected[:, :, None, :] + keys[:, None, :, :])
        scores = (energy @ params["attention_score_weight"].T)[..., 0]
    scores = np.where(real[:, None, :], scores, -np.inf)
    weights = np.exp(scores - scores.max(axis=2, keepdims=True))
    weights /= weights.sum(axis=2, keepdims=True)
    context = weights @ memory
    combined = np.concatenate([context, queries], axis=2)
    return np.tanh(combined @ params["attention_out_weight"].T)


@pytest.mark.parametrize("attention", ["dot", "general", "mlp"])
def test_attention_is_the_documented_formula(attention: str) -> None:
    """The attentional states of every scoring function against the formulas, padding masked
    (mlp computes v . tanh(x) as 2 v . sigmoid(2 x), the same softmax weights)."""
    options = RnnSeq2SeqOptions(attention=attention, **RNN_SMALL)
    sym_gen = build_rnn_seq2seq(options, INFO)
    rows, positions, hidden = 3, 2, RNN_SMALL["num_hidden"]
    source = np.array([[1, 2, 3, 4], [5, 6, 0, 0], [7, 0, 0, 0]], dtype=np.float32)
    queries, memory = mx.sym.var("queries"), mx.sym.var("memory")
    encoded = {"encoder_memory": memory, "source_bias": mx.sym.var("source_bias")}
    if attention != "dot":
        encoded["attention_keys"] = sym_gen._attention_keys(memory)
    symbol = sym_gen._attentional(queries, encoded)
    shapes = {
        "queries": (rows, positions, hidden),
        "memory": (rows, source.shape[1], hidden),
        "source_bias": source.shape,
    }
    params = random_params(symbol, shapes, seed=3)
    executor = bind(symbol, shapes, params)
    rng = np.random.default_rng(4)
    values = {n: rng.uniform(-1, 1, shapes[n]) for n in ("queries", "memory")}
    bias = (source == 0) * MASKED_SCORE
    got = executor.forward(
        is_train=False,
        source_bias=mx.nd.array(bias),
        **{n: mx.nd.array(v) for n, v in values.items()},
    )[0].asnumpy()
    want = _attention_reference(attention, params, values["queries"], values["memory"], source != 0)
    # dots over H and 2H values, the softmax over S positions, and the nonlinearities
    assert_close_at_scale(got, want, roundings=8 * hidden + 4 * source.shape[1] + 20)


def gradients(builder: Any, options: Any, info: DataInfo, key: tuple, sources, targets):
    symbol, shapes = train_graph(builder, options, info, key, len(sources))
    params = random_params(symbol, shapes, seed=1)
    executor = bind(symbol, shapes, params, grads=True)
    batch = make_batch(sources, targets, *key)
    executor.forward(is_train=True, **{k: mx.nd.array(v) for k, v in batch.items()})
    executor.backward()
    out = executor.outputs[0].asnumpy().reshape(len(sources), key[1], -1)
    grads = {n: g.asnumpy().copy() for n, g in executor.grad_dict.items() if g is not None}
    return out, grads


@pytest.mark.parametrize(("name", "builder", "options", "info"), UNTIED, ids=[m[0] for m in UNTIED])
def test_padding_gives_no_gradient(name, builder, options, info) -> None:
    """Padding changes neither an output at a real position nor any gradient: a longer
    bucket and an all-padding row give the same gradients, and the padding id's embedding
    rows get exactly none (pad source positions are masked out of attention, pad target
    positions only feed later pad positions, whose labels are ignored)."""
    short_out, short = gradients(builder, options, info, (5, 5), SOURCES, TARGETS)
    long_out, long = gradients(builder, options, info, (8, 7), [*SOURCES, []], [*TARGETS, None])
    for r, target in enumerate(TARGETS):
        n = len(target) + 1
        roundings = chain(options, 8, 7, 4, info.num_classes)
        assert_close_at_scale(long_out[r, :n], short_out[r, :n], roundings=roundings)
    # at the scale of all gradients: some are zero but for rounding (a key bias adds the same
    # to every score of a softmax), what is left of the larger terms that cancel in them
    scale = max(float(np.abs(grad).max()) for grad in short.values())
    atol = 2 * gamma(chain(options, 8, 7, 4, info.num_classes)) * scale
    for param, grad in short.items():
        np.testing.assert_allclose(long[param], grad, rtol=0, atol=atol, err_msg=param)
    for grads in (short, long):
        for side in ("source", "target"):
            embedding = grads[f"{side}_embed_weight"]
            assert not embedding[0].any(), f"{side} padding row has a gradient"
            assert embedding[4].any(), f"{side} token 4 has no gradient"


@pytest.mark.parametrize("alpha", [0.0, 0.1, 0.3])
def test_label_smoothing_gradient_is_that_of_the_smoothed_cross_entropy(alpha) -> None:
    """Backward sends d/dlogits of -sum over non-pad rows of sum_k q_k log p_k, q the
    smoothed target (1 - alpha at the label, alpha / (V - 1) at every other class), which is
    p - q; pad rows get nothing. The forward output stays the probabilities."""
    vocab, labels = 7, np.array([3, 0, 6, 1, 0, 5])
    logits = np.random.default_rng(2).normal(size=(len(labels), vocab))
    head = smoothed_softmax_loss(mx.sym.Variable("logits"), mx.sym.Variable("label"), 0, alpha)
    executor = head.simple_bind(
        mx.cpu(),
        grad_req={"logits": "write", "label": "null"},
        logits=logits.shape,
        label=labels.shape,
    )
    executor.forward(is_train=True, logits=mx.nd.array(logits), label=mx.nd.array(labels))
    executor.backward()
    exp = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs = exp / exp.sum(axis=1, keepdims=True)
    target = np.full_like(probs, alpha / (vocab - 1))
    target[np.arange(len(labels)), labels] = 1 - alpha
    valid = labels != 0
    expected = (probs - target) * valid[:, None]
    roundings = 2 * vocab + 8  # the softmax's two passes, the subtraction and the scaling
    assert_close_at_scale(executor.outputs[0].asnumpy(), probs, roundings=roundings)
    assert_close_at_scale(executor.grad_dict["logits"].asnumpy(), expected, roundings=roundings)
    assert not executor.grad_dict["logits"].asnumpy()[~valid].any()


@pytest.mark.parametrize(
    ("builder", "options"),
    [
        (build_rnn_seq2seq, RnnSeq2SeqOptions(dropout=0.2, **RNN_SMALL)),
        (
            build_transformer_seq2seq,
            TransformerSeq2SeqOptions(**{**TRANSFORMER_SMALL, "dropout": 0.2}),
        ),
    ],
)
def test_trains_in_our_bucketing_module_with_two_buckets(builder, options) -> None:
    """Tuple bucket keys, dropout, and the perplexity metric reading output 0."""
    sym_gen = builder(options, INFO)
    module = BucketingModule(sym_gen, (6, 5), mx.cpu())
    module.bind(
        [mx.io.DataDesc("source", (3, 6)), mx.io.DataDesc("target", (3, 5))],
        [mx.io.DataDesc("target_label", (3, 5))],
    )
    mx.random.seed(0)
    module.init_params(mx.init.Xavier())
    module.init_optimizer(optimizer="adam", optimizer_params={"learning_rate": 0.05})
    first = last = None
    for step in range(16):
        key = (6, 5) if step % 2 else (5, 5)
        arrays = make_batch(SOURCES, TARGETS, *key)
        batch = mx.io.DataBatch(
            [mx.nd.array(arrays["source"]), mx.nd.array(arrays["target"])],
            [mx.nd.array(arrays["target_label"])],
            bucket_key=key,
            provide_data=[
                mx.io.DataDesc("source", (3, key[0])),
                mx.io.DataDesc("target", (3, key[1])),
            ],
            provide_label=[mx.io.DataDesc("target_label", (3, key[1]))],
        )
        module.forward(batch, is_train=True)
        metric = DevicePerplexity(pad_id=0)
        metric.update(batch.label, module.get_outputs())
        value = metric.get()["perplexity"]
        first = value if first is None else first
        last = value
        module.backward()
        module.update()
    assert set(module.bucket_keys) == {(6, 5), (5, 5)}
    assert last < first / 2, (first, last)


CHECK_CONFIG = """\
experiment: {{name: s2s, runs_dir: runs}}
model:
{model}
data:
  train:
{data}
optimizer: {{name: adam, learning_rate: 0.001}}
"""
PARALLEL_DATA = (
    "    iterator: parallel_text\n    source: train.src\n    target: train.tgt\n"
    "    tokens: chars\n    batch_size: 4\n"
)
SENTENCE_DATA = "    iterator: bucket_sentence\n    source: train.txt\n    batch_size: 4\n"
CHECKED_MODELS = {
    "rnn_seq2seq": "  name: rnn_seq2seq\n  attention: general\n  num_hidden: 16\n",
    "transformer_seq2seq": "  name: transformer_seq2seq\n  model_size: 16\n  num_heads: 4\n",
}


def _check(tmp_path: Path, model: str, data: str, *sets: str) -> Any:
    for name in ("train.src", "train.tgt", "train.txt"):
        (tmp_path / name).write_text("a b\nc d\n")
    path = tmp_path / "s2s.yaml"
    path.write_text(CHECK_CONFIG.format(model=model.rstrip("\n"), data=data.rstrip("\n")))
    args = ["check", str(path), "--explain"]
    for item in sets:
        args += ["--set", item]
    return CliRunner().invoke(cli, args, catch_exceptions=False)


@pytest.mark.parametrize("model", sorted(CHECKED_MODELS))
def test_check_explains_every_option_and_names_a_bad_one(tmp_path: Path, model: str) -> None:
    result = _check(tmp_path, CHECKED_MODELS[model], PARALLEL_DATA)
    assert result.exit_code == 0, result.output
    options = {"rnn_seq2seq": RnnSeq2SeqOptions, "transformer_seq2seq": TransformerSeq2SeqOptions}
    for field in dataclasses.fields(options[model]):  # every key is explained
        assert f"model.{field.name} " in result.output and field.metadata["doc"] in result.output
    bad = {"rnn_seq2seq": "model.attention=luong", "transformer_seq2seq": "model.num_heads=3"}
    result = _check(tmp_path, CHECKED_MODELS[model], PARALLEL_DATA, bad[model])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert bad[model].split("=")[0] in result.output


@pytest.mark.parametrize("model", sorted(CHECKED_MODELS))
def test_check_refuses_a_model_and_an_iterator_that_do_not_pair(tmp_path: Path, model: str) -> None:
    """A seq2seq model on single sequences, or pairs for a language model: refused by check,
    at data.train.iterator's line, not deep inside fit."""
    result = _check(tmp_path, CHECKED_MODELS[model], SENTENCE_DATA)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "trains on (source, target) pairs" in result.output and "parallel_text" in result.output
    result = _check(tmp_path, "  name: lstm_lm\n", PARALLEL_DATA)
    assert result.exit_code == 2 and "which model lstm_lm does not take" in result.output


@pytest.mark.skipif(
    "parallel_text" not in ITERATORS.available(), reason="the parallel_text iterator is not here"
)
@pytest.mark.parametrize("model", sorted(CHECKED_MODELS))
def test_check_accepts_a_parallel_text_config(tmp_path: Path, model: str) -> None:
    result = _check(tmp_path, CHECKED_MODELS[model], PARALLEL_DATA)
    assert result.exit_code == 0, result.output
    assert "data.train.target" in result.output
