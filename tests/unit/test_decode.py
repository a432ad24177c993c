"""Beam search, greedy decoding and sampling (mxtrain.decoding.search) on NumPy fake models
whose per-step distributions are written down here, so every expected result is computed by
hand in the comments."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pytest

from mxtrain.decoding.search import (
    DecodeOptions,
    Sampler,
    beam_search,
    decode,
    greedy_chooser,
    length_penalty,
    max_output_lengths,
    token_by_token,
)

PAD, A, EOS, BOS, B = 0, 1, 2, 3, 4  # ids: <pad>, "A", <eos>, <bos>, "B"
BANNED = (PAD, BOS)
# The sums below are of up to 4 float64 logs of float32-exact inputs: far inside 1e-12.
TOL = 1e-12

# After each prefix, the next token's probabilities (A, EOS, B); <pad> and <bos> get 0, which
# the searches never pick (banned). A prefix not listed: the DEFAULT row.
DEFAULT = {A: 0.05, EOS: 0.9, B: 0.05}
# Greedy and beam 2 differ here:
#   greedy: A (.5), then A (.4, the best after A), then <eos> (.9): "A A", ln(.5 * .4 * .9)
#   beam 2, step 0: A ln .5 = -0.693, B ln .4 = -0.916
#           step 1: AA -0.693 + ln .4 = -1.609; A<eos> and AB -0.693 + ln .3 = -1.897;
#                   B<eos> -0.916 + ln .9 = -1.022 (finished); BA, BB -0.916 + ln .05 = -3.912
#                   -> keeps B<eos> and AA (alpha 1 divides all by lp(2) alike: same order)
#           step 2: B<eos> stays; AA<eos> -1.609 + ln .9 = -1.715; AAA, AAB -1.609 + ln .05
#                   -> B<eos>, AA<eos>: all finished, the search stops after 3 steps
#   with alpha 1: score(B) = ln(.36) / lp(2) = -1.0217 / (7/6); score(AA) = ln(.18) / (8/6)
BRANCHING = {
    (): {A: 0.5, EOS: 0.1, B: 0.4},
    (A,): {A: 0.4, EOS: 0.3, B: 0.3},
    (B,): {A: 0.05, EOS: 0.9, B: 0.05},
}
# The length penalty decides here (beam 2):
#   step 0: A ln .5 = -0.693, B ln .45 = -0.799
#   step 1: AA -0.693 + ln .8 = -0.916; B<eos> -0.799 + ln .8 = -1.022; the rest below -2.9
#   step 2: AA<eos> -0.916 + ln .8 = -1.139; AAA -0.916 + ln .1 = -3.219
#   alpha 0: B<eos> -1.022 beats AA<eos> -1.139
#   alpha 1: B<eos> -1.022 / (7/6) = -0.876 loses to AA<eos> -1.139 / (8/6) = -0.854
PENALISED = {
    (): {A: 0.5, EOS: 0.05, B: 0.45},
    (A,): {A: 0.8, EOS: 0.1, B: 0.1},
    (A, A): {A: 0.1, EOS: 0.8, B: 0.1},
    (B,): {A: 0.1, EOS: 0.8, B: 0.1},
}
VOCAB = 5
# <eos> .9 after every prefix: beam 2 keeps <eos> (ln .9) and A or B (ln .05), which settles
# at once: ln .05 / lp(10) = -1.2 can never reach ln .9 = -0.105
DEFAULT_ONLY: dict[tuple[int, ...], dict[int, float]] = {}


class HostScores:
    def __init__(self, log_probs: np.ndarray) -> None:
        self.log_probs = log_probs

    def top(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        ids = np.argsort(-self.log_probs, axis=1, kind="stable")[:, :k]
        return np.take_along_axis(self.log_probs, ids, axis=1), ids

    def full(self) -> np.ndarray:
        return self.log_probs


class TableModel:
    """A step model whose next-token distribution is ``tables[row's input][prefix]``."""

    def __init__(self, tables: Sequence[Mapping[tuple[int, ...], Mapping[int, float]]], rows: int):
        self.tables = tables
        self.prefixes: list[tuple[int, ...]] = [() for _ in range(len(tables) * rows)]
        self.inputs = [i for i in range(len(tables)) for _ in range(rows)]
        self.steps = 0
        self.rows_per_step: list[int] = []

    def step(self, prev_tokens: np.ndarray, position: int) -> HostScores:
        self.steps += 1
        self.rows_per_step.append(len(self.prefixes))
        out = np.full((len(self.prefixes), VOCAB), -np.inf)
        for r, token in enumerate(prev_tokens):
            if position > 0:
                self.prefixes[r] = (*self.prefixes[r], int(token))
            else:
                assert token == BOS
            assert len(self.prefixes[r]) == position
            table = self.tables[self.inputs[r]]
            for t, p in table.get(self.prefixes[r], DEFAULT).items():
                out[r, t] = math.log(p)
        return HostScores(out)

    def reorder(self, rows: np.ndarray) -> None:
        self.prefixes = [self.prefixes[r] for r in rows]
        self.inputs = [self.inputs[r] for r in rows]


def run_beam(tables, limits, beam, alpha=1.0, nbest=1, settle=True):
    model = TableModel(tables, beam)
    firsts = np.full(len(tables), BOS)
    hyps = beam_search(
        model, firsts, np.asarray(limits), beam=beam, eos=EOS, alpha=alpha, nbest=nbest,
        banned=BANNED, settle=settle,
    )  # fmt: skip
    return hyps, model


class RandomModel:
    """A step model with a random next-token distribution for every (input, prefix), the
    same each time it is asked: ``WIDE`` tokens, <eos> among them. Records the rows of each
    step."""

    WIDE = 7

    def __init__(self, inputs: int, rows: int, seed: int) -> None:
        self.seed = seed
        self.prefixes: list[tuple[int, ...]] = [() for _ in range(inputs * rows)]
        self.inputs = [i for i in range(inputs) for _ in range(rows)]
        self.rows_per_step: list[int] = []

    def step(self, prev_tokens: np.ndarray, position: int) -> HostScores:
        self.rows_per_step.append(len(self.prefixes))
        out = np.full((len(self.prefixes), self.WIDE), -np.inf)
        for r, token in enumerate(prev_tokens):
            if position > 0:
                self.prefixes[r] = (*self.prefixes[r], int(token))
            rng = np.random.default_rng([self.seed, self.inputs[r], *self.prefixes[r]])
            logits = rng.normal(0.0, 2.0, self.WIDE)
            out[r] = logits - np.log(np.exp(logits).sum())
        return HostScores(out)

    def reorder(self, rows: np.ndarray) -> None:
        self.prefixes = [self.prefixes[r] for r in rows]
        self.inputs = [self.inputs[r] for r in rows]


def run_greedy(tables, limits, alpha=1.0):
    model = TableModel(tables, 1)
    firsts = np.full(len(tables), BOS)
    choose = greedy_chooser(BANNED)
    return token_by_token(model, firsts, np.asarray(limits), choose=choose, eos=EOS, alpha=alpha)


def test_greedy_and_beam_two_differ_as_computed_by_hand() -> None:
    (greedy,) = run_greedy([BRANCHING], [10])
    assert greedy.tokens == (A, A) and greedy.ended
    assert abs(greedy.log_prob - math.log(0.5 * 0.4 * 0.9)) < TOL
    assert abs(greedy.score - math.log(0.18) / (8 / 6)) < TOL

    [[best]], model = run_beam([BRANCHING], [10], beam=2)
    assert best.tokens == (B,) and best.ended
    assert abs(best.log_prob - math.log(0.4 * 0.9)) < TOL
    assert abs(best.score - math.log(0.36) / (7 / 6)) < TOL
    assert model.steps == 3  # every hypothesis finished after step 2


def test_nbest_lists_the_beam_best_first_with_scores() -> None:
    [[first, second]], _ = run_beam([BRANCHING], [10], beam=2, nbest=2)
    assert (first.tokens, second.tokens) == ((B,), (A, A))
    assert first.score > second.score
    # the finished B<eos> kept its score while AA grew: the same value as when it ended
    assert abs(first.log_prob - (math.log(0.4) + math.log(0.9))) < TOL
    assert abs(second.log_prob - math.log(0.5 * 0.4 * 0.9)) < TOL
    assert abs(second.score - second.log_prob / length_penalty(3, 1.0)) < TOL


def test_beam_one_is_greedy() -> None:
    for tables in ([BRANCHING], [PENALISED], [BRANCHING, PENALISED]):
        beamed, _ = run_beam(tables, [10] * len(tables), beam=1)
        assert [h for [h] in beamed] == run_greedy(tables, [10] * len(tables))


def test_length_penalty_decides_between_short_and_long() -> None:
    [[plain]], _ = run_beam([PENALISED], [10], beam=2, alpha=0.0)
    assert plain.tokens == (B,)
    assert abs(plain.score - plain.log_prob) < TOL  # lp = 1 with alpha 0
    [[penalised]], _ = run_beam([PENALISED], [10], beam=2, alpha=1.0)
    assert penalised.tokens == (A, A)
    assert abs(penalised.log_prob - math.log(0.5 * 0.8 * 0.8)) < TOL
    assert abs(penalised.score - math.log(0.32) / (8 / 6)) < TOL
    assert length_penalty(1, 0.6) == pytest.approx((6 / 6) ** 0.6)
    assert length_penalty(7, 0.6) == pytest.approx(2.0**0.6)


def test_maximum_length_stops_without_eos() -> None:
    (greedy,) = run_greedy([BRANCHING], [2])
    assert greedy.tokens == (A, A) and not greedy.ended
    assert abs(greedy.log_prob - math.log(0.5 * 0.4)) < TOL
    assert abs(greedy.score - math.log(0.2) / length_penalty(2, 1.0)) < TOL
    # beam 2, at most 1 token: A ln .5 beats B ln .4, neither ended
    [[best, other]], model = run_beam([BRANCHING], [1], beam=2, nbest=2)
    assert (best.tokens, other.tokens) == ((A,), (B,))
    assert not best.ended and model.steps == 1


def test_eos_first_gives_an_empty_output() -> None:
    table = {(): {A: 0.1, EOS: 0.8, B: 0.1}}
    [[best]], model = run_beam([table], [10], beam=3)
    assert best.tokens == () and best.ended and best.length == 1
    assert abs(best.log_prob - math.log(0.8)) < TOL
    # settled after one step: A and B (ln .1 / lp(10) = -0.92 at best, whatever follows)
    # can never outscore <eos> (ln .8 = -0.22); without settling, step 1 lets them finish
    assert model.steps == 1
    [[unsettled]], model = run_beam([table], [10], beam=3, settle=False)
    assert unsettled == best and model.steps == 2  # DEFAULT: <eos> .9


@pytest.mark.parametrize("seed", range(12))
def test_settling_and_dropping_done_inputs_change_no_result(seed: int) -> None:
    """Random models, lengths, beams, n-best and length penalties: the search that settles
    inputs early and drops done ones from the model gives exactly the hypotheses of the
    search that runs every input until all its hypotheses end."""
    rng = np.random.default_rng(seed)
    inputs, beam = int(rng.integers(1, 9)), int(rng.integers(1, 5))
    nbest, alpha = int(rng.integers(1, beam + 1)), float(rng.choice([0.0, 0.6, 1.0, 2.0]))
    limits = rng.integers(1, 9, size=inputs)
    results = []
    for settle in (True, False):
        model = RandomModel(inputs, beam, seed)
        hyps = beam_search(
            model, np.full(inputs, BOS), limits, beam=beam, eos=EOS, alpha=alpha, nbest=nbest,
            banned=BANNED, settle=settle,
        )  # fmt: skip
        results.append((hyps, model.rows_per_step))
    (settled, rows), (full, full_rows) = results
    assert settled == full
    assert sum(rows) <= sum(full_rows)
    alone = [
        beam_search(
            RandomModel(1, beam, seed), np.full(1, BOS), limits[i : i + 1], beam=beam, eos=EOS,
            alpha=alpha, nbest=nbest, banned=BANNED,
        )[0]
        for i in range(inputs)
    ]  # fmt: skip
    # each input alone, in a model whose input ids restart at 0: same distributions for input 0
    assert settled[0] == alone[0]


def test_a_longer_hypothesis_that_overtakes_is_not_settled_away() -> None:
    """alpha 2 rewards length: <eos> at once scores ln .5 = -0.693; A then A A A (.95 each)
    and <eos> (.9) has log-probability -1.175 but length 5: -1.175 / (10/6)**2 = -0.423.
    After step 0, A's -0.916 is below -0.693, yet it is not settled away: with at most 10
    tokens it could reach -0.916 / (15/6)**2 = -0.147."""
    table = {
        (): {A: 0.4, EOS: 0.5, B: 0.1},
        (A,): {A: 0.95, EOS: 0.04, B: 0.01},
        (A, A): {A: 0.95, EOS: 0.04, B: 0.01},
        (A, A, A): {A: 0.95, EOS: 0.04, B: 0.01},
    }
    [[best]], _ = run_beam([table], [10], beam=2, alpha=2.0)
    assert best.tokens == (A, A, A, A) and best.ended
    assert abs(best.log_prob - math.log(0.4 * 0.95**3 * 0.9)) < TOL
    assert abs(best.score - best.log_prob / (10 / 6) ** 2) < TOL


def test_done_inputs_leave_the_model_in_halves() -> None:
    """Eight inputs, five of which are done after their first step (DEFAULT: <eos> .9
    everywhere) and three that take three steps (BRANCHING with beam 2): the model then holds
    4 inputs (the three still decoding and a done one filling the half); with one still
    decoding, 1. Each input's hypotheses are those it gets alone."""
    branching = (1, 4, 6)
    tables = [BRANCHING if i in branching else DEFAULT_ONLY for i in range(8)]
    hyps, model = run_beam(tables, [10] * 8, beam=2)
    assert model.rows_per_step == [16, 8, 8]
    (alone_default,), _ = run_beam([DEFAULT_ONLY], [10], beam=2)
    (alone_branching,), _ = run_beam([BRANCHING], [10], beam=2)
    assert hyps == [alone_branching if i in branching else alone_default for i in range(8)]
    hyps, model = run_beam([DEFAULT_ONLY] * 7 + [BRANCHING], [10] * 8, beam=2)
    assert model.rows_per_step == [16, 2, 2]
    assert hyps == [alone_default] * 7 + [alone_branching]


def test_greedy_drops_finished_rows_in_halves_too() -> None:
    """Greedy: DEFAULT_ONLY rows pick <eos> at once, BRANCHING ones "A A <eos>" (3 steps)."""
    branching = (1, 4, 6)
    tables = [BRANCHING if i in branching else DEFAULT_ONLY for i in range(8)]
    model = TableModel(tables, 1)
    choose = greedy_chooser(BANNED)
    hyps = token_by_token(model, np.full(8, BOS), np.full(8, 10), choose=choose, eos=EOS)
    assert model.rows_per_step == [8, 4, 4]
    (alone_default,) = run_greedy([DEFAULT_ONLY], [10])
    (alone_branching,) = run_greedy([BRANCHING], [10])
    assert hyps == [alone_branching if i in branching else alone_default for i in range(8)]
    assert alone_branching.tokens == (A, A) and alone_default.tokens == ()


def test_inputs_of_a_batch_decode_independently() -> None:
    tables = [BRANCHING, PENALISED, {(): {A: 0.3, EOS: 0.3, B: 0.4}}, BRANCHING]
    limits = [10, 2, 5, 1]
    pairs = list(zip(tables, limits, strict=True))
    for beam, nbest in ((1, 1), (2, 2), (3, 2)):
        together, _ = run_beam(tables, limits, beam=beam, nbest=nbest)
        assert together == [run_beam([t], [n], beam=beam, nbest=nbest)[0][0] for t, n in pairs]
    assert run_greedy(tables, limits) == [run_greedy([t], [n])[0] for t, n in pairs]


def test_banned_tokens_are_never_output() -> None:
    table = {(): {PAD: 0.6, BOS: 0.3, A: 0.05, EOS: 0.05}}  # the likeliest two are banned
    [[best]], _ = run_beam([table], [3], beam=2)
    assert PAD not in best.tokens and BOS not in best.tokens
    (greedy,) = run_greedy([table], [3])
    assert greedy.tokens[:1] in ((A,), ()) and PAD not in greedy.tokens


def test_beam_larger_than_the_vocabulary_keeps_only_real_hypotheses() -> None:
    # 3 usable tokens at the first step, beam 8: empty slots never come back as outputs
    [hyps], _ = run_beam([BRANCHING], [3], beam=8, nbest=8)
    assert all(math.isfinite(h.log_prob) for h in hyps)
    assert len({h.tokens for h in hyps}) == len(hyps)
    assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)


