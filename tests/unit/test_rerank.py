"""Reranking a beam's candidates with further models (``--rerank``): the teacher-forced log
probabilities of given outputs (mxtrain.decoding.seq2seq.forced_log_probs) and the ranking by
their mean (mxtrain.decoding.search.rerank), checked by hand on the copy model of test_decode
and on a copy model read right to left."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_decode import COPY_VOCAB, CopySymGen

from mxtrain.decoding.search import DecodeOptions, Hypothesis, length_penalty, rerank

V = len(COPY_VOCAB)
EOS = COPY_VOCAB.index("<eos>")
W, X, Y, Z = (COPY_VOCAB.index(t) for t in "wxyz")


def hyp(tokens: tuple[int, ...], log_prob: float, ended: bool = True) -> Hypothesis:
    length = len(tokens) + (1 if ended else 0)
    return Hypothesis(tokens, log_prob, log_prob / float(length_penalty(length, 1.0)), ended)


def test_rerank_ranks_by_the_mean_log_probability_over_the_length_penalty() -> None:
    first, second, third = hyp((W,), -1.0), hyp((X, Y), -2.0), hyp((Z,), -3.0, ended=False)
    others = [[-5.0, -1.0, -0.5], [-4.0, -2.0, -0.5]]  # two further models
    ranked = rerank([first, second, third], others, alpha=0.0, nbest=3)
    means = [(-1 - 5 - 4) / 3, (-2 - 1 - 2) / 3, (-3 - 0.5 - 0.5) / 3]
    assert [h.tokens for h in ranked] == [(Z,), (X, Y), (W,)]
    assert [h.log_prob for h in ranked] == pytest.approx([means[2], means[1], means[0]])
    assert [h.ended for h in ranked] == [False, True, True]
    # alpha 1: the score divides the mean by ((5 + length) / 6), <eos> counted
    ranked = rerank([first, second, third], others, alpha=1.0, nbest=2)
    scores = [m / ((5 + n) / 6) for m, n in zip(means, (2, 3, 1), strict=True)]
    best = sorted(range(3), key=lambda k: -scores[k])[:2]
    assert [h.score for h in ranked] == pytest.approx([scores[k] for k in best])
    assert len(ranked) == 2
    # ties keep the beam's order; no further model leaves the order as it was
    tied = rerank([first, hyp((X,), -1.0)], [[-2.0, -2.0]], alpha=1.0, nbest=2)
    assert [h.tokens for h in tied] == [(W,), (X,)]
    assert rerank([first, second], [], alpha=1.0, nbest=2) == [first, second]


def bound(gain: float, *, reverse: bool = False):
    import mxnet as mx

    from mxtrain.decoding.seq2seq import DecoderModel, decoder_graphs
    from mxtrain.engine.graph_runner import GraphRunner

    sym_gen = CopySymGen(V, EOS)
    params = {"out_weight": mx.nd.array(np.eye(V) * gain)}
    runner = GraphRunner(decoder_graphs(sym_gen), params, {}, mx.cpu())
    return DecoderModel(runner, sym_gen, reverse_target=reverse)


def info():
    from mxtrain.data.base import Seq2SeqInfo

    return Seq2SeqInfo(vocab_size=V, num_classes=V, pad_id=0)


def copy_log_prob(gain: float, source: list[int], output: list[int]) -> float:
    """ln p of ``output`` under the copy model: position p predicts source[p] (<eos> from
    the source's end on) with logit ``gain``, every other token logit 0."""
    norm = math.log(math.exp(gain) + V - 1)
    wanted = [t for t in source if t]
    return sum(
        (gain if token == (wanted[p] if p < len(wanted) else EOS) else 0.0) - norm
        for p, token in enumerate(output)
    )


def test_forced_log_probs_sum_each_candidates_tokens_and_its_eos() -> None:
    from mxtrain.decoding.seq2seq import forced_log_probs

    gain = 3.0
    source = np.array([[W, X, Y], [Z, 0, 0]], dtype=np.float32)
    candidates = [[(W, X, Y), (W, Z), (Y,)], [(Z,), (W, W, W, W)]]
    ended = [[True, True, False], [True, False]]
    got = forced_log_probs([bound(gain)], info(), source, candidates, ended, rows=3, max_steps=8)
    assert [len(row) for row in got] == [3, 2]  # a row's missing candidates are not scored
    for r, row in enumerate(candidates):
        src = [int(t) for t in source[r]]
        for k, tokens in enumerate(row):
            output = [*tokens, EOS] if ended[r][k] else list(tokens)
            expected = copy_log_prob(gain, src, output)
            # float32 log-softmax terms of size ~1: a few float32 eps per position
            assert abs(got[r][k] - expected) < 1e-5 * (len(output) + 1), (r, k)


def test_the_beams_own_candidates_score_their_log_prob_when_forced() -> None:
    from mxtrain.decoding.seq2seq import decode_sources, forced_log_probs

    model = bound(1.5)  # unsure: the beam holds different candidates
    source = np.array([[W, X, Y], [Z, W, 0]], dtype=np.float32)
    options = DecodeOptions(beam_size=4, nbest=4)
    hyps = decode_sources([model], info(), options, source)
    candidates = [[h.tokens for h in row] for row in hyps]
    ended = [[h.ended for h in row] for row in hyps]
    got = forced_log_probs([model], info(), source, candidates, ended, rows=4, max_steps=16)
    for row, scores in zip(hyps, got, strict=True):
        assert len(row) == 4
        for h, forced in zip(row, scores, strict=True):
            assert abs(forced - h.log_prob) < 1e-5 * (h.length + 1)


def test_a_right_to_left_reranker_reads_each_candidate_backwards() -> None:
    """The main model copies the source (W X Y); a surer right-to-left copy model prefers the
    candidate whose reversal is the source (Y X W): the mean of the two picks it."""
    from mxtrain.decoding.seq2seq import rerank_sources

    main_gain, other_gain = 1.0, 6.0
    source = np.array([[W, X, Y]], dtype=np.float32)
    candidates = [(W, X, Y), (Y, X, W)]
    src = [W, X, Y]
    own = [copy_log_prob(main_gain, src, [*c, EOS]) for c in candidates]
    beam = [[hyp(c, lp) for c, lp in zip(candidates, own, strict=True)]]
    options = DecodeOptions(beam_size=2, nbest=2, length_penalty=1.0)
    reranker = bound(other_gain, reverse=True)
    main = [bound(main_gain)]  # its forced log-probabilities are those of the beam above
    ranked = rerank_sources(main, [reranker], info(), options, source, beam, max_steps=8)[0]
    theirs = [copy_log_prob(other_gain, src, [*c[::-1], EOS]) for c in candidates]
    means = [(a + b) / 2 for a, b in zip(own, theirs, strict=True)]
    assert means[1] > means[0]  # what the test is about: the reranker turns the order
    assert [h.tokens for h in ranked] == [(Y, X, W), (W, X, Y)]
    assert [h.log_prob for h in ranked] == pytest.approx([means[1], means[0]], abs=1e-4)
    # read left to right, the same model agrees with the main one: the order stays
    same_way = rerank_sources(main, [bound(other_gain)], info(), options, source, beam, 8)
    assert [h.tokens for h in same_way[0]] == [(W, X, Y), (Y, X, W)]
    # nbest 1 keeps the best only
    one = rerank_sources(main, [reranker], info(), DecodeOptions(beam_size=2), source, beam, 8)
    assert [h.tokens for h in one[0]] == [(Y, X, W)]


def test_decode_sources_with_a_reranker_returns_the_nbest_asked() -> None:
    from mxtrain.decoding.seq2seq import decode_sources

    model = bound(1.5)
    source = np.array([[W, X, Y], [Z, W, 0]], dtype=np.float32)
    alone = decode_sources([model], info(), DecodeOptions(beam_size=4, nbest=2), source)
    # the model reranking its own candidates: the mean of two equal log-probabilities
    itself = decode_sources(
        [model], info(), DecodeOptions(beam_size=4, nbest=2), source, rerankers=[bound(1.5)]
    )
    assert [len(r) for r in itself] == [2, 2]
    for a, b in zip(alone, itself, strict=True):
        # the same scores, best first (candidates of equal log-probability may swap: their
        # forced values differ from the beam's by float rounding)
        assert [h.score for h in b] == pytest.approx([h.score for h in a], abs=1e-5)
        for h in b:
            match = [g for g in a if g.tokens == h.tokens]
            assert not match or abs(match[0].log_prob - h.log_prob) < 1e-5 * (h.length + 1)


def test_a_pool_adds_the_rerankers_own_candidates_scored_by_every_model() -> None:
    """The right-to-left copy model searches too; its best (the source backwards, read back:
    Y X W) joins the main model's beam, and every candidate's log-probability is the mean of
    each model's forced one."""
    from mxtrain.decoding.seq2seq import decode_sources

    main_gain, other_gain = 1.0, 6.0
    source = np.array([[W, X, Y]], dtype=np.float32)
    main, other = bound(main_gain), bound(other_gain, reverse=True)
    options = DecodeOptions(beam_size=2, nbest=2)
    searched = decode_sources([main], info(), options, source)[0]
    assert (Y, X, W) not in [h.tokens for h in searched]  # the main beam misses it
    pooled = decode_sources([main], info(), options, source, rerankers=[other])[0]
    assert pooled[0].tokens == (Y, X, W)
    src = [W, X, Y]
    for h in pooled:
        output = [*h.tokens, EOS]
        mean = (copy_log_prob(main_gain, src, output) + copy_log_prob(other_gain, src,
                [*h.tokens[::-1], EOS])) / 2  # fmt: skip
        assert abs(h.log_prob - mean) < 1e-5 * (len(output) + 1)
