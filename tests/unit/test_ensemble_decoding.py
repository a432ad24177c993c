"""Decoding with an ensemble (mxtrain.decoding.seq2seq.EnsembleSteps): the mean of the models'
probabilities at each step, checked by hand on two copy models that disagree."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_decode import COPY_VOCAB, CopySymGen

from mxtrain.decoding.search import DecodeOptions

V = len(COPY_VOCAB)
EOS = COPY_VOCAB.index("<eos>")
W, X, Y, Z = (COPY_VOCAB.index(t) for t in "wxyz")
#: the second model's choice for each token the copy model would write: the next regular
#: token (w -> x -> y -> z -> w); <eos> and the reserved ids map to themselves
SHIFT = {W: X, X: Y, Y: Z, Z: W}


def weights(gain: float, mapping: dict[int, int]):
    """out_weight of a CopySymGen that writes ``mapping[t]`` where the source has ``t``."""
    import mxnet as mx

    table = np.zeros((V, V), dtype=np.float32)
    for token in range(V):
        table[mapping.get(token, token), token] = gain
    return {"out_weight": mx.nd.array(table)}


def decode(param_sets, source: list[list[int]], options: DecodeOptions):
    import mxnet as mx

    from mxtrain.data.base import Seq2SeqInfo
    from mxtrain.decoding.seq2seq import DecoderModel, decode_sources, decoder_graphs
    from mxtrain.engine.graph_runner import GraphRunner

    info = Seq2SeqInfo(vocab_size=V, num_classes=V, pad_id=0)
    sym_gen = CopySymGen(V, info.eos_id)
    models = [
        DecoderModel(GraphRunner(decoder_graphs(sym_gen), params, {}, mx.cpu()), sym_gen)
        for params in param_sets
    ]
    ids = np.asarray(source, dtype=np.float32)
    return decode_sources(models, info, options, ids)


def chosen_probability(gain: float) -> float:
    """p of the token a gain-``gain`` model picks (one logit ``gain`` among V - 1 zeros)."""
    return math.exp(gain) / (math.exp(gain) + V - 1)


def other_probability(gain: float) -> float:
    return 1.0 / (math.exp(gain) + V - 1)


@pytest.mark.parametrize("beam", [1, 3])
def test_two_models_decode_with_the_mean_of_their_probabilities(beam: int) -> None:
    copy_gain, shift_gain = 3.0, 4.0  # the shift model is the surer: its tokens win
    params = [weights(copy_gain, {}), weights(shift_gain, SHIFT)]
    (best, *_), (other, *_) = decode(params, [[W, X, 0], [Z, Z, Y]], DecodeOptions(beam_size=beam))
    assert [COPY_VOCAB[t] for t in best.tokens] == ["x", "y"]
    assert [COPY_VOCAB[t] for t in other.tokens] == ["w", "w", "z"]
    # each output token: (p_copy(it) + p_shift(it)) / 2 with p_copy(it) the "other" probability;
    # <eos>: both models choose it
    token = (other_probability(copy_gain) + chosen_probability(shift_gain)) / 2
    end = (chosen_probability(copy_gain) + chosen_probability(shift_gain)) / 2
    for hyp, length in ((best, 2), (other, 3)):
        expected = length * math.log(token) + math.log(end)
        # float32 log-probabilities of size ~1: a few float32 eps per term
        assert abs(hyp.log_prob - expected) < 1e-5 * (length + 1)


def test_a_model_in_an_ensemble_with_itself_decodes_as_alone() -> None:
    params = weights(3.0, {})
    source = [[W, X, Y], [Z, 0, 0]]
    for options in (DecodeOptions(beam_size=1), DecodeOptions(beam_size=4, nbest=3)):
        alone = decode([params], source, options)
        twice = decode([params, weights(3.0, {})], source, options)
        for a, b in zip(alone, twice, strict=True):
            assert [h.tokens for h in a] == [h.tokens for h in b]
            # log(mean(exp(l - l))) = log(1) = 0 exactly: the same float32 values
            assert [h.log_prob for h in a] == [h.log_prob for h in b]


def test_mean_probabilities_stays_finite_where_every_model_finds_a_token_unlikely() -> None:
    import mxnet as mx

    from mxtrain.decoding.seq2seq import mean_probabilities

    first = np.array([[-1000.0, -0.1, -2.0]], dtype=np.float32)
    second = np.array([[-1002.0, -3.0, -0.05]], dtype=np.float32)
    mixed = mean_probabilities([mx.nd.array(first), mx.nd.array(second)]).asnumpy()
    exact = np.logaddexp(first.astype(np.float64), second.astype(np.float64)) - math.log(2)
    assert np.isfinite(mixed).all()
    # float32 arithmetic on values up to ~1000: a few eps of 1000
    np.testing.assert_allclose(mixed, exact, rtol=0, atol=1e-3)
    assert mixed[0, 0] < -999  # not rounded to -inf, not lifted either