def test_max_output_lengths() -> None:
    assert max_output_lengths([0, 1, 3, 10], 2.0, 10).tolist() == [10, 12, 16, 30]
    assert max_output_lengths([3, 4], 1.5, 0).tolist() == [5, 6]
    assert max_output_lengths([0], 0.0, 0).tolist() == [1]


def test_sampler_distribution_by_hand() -> None:
    log_probs = np.log([0.0 + 1e-300, 0.1, 0.2, 0.3, 0.4])  # id 0 is <pad>
    plain = Sampler(banned=[PAD]).distribution(log_probs)
    assert plain == pytest.approx([0, 0.1, 0.2, 0.3, 0.4], abs=1e-12)
    # temperature 0.5 squares the probabilities: .01 .04 .09 .16 over .30
    hot = Sampler(temperature=0.5, banned=[PAD]).distribution(log_probs)
    assert hot == pytest.approx([0, 0.01 / 0.3, 0.04 / 0.3, 0.09 / 0.3, 0.16 / 0.3], abs=1e-12)
    # top-k 2 keeps .3 and .4
    top2 = Sampler(top_k=2, banned=[PAD]).distribution(log_probs)
    assert top2 == pytest.approx([0, 0, 0, 0.3 / 0.7, 0.4 / 0.7], abs=1e-12)
    # top-p 0.6: .4 (mass before it 0), .3 (before it .4 < .6), .2 (before it .7): cut
    nucleus = Sampler(top_p=0.6, banned=[PAD]).distribution(log_probs)
    assert nucleus == pytest.approx([0, 0, 0, 0.3 / 0.7, 0.4 / 0.7], abs=1e-12)
    # top-p below the best token's probability keeps that token alone
    assert Sampler(top_p=0.1).distribution(log_probs)[4] == 1.0


