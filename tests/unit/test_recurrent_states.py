"""Recurrent state carried from batch to batch (BucketingModule ``states``)."""

from __future__ import annotations

import mxnet as mx
import numpy as np
import pytest

from mxtrain.data.base import DataInfo
from mxtrain.engine.bucketing import BucketingModule
from mxtrain.models.language_model_options import LmOptions, LstmLmOptions
from mxtrain.models.language_models import build_lstm_lm

VOCAB = 23
ROWS = 4


class _Batch:
    def __init__(self, data: np.ndarray, reset: bool = False) -> None:
        rows, length = data.shape
        self.data = [mx.nd.array(data)]
        label = np.roll(data, -1, axis=1)
        self.label = [mx.nd.array(label)]
        self.bucket_key = length
        self.provide_data = [mx.io.DataDesc("data", (rows, length), layout="NT")]
        self.provide_label = [mx.io.DataDesc("softmax_label", (rows, length), layout="NT")]
        self.pad = 0
        self.reset_states = reset


def _module(
    longest: int, *, fused: bool = True, devices: int = 1, stream: bool = True, for_training=False
) -> BucketingModule:
    options = LstmLmOptions(
        num_embed=6, num_hidden=5, num_layers=2, cell="fused" if fused else "unfused"
    )
    info = DataInfo(vocab_size=VOCAB, num_classes=VOCAB, pad_id=0, task="lm", stream=stream)
    sym_gen = build_lstm_lm(options, info)
    module = BucketingModule(
        sym_gen,
        longest,
        [mx.cpu(i) for i in range(devices)],
        states=getattr(sym_gen, "states", None),
    )
    shapes = [mx.io.DataDesc("data", (ROWS, longest), layout="NT")]
    labels = [mx.io.DataDesc("softmax_label", (ROWS, longest), layout="NT")]
    module.bind(shapes, labels, for_training=for_training)
    mx.random.seed(3)
    module.init_params(mx.init.Uniform(0.5))
    return module


def _probs(module: BucketingModule, batch: _Batch) -> np.ndarray:
    module.forward(batch, is_train=False)
    rows, length = batch.data[0].shape
    return module.get_outputs()[0].asnumpy().reshape(rows, length, VOCAB)


@pytest.mark.parametrize(("fused", "devices"), [(True, 1), (False, 1), (True, 2)])
def test_carried_state_equals_one_long_batch(fused: bool, devices: int) -> None:
    steps, pieces = 5, 4
    text = np.random.default_rng(0).integers(1, VOCAB, size=(ROWS, steps * pieces))
    module = _module(steps * pieces, fused=fused, devices=devices)
    assert module.state_names  # the stream LM has begin-state inputs
    whole = _probs(module, _Batch(text, reset=True))
    parts = [
        _probs(module, _Batch(text[:, i * steps : (i + 1) * steps], reset=i == 0))
        for i in range(pieces)
    ]
    np.testing.assert_allclose(np.concatenate(parts, axis=1), whole, rtol=1e-5, atol=1e-6)


def test_reset_starts_from_zero_states() -> None:
    text = np.random.default_rng(1).integers(1, VOCAB, size=(ROWS, 6))
    module = _module(6)
    first = _probs(module, _Batch(text, reset=True))
    carried = _probs(module, _Batch(text))
    assert not np.allclose(first, carried)  # the second batch started from the first's end
    again = _probs(module, _Batch(text, reset=True))
    np.testing.assert_array_equal(first, again)
    module.reset_states()
    np.testing.assert_array_equal(first, _probs(module, _Batch(text)))


def test_zero_state_stream_model_equals_sentence_model() -> None:
    """A stream LM's first batch (zero states) computes what the sentence LM computes."""
    text = np.random.default_rng(2).integers(1, VOCAB, size=(ROWS, 7))
    stream = _probs(_module(7), _Batch(text, reset=True))
    sentences = _probs(_module(7, stream=False), _Batch(text))
    np.testing.assert_array_equal(stream, sentences)


def test_states_round_trip_and_separate_block() -> None:
    text = np.random.default_rng(3).integers(1, VOCAB, size=(ROWS, 4))
    module = _module(4, devices=2)
    _probs(module, _Batch(text, reset=True))
    saved = module.get_states()
    assert sorted(saved) == sorted(f"{n}@{k}" for n in module.state_names for k in range(2))
    expected = _probs(module, _Batch(text))
    with module.separate_states():
        _probs(module, _Batch(text[::-1].copy(), reset=True))
    module.set_states(saved)
    np.testing.assert_array_equal(_probs(module, _Batch(text)), expected)
    with pytest.raises(ValueError, match="does not fit"):
        module.set_states({"nope@0": saved[next(iter(saved))]})


def test_states_get_no_gradient_and_are_not_parameters() -> None:
    module = _module(5, for_training=True)
    assert not set(module.state_names) & set(module.param_names)
    text = np.random.default_rng(4).integers(1, VOCAB, size=(ROWS, 5))
    module.forward_backward(_Batch(text, reset=True))
    module.forward_backward(_Batch(text))  # the carried state is an input without a gradient
    assert all(module.grad_array(n) is not None for n in module.param_names)


def test_tie_weights_shares_the_embedding() -> None:
    options = LmOptions(num_embed=5, num_hidden=5, num_layers=1, tie_weights=True)
    info = DataInfo(vocab_size=VOCAB, num_classes=VOCAB, pad_id=0, task="lm")
    symbol, _, _ = build_lstm_lm(LstmLmOptions(**options.__dict__), info)(6)
    args = symbol.list_arguments()
    assert "embed_weight" in args and "pred_weight" not in args
    with pytest.raises(ValueError, match="num_embed == num_hidden"):
        LmOptions(num_embed=6, num_hidden=5, tie_weights=True)
