"""Language-model generation's step models (mxtrain.inference.generate) on small random LMs:
carrying the recurrent state gives the log-probabilities of recomputing the prefix and of the
sentence graph the model trains with."""

from __future__ import annotations

import dataclasses

import mxnet as mx
import numpy as np
import pytest

from mxtrain.data.base import TASK_LM, DataInfo
from mxtrain.decoding.search import Hypothesis
from mxtrain.inference.generate import GeneratedText, LmGenerator, lm_inputs
from mxtrain.models.language_model_options import GruLmOptions, LstmLmOptions
from mxtrain.models.rnn_common import build_rnn_lm

VOCAB = 11
INFO = DataInfo(vocab_size=VOCAB, num_classes=VOCAB, pad_id=0, task=TASK_LM)
EPS = float(np.finfo(np.float32).eps)


def model(kind: str, cell: str):
    if kind == "lstm":
        options = LstmLmOptions(num_embed=6, num_hidden=7, num_layers=2, cell=cell)
    else:
        options = GruLmOptions(num_embed=6, num_hidden=7, num_layers=2, cell=cell)
    stream = build_rnn_lm(options, dataclasses.replace(INFO, stream=True), model="lm", mode=kind)
    plain = build_rnn_lm(options, INFO, model="lm", mode=kind)
    symbol = plain(5)[0]
    arg_shapes, _, _ = symbol.infer_shape(data=(2, 5), softmax_label=(2, 5))
    rng = np.random.default_rng(0)
    params = {
        name: mx.nd.array(rng.uniform(-0.8, 0.8, shape))
        for name, shape in zip(symbol.list_arguments(), arg_shapes, strict=True)
        if name not in ("data", "softmax_label")
    }
    return stream, plain, params


def sentence_log_probs(plain, params, tokens: np.ndarray) -> np.ndarray:
    """(rows, T, V) log-probabilities of the sentence graph (zero begin states) on ``tokens``."""
    rows, length = tokens.shape
    symbol = plain(length)[0]
    args = {**params, **{k: mx.nd.array(v) for k, v in lm_inputs(tokens).items()}}
    executor = symbol.bind(mx.cpu(), args=args, grad_req="null")
    probs = executor.forward(is_train=False)[0].asnumpy().reshape(rows, length, -1)
    return np.log(np.maximum(probs.astype(np.float64), 1e-30))


CASES = [("lstm", "fused"), ("lstm", "unfused"), ("gru", "fused"), ("gru", "unfused")]


@pytest.mark.parametrize(("kind", "cell"), CASES)
def test_carried_state_gives_the_sentence_graph_log_probs(kind: str, cell: str) -> None:
    stream, plain, params = model(kind, cell)
    generator = LmGenerator(stream, params, {}, mx.cpu())
    assert generator.carries_state
    rng = np.random.default_rng(1)
    prompts = rng.integers(1, VOCAB, size=(3, 4))
    later = rng.integers(1, VOCAB, size=(3, 5))  # the tokens fed after the prompt
    whole = np.concatenate([prompts, later], axis=1)
    expected = sentence_log_probs(plain, params, whole)[:, 3:, :]  # after each prompt on
    # float32 through a 2-layer recurrence of 9 positions; every value is a sum of at most
    # 4 * 7 + 6 products per gate, layer and position: rounding below 9 * 2 * 64 eps each
    bound = 9 * 2 * 64 * EPS
    for carry in (True, False):
        steps = generator.steps(prompts.astype(np.float32), 1, carry_state=carry)
        prev = prompts[:, -1]
        for position in range(later.shape[1] + 1):
            got = steps.step(prev, position).full()
            assert np.abs(got - expected[:, position, :]).max() <= bound * (
                1 + np.abs(expected[:, position, :]).max()
            )
            if position < later.shape[1]:
                prev = later[:, position]


@pytest.mark.parametrize(("kind", "cell"), [("lstm", "fused"), ("gru", "unfused")])
def test_reordered_beams_follow_their_rows(kind: str, cell: str) -> None:
    """Two prompts, 2 rows each; after a reorder each row continues from its new parent, as
    recomputing that parent's prefix does (fused states have the batch on axis 1)."""
    stream, _, params = model(kind, cell)
    generator = LmGenerator(stream, params, {}, mx.cpu())
    prompts = np.array([[3, 4, 5], [6, 7, 8]], dtype=np.float32)
    carried = generator.steps(prompts, 2, carry_state=True)
    recomputed = generator.steps(prompts, 2, carry_state=False)
    feeds = [np.array([5, 5, 8, 8]), np.array([1, 2, 3, 4]), np.array([9, 10, 2, 1])]
    orders = [np.array([1, 0, 3, 2]), np.array([1, 1, 2, 2])]
    for position, feed in enumerate(feeds):
        a = carried.step(feed, position).full()
        b = recomputed.step(feed, position).full()
        assert np.abs(a - b).max() <= 4 * 2 * 64 * EPS * (1 + np.abs(b).max())
        if position < len(orders):
            carried.reorder(orders[position])
            recomputed.reorder(orders[position])


def test_generated_text_records_and_totals() -> None:
    hyps = [
        [Hypothesis((4, 5), -1.5, -1.2, True), Hypothesis((4,), -2.0, -1.9, False)],
        None,
    ]
    text = GeneratedText(["a b", None], hyps, [["c d", "c"], None], nbest=2)
    records = list(text.records())
    assert records[0] == {
        "line": 1,
        "prompt": "a b",
        "output": "c d",
        "tokens": 2,
        "log_likelihood": -1.5,
        "nbest": [
            {"output": "c d", "tokens": 2, "log_likelihood": -1.5, "score": -1.2},
            {"output": "c", "tokens": 1, "log_likelihood": -2.0, "score": -1.9},
        ],
    }
    assert records[1]["output"] is None and records[1]["nbest"] is None
    # totals: the best hypotheses' tokens with <eos> (3) and their log-likelihood
    assert text.totals() == (2, 1, 3, -1.5)