def test_sampling_repeats_by_seed_and_line_not_by_batch() -> None:
    tables = [{(): {A: 0.3, EOS: 0.2, B: 0.5}, (A,): {A: 0.4, EOS: 0.2, B: 0.4}}] * 6

    def sample(seed: int, lines: list[int]) -> list:
        model = TableModel([tables[i] for i in lines], 1)
        options = DecodeOptions(sample=True, seed=seed, beam_size=1)
        return decode(
            model, np.full(len(lines), BOS), np.full(len(lines), 6), options,
            eos=EOS, banned=BANNED, lines=lines,
        )  # fmt: skip

    first = sample(11, list(range(6)))
    assert first == sample(11, list(range(6)))
    assert first[2:4] == sample(11, [2, 3])  # the same lines in another batch
    others = [sample(seed, list(range(6))) for seed in range(12, 20)]
    assert any(o != first for o in others)
    for [hyp] in first:
        assert all(t in (A, B) for t in hyp.tokens)


def test_sampled_frequencies_follow_the_distribution() -> None:
    # 4000 draws from (.1, .2, .3, .4): each share within 5 standard deviations (< 0.04)
    sampler = Sampler(banned=[PAD], seed=5)
    rng = np.random.default_rng(0)
    log_probs = np.log([1e-300, 0.1, 0.2, 0.3, 0.4])
    counts = np.bincount([sampler.draw(log_probs, rng) for _ in range(4000)], minlength=5)
    shares = counts / 4000
    assert counts[0] == 0
    for p, share in zip([0.1, 0.2, 0.3, 0.4], shares[1:], strict=True):
        assert abs(share - p) < 5 * math.sqrt(p * (1 - p) / 4000)


