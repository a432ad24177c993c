"""The search core of decoding: batched beam search, greedy decoding and sampling over a
step model (issue 30). Plain NumPy, no MXNet import: fit's evaluations and ``mxtrain predict``
both use it.

The searches read a small protocol, :class:`StepModel`: ``step(prev_tokens, position)`` runs
one decoder step for every row and returns its :class:`StepScores` (log probabilities over
the output vocabulary, read as the k best per row or whole), and ``reorder(rows)`` makes row
``i`` continue from the state of row ``rows[i]`` (beam search keeps the best hypotheses).
Seq2seq models (:mod:`mxtrain.decoding.seq2seq`) and language models
(:mod:`mxtrain.inference.generate`) implement it on the device; the tests with NumPy fakes.

Scores: a hypothesis's ``log_prob`` is the sum of the natural-log probabilities of its tokens,
the ``<eos>`` that ended it included; its ``score`` is ``log_prob / lp(length)`` with the GNMT
length penalty ``lp(n) = ((5 + n) / 6) ** alpha`` (Wu et al. 2016), ``n`` counting ``<eos>``.
Beam search ranks hypotheses of different lengths by ``score``. ``alpha`` defaults to 1.0,
Sockeye's default (GNMT tuned 0.6 for its models); 0 ranks by ``log_prob`` alone.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

#: ``--length-penalty`` (alpha), Sockeye 1.x's default
DEFAULT_LENGTH_PENALTY = 1.0
#: ``--beam-size`` for seq2seq models (language-model generation defaults to greedy)
DEFAULT_BEAM_SIZE = 5
#: the longest output: ceil(ratio * source length) + add tokens, <eos> included
DEFAULT_MAX_OUTPUT_RATIO = 2.0
DEFAULT_MAX_OUTPUT_ADD = 10
#: ``--max-tokens``: the longest continuation of a prompt, <eos> included
DEFAULT_MAX_TOKENS = 20


@dataclass(frozen=True)
class DecodeOptions:
    """How to decode (the ``predict`` flags of the same names; see the module docstring)."""

    beam_size: int = DEFAULT_BEAM_SIZE  # 1: greedy
    nbest: int = 1  # hypotheses kept per input (<= beam_size)
    length_penalty: float = DEFAULT_LENGTH_PENALTY  # GNMT alpha
    max_output_ratio: float = DEFAULT_MAX_OUTPUT_RATIO  # seq2seq: longest output per source token
    max_output_add: int = DEFAULT_MAX_OUTPUT_ADD  # seq2seq: ... plus this many
    max_tokens: int = DEFAULT_MAX_TOKENS  # generation: tokens after the prompt, <eos> included
    sample: bool = False  # draw each token instead of searching
    temperature: float = 1.0  # sampling: divides the log-probabilities
    top_k: int = 0  # sampling: draw among the k most likely tokens (0: all)
    top_p: float = 1.0  # sampling: among the fewest tokens holding probability p
    seed: int = 0  # sampling: the same seed gives the same text


class StepScores(Protocol):
    """One step's log-probabilities, (rows, vocabulary), wherever they are."""

    def top(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Each row's ``k`` best (log-probabilities, token ids), best first, (rows, k) each."""
        ...

    def full(self) -> np.ndarray:
        """All log-probabilities, (rows, vocabulary)."""
        ...


class StepModel(Protocol):
    """A decoder run one step at a time on states it keeps per row."""

    def step(self, prev_tokens: np.ndarray, position: int) -> StepScores:
        """Run the step at 0-based output ``position`` after ``prev_tokens`` (rows,)."""
        ...

    def reorder(self, rows: np.ndarray) -> None:
        """Row ``i`` continues from the state of row ``rows[i]``. ``rows`` may be fewer than
        the model holds: the others are dropped (beam search drops finished inputs)."""
        ...


@dataclass(frozen=True)
class Hypothesis:
    """One output: its tokens (without the ``<eos>`` that ended it) and scores."""

    tokens: tuple[int, ...]
    log_prob: float  # sum of ln p over the tokens and the final <eos>
    score: float  # log_prob / lp(length)
    ended: bool  # True: by <eos>; False: at the maximum length

    @property
    def length(self) -> int:
        """Output positions, ``<eos>`` included (what the length penalty counts)."""
        return len(self.tokens) + (1 if self.ended else 0)


def length_penalty(length: Any, alpha: float) -> Any:
    """GNMT's ``((5 + length) / 6) ** alpha`` (elementwise for arrays)."""
    return ((5.0 + np.asarray(length, dtype=np.float64)) / 6.0) ** alpha


def max_output_lengths(
    source_lengths: Sequence[int] | np.ndarray, ratio: float, add: int
) -> np.ndarray:
    """``ceil(ratio * length) + add`` per source (at least 1), int64."""
    lengths = np.asarray(source_lengths, dtype=np.float64)
    return np.maximum(np.ceil(ratio * lengths).astype(np.int64) + int(add), 1)


def _hypothesis(tokens: np.ndarray, log_prob: float, eos: int, alpha: float) -> Hypothesis:
    ended = tokens.size > 0 and int(tokens[-1]) == eos
    words = tuple(int(t) for t in (tokens[:-1] if ended else tokens))
    return Hypothesis(words, log_prob, log_prob / float(length_penalty(tokens.size, alpha)), ended)


def beam_search(
    model: StepModel,
    first_tokens: np.ndarray,
    max_lengths: np.ndarray,
    *,
    beam: int,
    eos: int,
    alpha: float = DEFAULT_LENGTH_PENALTY,
    nbest: int = 1,
    banned: Collection[int] = (),
    settle: bool = True,
) -> list[list[Hypothesis]]:
    """The ``nbest`` best hypotheses of each of ``len(first_tokens)`` inputs, best first.

    ``model`` holds ``beam`` rows per input (input ``b`` in rows ``b * beam ..``), all in the
    same state; ``first_tokens`` (inputs,) is what its first step reads (``<bos>``), and
    input ``b`` gets at most ``max_lengths[b]`` output tokens (``<eos>`` included).

    Each step extends every unfinished hypothesis by each row's best tokens (never one of
    ``banned``) and keeps, per input, the ``beam`` best by score among the extensions and the
    finished hypotheses; one that picks ``<eos>`` is finished: it keeps its score and stops
    growing. An input is done when all its hypotheses are finished or reach its maximum
    length, or, with ``settle``, once its ``nbest`` best are finished and no unfinished one
    can ever outscore them (:func:`_settled`: the same result, fewer steps); the search stops
    when every input is done. Done inputs leave the model's rows (:func:`_inputs_to_keep`),
    which changes no result either: their hypotheses could only stay.
    """
    first = np.asarray(first_tokens, dtype=np.int64)
    limits = np.asarray(max_lengths, dtype=np.int64)
    inputs, k = first.size, int(beam)
    if k < 1 or not 1 <= nbest <= k:
        raise ValueError(f"need 1 <= nbest <= beam, got nbest {nbest}, beam {beam}")
    raw = np.full((inputs, k), -np.inf)
    raw[:, 0] = 0.0  # the beams of an input start identical: extend only the first
    length = np.zeros((inputs, k), dtype=np.int64)
    done = np.zeros((inputs, k), dtype=bool)
    history = np.zeros((inputs, k, 0), dtype=np.int64)  # -1: the hypothesis stayed
    slots = np.arange(inputs)  # the inputs whose rows the model holds, in its row order
    prev = np.repeat(first, k)
    for position in range(int(limits.max(initial=0))):
        done |= (position >= limits)[:, None]
        if done.all():
            break
        vals, ids = model.step(prev, position).top(k + len(banned))
        vals = vals.astype(np.float64)
        if banned:
            vals[np.isin(ids, list(banned))] = -np.inf
        n = slots.size
        width = vals.shape[1] + 1  # each row's tokens, then "stay" for a finished one
        held, was_done = raw[slots], done[slots]
        grown = np.where(was_done[..., None], -np.inf, held[..., None] + vals.reshape(n, k, -1))
        stay = np.where(was_done, held, -np.inf)[..., None]
        candidates = np.concatenate([grown, stay], axis=2)
        lengths = np.concatenate(
            [np.full(grown.shape, position + 1), length[slots][..., None]], axis=2
        ).reshape(n, -1)
        flat = candidates.reshape(n, -1)
        ranked = flat / length_penalty(lengths, alpha)
        best = np.argsort(-ranked, axis=1, kind="stable")[:, :k]
        parent, column = best // width, best % width
        stays = column == width - 1
        token = ids.reshape(n, k, -1)[np.arange(n)[:, None], parent, np.minimum(column, width - 2)]
        raw[slots] = np.take_along_axis(flat, best, axis=1)
        length[slots] = np.take_along_axis(lengths, best, axis=1)
        done[slots] = stays | (token == eos) | np.isneginf(raw[slots])
        if settle:
            settled = _settled(raw[slots], length[slots], done[slots], limits[slots], nbest, alpha)
            done[slots[settled]] = True
        step_tokens = np.full((inputs, k), -1, dtype=np.int64)
        step_tokens[slots] = np.where(stays, -1, token)
        history[slots] = history[slots][np.arange(n)[:, None], parent]
        history = np.concatenate([history, step_tokens[..., None]], axis=2)
        rows = (np.arange(n)[:, None] * k + parent).ravel()
        prev = np.where(stays, eos, token).ravel()
        finished = done[slots].all(axis=1) | (position + 1 >= limits[slots])
        kept = _inputs_to_keep(finished)
        if kept is not None:
            rows, prev = rows.reshape(n, k)[kept].ravel(), prev.reshape(n, k)[kept].ravel()
            slots = slots[kept]
        model.reorder(rows)
    return _best(raw, length, history, eos, alpha, nbest)


def _settled(
    raw: np.ndarray,
    length: np.ndarray,
    done: np.ndarray,
    limits: np.ndarray,
    nbest: int,
    alpha: float,
) -> np.ndarray:
    """Per input (row): whether its ``nbest`` best hypotheses are finished and final.

    A log-probability only falls as a hypothesis grows (each token adds ln p <= 0), and the
    length penalty divides it by at most ``lp(limit)``: whatever an unfinished hypothesis
    with log-probability ``r`` becomes scores at most ``r / lp(limit)``. When that bound is
    below the ``nbest``-th best finished score for every unfinished one, the finished ``nbest``
    outrank everything the input could still produce: searching on changes no output."""
    finished = done & np.isfinite(raw)
    scores = np.where(finished, raw / length_penalty(np.maximum(length, 1), alpha), -np.inf)
    kept = -np.sort(-scores, axis=1)[:, nbest - 1]  # the nbest-th best finished score
    reach = np.where(done, -np.inf, raw / length_penalty(limits, alpha)[:, None])
    return np.isfinite(kept) & (reach.max(axis=1) < kept)


def _inputs_to_keep(finished: np.ndarray) -> np.ndarray | None:
    """Which of the model's inputs to keep, in order, once ``finished`` (one per input) are
    done; None: keep all. The model's inputs halve (n, n // 2, n // 4, ...) while those still
    decoding fit in half, some finished ones kept to fill the size: a step graph is bound per
    row count, so a batch binds at most log2(n) of them, and a step on fewer rows is
    cheaper."""
    n, alive = finished.size, int((~finished).sum())
    size = n
    while size > 1 and alive <= size // 2:
        size //= 2
    if size == n or alive == 0:
        return None
    filler = np.flatnonzero(finished)[: size - alive]
    return np.sort(np.concatenate([np.flatnonzero(~finished), filler]))


def _best(
    raw: np.ndarray, length: np.ndarray, history: np.ndarray, eos: int, alpha: float, nbest: int
) -> list[list[Hypothesis]]:
    ranked = raw / length_penalty(np.maximum(length, 0), alpha)
    out = []
    for b in range(raw.shape[0]):
        order = [j for j in np.argsort(-ranked[b], kind="stable") if np.isfinite(raw[b, j])]
        hyps = []
        for j in order[:nbest]:
            tokens = history[b, j]
            hyps.append(_hypothesis(tokens[tokens >= 0][: length[b, j]], raw[b, j], eos, alpha))
        out.append(hyps)
    return out


#: ``choose(scores, active, inputs) -> (token ids, their log-probabilities)``, (rows,) each:
#: ``active`` marks the model's rows still decoding, ``inputs`` the input each row holds
Chooser = Callable[[StepScores, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


def greedy_chooser(banned: Collection[int] = ()) -> Chooser:
    """Each row's most likely token that is not ``banned`` (ties: the lowest id first, as
    ``topk`` orders them)."""

    def choose(
        scores: StepScores, active: np.ndarray, inputs: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        vals, ids = scores.top(1 + len(banned))
        vals = vals.astype(np.float64)
        if banned:
            vals[np.isin(ids, list(banned))] = -np.inf
        column = np.argmax(vals, axis=1)  # the first of equal ones
        rows = np.arange(ids.shape[0])
        return ids[rows, column].astype(np.int64), vals[rows, column]

    return choose


class Sampler:
    """Draws each row's next token: temperature, then top-k, then top-p (nucleus) truncation.

    Each input line draws from its own generator, seeded by ``(seed, line)``: a line's text
    depends on the seed and the model only, not on the batch it shares or the batch size.
    The log-probability reported for a drawn token is the model's own (temperature 1, no
    truncation).
    """

    def __init__(
        self,
        *,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
        banned: Collection[int] = (),
    ) -> None:
        if not temperature > 0 or not 0 < top_p <= 1 or top_k < 0:
            raise ValueError(f"bad sampling settings {temperature=}, {top_k=}, {top_p=}")
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.seed = seed
        self.banned = list(banned)

    def chooser(self, lines: Sequence[int]) -> Chooser:
        """A chooser for rows holding these input ``lines``."""
        generators = [np.random.default_rng([self.seed, int(line)]) for line in lines]

        def choose(
            scores: StepScores, active: np.ndarray, inputs: np.ndarray
        ) -> tuple[np.ndarray, np.ndarray]:
            log_probs = scores.full().astype(np.float64)
            tokens = np.zeros(log_probs.shape[0], dtype=np.int64)
            for r in np.flatnonzero(active):  # a finished line draws no more numbers
                tokens[r] = self.draw(log_probs[r], generators[inputs[r]])
            return tokens, log_probs[np.arange(tokens.size), tokens]

        return choose

    def distribution(self, log_probs: np.ndarray) -> np.ndarray:
        """The probabilities one row's token is drawn with (float64, sums to 1)."""
        logits = np.asarray(log_probs, dtype=np.float64) / self.temperature
        logits[self.banned] = -np.inf
        if 0 < self.top_k < logits.size:
            cut = np.argsort(-logits, kind="stable")[self.top_k :]
            logits[cut] = -np.inf
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        if self.top_p < 1:
            order = np.argsort(-probs, kind="stable")
            before = np.cumsum(probs[order]) - probs[order]  # mass of the likelier tokens
            probs[order[before >= self.top_p]] = 0.0  # the first token always stays
            probs /= probs.sum()
        return probs

    def draw(self, log_probs: np.ndarray, generator: np.random.Generator) -> int:
        """One token id from :meth:`distribution`, by inverting its cumulative sum."""
        cumulative = np.cumsum(self.distribution(log_probs))
        u = generator.random() * cumulative[-1]
        return int(min(np.searchsorted(cumulative, u, side="right"), cumulative.size - 1))


def token_by_token(
    model: StepModel,
    first_tokens: np.ndarray,
    max_lengths: np.ndarray,
    *,
    choose: Chooser,
    eos: int,
    alpha: float = DEFAULT_LENGTH_PENALTY,
) -> list[Hypothesis]:
    """One hypothesis per row, each token picked by ``choose`` (:func:`greedy_chooser` or a
    :class:`Sampler`'s) until ``<eos>`` or ``max_lengths`` tokens. Greedy decoding gives what
    :func:`beam_search` gives with ``beam=1``, without its bookkeeping. Finished rows leave
    the model as beam search's done inputs do (:func:`_inputs_to_keep`)."""
    first = np.asarray(first_tokens, dtype=np.int64)
    limits = np.asarray(max_lengths, dtype=np.int64)
    rows = first.size
    history = np.full((rows, int(limits.max(initial=0))), -1, dtype=np.int64)
    log_prob = np.zeros(rows)
    active = limits > 0
    slots = np.arange(rows)  # the inputs the model's rows hold, in its row order
    prev = first
    for position in range(history.shape[1]):
        active &= position < limits
        if not active.any():
            break
        live = active[slots]
        tokens, chosen = choose(model.step(prev, position), live, slots)
        history[slots[live], position] = tokens[live]
        log_prob[slots[live]] += chosen[live]
        active[slots] = live & (tokens != eos)
        prev = np.where(active[slots], tokens, eos)
        kept = _inputs_to_keep(~active[slots] | (position + 1 >= limits[slots]))
        if kept is not None:
            model.reorder(kept)
            slots, prev = slots[kept], prev[kept]
    return [
        _hypothesis(history[r][history[r] >= 0], float(log_prob[r]), eos, alpha)
        for r in range(rows)
    ]


def decode(
    model: StepModel,
    first_tokens: np.ndarray,
    max_lengths: np.ndarray,
    options: DecodeOptions,
    *,
    eos: int,
    banned: Collection[int] = (),
    lines: Sequence[int] = (),
) -> list[list[Hypothesis]]:
    """Up to ``options.nbest`` hypotheses per input, by the search ``options`` ask for:
    sampling, greedy (``beam_size`` 1) or beam search. ``model`` holds ``beam_size`` rows per
    input for beam search, one otherwise; ``lines`` are the inputs' line numbers (seeds of
    the sampler)."""
    alpha = options.length_penalty
    if options.sample:
        sampler = Sampler(
            temperature=options.temperature,
            top_k=options.top_k,
            top_p=options.top_p,
            seed=options.seed,
            banned=banned,
        )
        choose = sampler.chooser(lines)
    elif options.beam_size == 1:
        choose = greedy_chooser(banned)
    else:
        return beam_search(
            model,
            first_tokens,
            max_lengths,
            beam=options.beam_size,
            eos=eos,
            alpha=alpha,
            nbest=options.nbest,
            banned=banned,
        )
    hyps = token_by_token(model, first_tokens, max_lengths, choose=choose, eos=eos, alpha=alpha)
    return [[h] for h in hyps]


def rows_per_input(options: DecodeOptions) -> int:
    """How many model rows each input needs under ``options`` (its beam)."""
    return 1 if options.sample else options.beam_size


def rerank(
    candidates: Sequence[Hypothesis],
    other_log_probs: Sequence[Sequence[float]],
    *,
    alpha: float,
    nbest: int,
) -> list[Hypothesis]:
    """``candidates`` (one input's hypotheses) ranked again by the mean of their log
    probability and those further models gave them (``other_log_probs[m][k]``: model ``m``'s
    log probability of candidate ``k``, over the same positions), divided by the length
    penalty: the ``nbest`` best, best first, each with that mean as its ``log_prob``. Ties
    keep the candidates' order."""
    models = 1 + len(other_log_probs)
    ranked = []
    for k, hyp in enumerate(candidates):
        mean = (hyp.log_prob + sum(float(lp[k]) for lp in other_log_probs)) / models
        score = mean / float(length_penalty(hyp.length, alpha))
        ranked.append(Hypothesis(hyp.tokens, mean, score, hyp.ended))
    order = sorted(range(len(ranked)), key=lambda k: (-ranked[k].score, k))
    return [ranked[k] for k in order[:nbest]]