def test_decode_rejects_nbest_over_beam() -> None:
    with pytest.raises(ValueError, match="nbest"):
        run_beam([BRANCHING], [3], beam=2, nbest=3)


# --------------------------------------------------------------------------------------------
# On MXNet: the graph runner and the seq2seq predictor, with a hand-written copy model
# --------------------------------------------------------------------------------------------

COPY_VOCAB = ["<pad>", "<unk>", "<eos>", "<bos>", "w", "x", "y", "z"]
COPY_GAIN = 10.0  # the out_weight diagonal: log p(target) = 10 - log(e^10 + V - 1)


class CopySymGen:
    """A seq2seq model following the issue-30 contract whose weights make it copy its source:
    at output position p it predicts source[p], then <eos>. The static array is the source
    with a padding column; the state is the position, advanced by each step."""

    static_names = ("memory",)
    state_names = ("position",)

    def __init__(self, vocab: int, eos: int) -> None:
        self.vocab, self.eos = vocab, eos

    def encoder(self, width: int, max_steps: int | None = None):
        import mxnet as mx

        source = mx.sym.Variable("source")
        first = mx.sym.slice_axis(source, axis=1, begin=0, end=1)
        memory = mx.sym.concat(source, mx.sym.zeros_like(first), dim=1)
        return mx.sym.Group([memory, mx.sym.zeros_like(first)])

    def decoder_step(self, width: int, max_steps: int):
        import mxnet as mx

        memory, position = mx.sym.Variable("memory"), mx.sym.Variable("position")
        where = mx.sym.clip(mx.sym.reshape(position, (-1,)), 0, width)
        target = mx.sym.pick(memory, where, axis=1)
        target = target + (target == 0) * self.eos
        logits = mx.sym.FullyConnected(
            mx.sym.one_hot(target, depth=self.vocab), num_hidden=self.vocab, no_bias=True,
            name="out",
        )  # fmt: skip
        # prev_token and step are inputs of every step graph (the contract): read them
        unused = (
            mx.sym.sum(mx.sym.Variable("prev_token")) * 0 + mx.sym.sum(mx.sym.Variable("step")) * 0
        )
        log_probs = mx.sym.broadcast_add(mx.sym.log_softmax(logits, axis=-1), unused)
        return mx.sym.Group([log_probs, position + 1])

    def input_shapes(self, width: int, rows: int, max_steps: int) -> dict:
        return {
            "prev_token": (rows,),
            "step": (1,),
            "memory": (rows, width + 1),
            "position": (rows, 1),
        }


class FakeBatch:
    def __init__(self, source: np.ndarray, index: list[int]) -> None:
        import mxnet as mx

        self.data = [mx.nd.array(source)]
        self.index = np.asarray(index)


def copy_params():
    import mxnet as mx

    return {"out_weight": mx.nd.array(np.eye(len(COPY_VOCAB)) * COPY_GAIN)}


def copy_batches() -> list[FakeBatch]:
    # lines 0..4; line 3 is blank (no row); rows out of order, one padding row
    first = np.array([[4, 5, 6, 7], [5, 0, 0, 0], [0, 0, 0, 0]], dtype=np.float32)
    second = np.array([[7, 7, 4, 0, 0, 0], [6, 5, 4, 7, 6, 5]], dtype=np.float32)
    return [FakeBatch(first, [2, 0, -1]), FakeBatch(second, [4, 1])]


EXPECTED_COPIES = {0: "x", 1: "y x w z y x", 2: "w x y z", 4: "z z w"}


def decode_copies(options: DecodeOptions):
    import mxnet as mx

    from mxtrain.data.base import Seq2SeqInfo
    from mxtrain.decoding.seq2seq import DecoderModel, decoder_graphs
    from mxtrain.engine.graph_runner import GraphRunner
    from mxtrain.inference.seq2seq import decode_batches

    info = Seq2SeqInfo(vocab_size=len(COPY_VOCAB), num_classes=len(COPY_VOCAB), pad_id=0)
    sym_gen = CopySymGen(len(COPY_VOCAB), info.eos_id)
    runner = GraphRunner(decoder_graphs(sym_gen), copy_params(), {}, mx.cpu())

    def detokenize(ids):
        return " ".join(COPY_VOCAB[i] for i in ids)

    models = [DecoderModel(runner, sym_gen)]
    return decode_batches(copy_batches(), models, info, options, detokenize, count=5)


def copy_log_prob(length: int) -> float:
    # float32 log_softmax of one gain-10 logit among V - 1 zeros, summed over length + 1
    # positions (<eos> included): each term within a few float32 eps of the exact value
    q = COPY_GAIN - math.log(math.exp(COPY_GAIN) + len(COPY_VOCAB) - 1)
    return (length + 1) * q


def test_seq2seq_predictor_decodes_a_copy_model_in_input_order() -> None:
    for options in (DecodeOptions(beam_size=1), DecodeOptions(beam_size=3, nbest=2)):
        predictions = decode_copies(options)
        records = list(predictions.records())
        assert [r["line"] for r in records] == [1, 2, 3, 4, 5]
        assert records[3]["output"] is None and records[3]["score"] is None
        for line, text in EXPECTED_COPIES.items():
            record = records[line]
            assert record["output"] == text
            length = len(text.split())
            # float32 terms: |error| <= (length + 1) * 8 eps * |q| (q ~ -1e-3): far below 1e-5
            assert abs(record["log_prob"] - copy_log_prob(length)) < 1e-5
            expected_score = copy_log_prob(length) / length_penalty(length + 1, 1.0)
            assert abs(record["score"] - expected_score) < 1e-5
            if options.nbest > 1:
                assert record["nbest"][0]["output"] == text
                assert len(record["nbest"]) == 2
                assert record["nbest"][1]["score"] < record["score"]
        assert predictions.totals() == (5, 1, 0, 0.0)


def test_seq2seq_csv_and_npy_hold_every_hypothesis() -> None:
    predictions = decode_copies(DecodeOptions(beam_size=2, nbest=2))
    rows = list(predictions.csv_rows())
    assert predictions.csv_header() == ["line", "rank", "output", "score", "log_prob"]
    assert [r[:2] for r in rows] == [[1, 1], [1, 2], [2, 1], [2, 2], [3, 1], [3, 2], [4, None],
                                     [5, 1], [5, 2]]  # fmt: skip
    table = predictions.to_numpy()
    assert table["output"][0] == "x" and table["rank"][6] == -1 and np.isnan(table["score"][6])
    assert table.dtype.names == ("line", "rank", "output", "score", "log_prob")


def test_maximum_output_length_cuts_the_copy() -> None:
    # ratio 0.5, add 1: a 6-token source gets at most 4 output positions
    predictions = decode_copies(DecodeOptions(beam_size=1, max_output_ratio=0.5, max_output_add=1))
    records = list(predictions.records())
    assert records[1]["output"] == "y x w z"
    assert records[0]["output"] == "x"  # ceil(0.5) + 1 = 2 positions: x <eos>


def test_graph_runner_shares_parameters_and_bounds_its_executors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import mxnet as mx

    # oneDNN's fused inference FullyConnected keeps its own copy of the weights it reads first
    # (see the runner's docstring): without it, every executor reads the arrays given
    monkeypatch.setenv("MXNET_SUBGRAPH_BACKEND", "NONE")
    from mxtrain.engine.graph_runner import GraphMismatch, GraphRunner

    weight = mx.nd.array([[1.0, 2.0], [3.0, 4.0]])

    def symbol_for(key):
        return mx.sym.FullyConnected(
            mx.sym.Variable("data"), num_hidden=2, no_bias=True, name="fc"
        ) * float(key[1])

    runner = GraphRunner(symbol_for, {"fc_weight": weight}, {}, mx.cpu(), max_bound=2)
    x = np.array([[1.0, 1.0]], dtype=np.float32)
    outs = [runner.forward(("scale", k), {"data": x})[0].asnumpy() for k in (1, 2, 3)]
    assert [o.tolist() for o in outs] == [[[3.0, 7.0]], [[6.0, 14.0]], [[9.0, 21.0]]]
    assert runner.bound == 2 and runner.binds == 3
    weight[:] = weight * 10  # the executors read the very arrays given: no copies
    assert runner.forward(("scale", 3), {"data": x})[0].asnumpy().tolist() == [[90.0, 210.0]]
    assert runner.forward(("scale", 1), {"data": x})[0].asnumpy().tolist() == [[30.0, 70.0]]
    assert runner.binds == 4  # key 1 was released and bound again
    with pytest.raises(GraphMismatch, match="bound with data"):
        runner.forward(("scale", 1), {"data": np.zeros((3, 2), dtype=np.float32)})
    with pytest.raises(GraphMismatch, match="no parameters"):
        GraphRunner(symbol_for, {}, {}, mx.cpu()).forward(("scale", 1), {"data": x})


class FakeSourceIter:
    """A predict-role iterator as the contract describes it (source batches with index)."""

    def __init__(self) -> None:
        from mxtrain.data.base import Seq2SeqInfo

        self.data_info = Seq2SeqInfo(
            vocab_size=len(COPY_VOCAB), num_classes=len(COPY_VOCAB), pad_id=0, tokens="chars"
        )
        self.num_sentences = 5
        self.resets = 0

    def reset(self) -> None:
        self.resets += 1

    def __iter__(self):
        return iter(copy_batches())

    def detokenize(self, ids) -> str:
        return "".join(COPY_VOCAB[i] for i in ids)


def fake_opened(params):
    from types import SimpleNamespace

    import mxnet as mx

    import mxtrain.build

    config = SimpleNamespace(model=SimpleNamespace(name="copy"), base_dir=None)
    data_iter = FakeSourceIter()
    return SimpleNamespace(
        data_iter=data_iter,
        config=config,
        # as OpenedRun.sym_gen, through the (monkeypatched) builder
        sym_gen=lambda: mxtrain.build.build_sym_gen(
            config.model, data_iter.data_info, config.base_dir
        ),
        params=lambda: (params, {}),
        contexts=[mx.cpu()],
        params_file="model-0001.params",
    )


def test_predict_seq2seq_builds_the_graphs_from_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    import mxtrain.build
    from mxtrain.errors import ConfigError
    from mxtrain.inference.seq2seq import predict_seq2seq

    sym_gen = CopySymGen(len(COPY_VOCAB), eos=2)
    monkeypatch.setattr(mxtrain.build, "build_sym_gen", lambda *args: sym_gen)
    opened = fake_opened(copy_params())
    records = list(predict_seq2seq(opened, DecodeOptions(beam_size=2)).records())
    assert [r["output"] for r in records] == ["x", "yxwzyx", "wxyz", None, "zzw"]  # chars
    assert opened.data_iter.resets == 1

    with pytest.raises(ConfigError, match="no parameters"):
        predict_seq2seq(fake_opened({}), DecodeOptions())
    monkeypatch.setattr(mxtrain.build, "build_sym_gen", lambda *args: lambda key: None)
    with pytest.raises(ConfigError, match="encoder, decoder_step"):
        predict_seq2seq(fake_opened(copy_params()), DecodeOptions())


def test_decode_options_defaults_and_refusals() -> None:
    from mxtrain.data.base import TASK_LM, TASK_SEQ2SEQ
    from mxtrain.errors import ConfigError
    from mxtrain.inference.decode import DecodeFlags, decode_options

    seq2seq = decode_options(DecodeFlags(), TASK_SEQ2SEQ, False, 0)
    assert (seq2seq.beam_size, seq2seq.nbest, seq2seq.length_penalty) == (5, 1, 1.0)
    assert (seq2seq.max_output_ratio, seq2seq.max_output_add, seq2seq.sample) == (2.0, 10, False)
    greedy = decode_options(DecodeFlags(), TASK_LM, True, 0)
    assert (greedy.beam_size, greedy.sample, greedy.max_tokens) == (1, False, 20)
    top_k = decode_options(DecodeFlags(seed=4), TASK_LM, True, 3)
    assert (top_k.sample, top_k.top_k, top_k.seed, top_k.beam_size) == (True, 3, 4, 1)
    nucleus = decode_options(DecodeFlags(top_p=0.5), TASK_LM, True, 0)
    assert nucleus.sample and nucleus.top_p == 0.5 and nucleus.top_k == 0

    refusals = [
        (DecodeFlags(temperature=0.5), TASK_SEQ2SEQ, False, 0, "--temperature"),
        (DecodeFlags(max_tokens=5), TASK_SEQ2SEQ, False, 0, "--max-tokens"),
        (DecodeFlags(), TASK_SEQ2SEQ, False, 3, "--top-k"),
        (DecodeFlags(beam_size=2, nbest=3), TASK_SEQ2SEQ, False, 0, "--nbest 3"),
        (DecodeFlags(nbest=6), TASK_SEQ2SEQ, False, 0, "--beam-size 5"),
        (DecodeFlags(beam_size=3), "classify", False, 0, "--beam-size"),
        (DecodeFlags(sample=True), TASK_LM, False, 0, "--sample"),
        (DecodeFlags(max_output_add=2), TASK_LM, True, 0, "--max-output-add"),
        (DecodeFlags(beam_size=0), TASK_SEQ2SEQ, False, 0, "--beam-size 0"),
        (DecodeFlags(temperature=0.0), TASK_LM, True, 0, "--temperature 0.0"),
    ]
    for flags, task, generate, k, named in refusals:
        with pytest.raises(ConfigError, match=named):
            decode_options(flags, task, generate, k)
    # a scoring task without decoding flags: nothing to refuse
    assert decode_options(DecodeFlags(), TASK_LM, False, 5) == DecodeOptions()
