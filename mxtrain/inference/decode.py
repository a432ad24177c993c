"""Decoding a step model: batched beam search, greedy decoding and sampling (issue 30).

The searches are plain NumPy over a small protocol, :class:`StepModel`: ``step(prev_tokens,
position)`` runs one decoder step for every row and returns its :class:`StepScores` (log
probabilities over the output vocabulary, read as the k best per row or whole), and
``reorder(rows)`` makes row ``i`` continue from the state of row ``rows[i]`` (beam search
keeps the best hypotheses). Seq2seq models (:mod:`mxtrain.inference.seq2seq`) and language
models (:mod:`mxtrain.inference.generate`) implement it on the device; the tests with NumPy
fakes.

Beam search needs only each row's ``beam`` best tokens: the best ``beam`` continuations of a
sentence are among them. :class:`DeviceScores` picks them on the device (``topk``), so only
(rows, beam) values reach the host per step, never the (rows, vocabulary) log-probabilities;
the recurrent states never leave the device (``take`` reorders them there). Measured on a
2-core CPU for 160 rows (32 inputs x beam 5): ``topk`` then copying (160, 7) took 2.9 ms for
10k words and 8.3 ms for 32k, copying the whole (160, V) and ``argpartition`` on the host
24.6 and 67 ms; for a 60-symbol G2P vocabulary 0.18 against 0.11 ms, small next to a step.
Sampling reads the whole distribution of each row (it draws from all of it).

Scores: a hypothesis's ``log_prob`` is the sum of the natural-log probabilities of its tokens,
the ``<eos>`` that ended it included; its ``score`` is ``log_prob / lp(length)`` with the GNMT
length penalty ``lp(n) = ((5 + n) / 6) ** alpha`` (Wu et al. 2016), ``n`` counting ``<eos>``.
Beam search ranks hypotheses of different lengths by ``score``. ``alpha`` defaults to 1.0,
Sockeye's default (GNMT tuned 0.6 for its models); 0 ranks by ``log_prob`` alone.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Protocol

import numpy as np

from mxtrain.data.base import TASK_SEQ2SEQ
from mxtrain.errors import ConfigError

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


#: ``predict --task generate``: language models continue each line
TASK_GENERATE = "generate"


@dataclass(frozen=True)
class DecodeFlags:
    """The decoding flags of ``mxtrain predict`` as given (None: left out)."""

    beam_size: int | None = None
    nbest: int | None = None
    length_penalty: float | None = None
    max_output_ratio: float | None = None
    max_output_add: int | None = None
    max_tokens: int | None = None
    sample: bool = False
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None

    def given(self) -> list[str]:
        """The flags given, as ``--name``."""
        named = [
            f for f in fields(self) if f.name != "sample" and getattr(self, f.name) is not None
        ]
        flags = [f"--{f.name.replace('_', '-')}" for f in named]
        return ["--sample", *flags] if self.sample else flags

    def samples(self, top_k: int) -> bool:
        """Whether these flags (and ``--top-k``, with generate) ask for sampling."""
        return self.sample or self.temperature is not None or self.top_p is not None or top_k > 0


SEQ2SEQ_ONLY = ("--max-output-ratio", "--max-output-add")
GENERATE_ONLY = ("--max-tokens", "--sample", "--temperature", "--top-p", "--seed")


def _refuse(flags: Sequence[str], why: str, hint: str) -> None:
    if flags:
        raise ConfigError(f"{' and '.join(flags)}: {why}", hint=hint)


def decode_options(
    flags: DecodeFlags, task: str | None, generate: bool, top_k: int
) -> DecodeOptions:
    """The options of a decoding ``predict`` (``task``: the model's; ``generate``: ``--task
    generate``), or a ConfigError for a flag that does not apply or does not fit another."""
    given = flags.given()
    _check_ranges(flags)
    if not generate and task != TASK_SEQ2SEQ:
        _refuse(
            given,
            f"decoding flags, but this model's task is {task!r}: predict scores its lines.",
            "Leave them out, or use --task generate with a language model (decoding flags "
            "apply to it and to seq2seq models).",
        )
        return DecodeOptions()
    if not generate:
        _refuse(
            [f for f in given if f in GENERATE_ONLY],
            "apply to --task generate (language models) only; a seq2seq model is decoded by "
            "beam search.",
            "Leave them out, or give --beam-size 1 for greedy decoding.",
        )
        _refuse(
            ["--top-k"] if top_k else [],
            "lists the most likely outcomes of scored records; seq2seq outputs are decoded texts.",
            "Leave --top-k out; --nbest N lists the N best outputs.",
        )
    else:
        _refuse(
            [f for f in given if f in SEQ2SEQ_ONLY],
            "bound seq2seq outputs by their source's length; a prompt has none.",
            "Use --max-tokens N for generation.",
        )
    sampling = generate and flags.samples(top_k)
    beam = flags.beam_size or (1 if generate else DEFAULT_BEAM_SIZE)
    nbest = flags.nbest or 1
    if sampling:
        _refuse(
            [f for f in ("--beam-size", "--nbest") if f in given and (beam > 1 or nbest > 1)],
            "sampling draws one continuation per prompt; beam search keeps several.",
            "Leave out --sample, --temperature, --top-k and --top-p for beam search, or "
            "--beam-size and --nbest for sampling.",
        )
    else:
        _refuse(
            ["--seed"] if flags.seed is not None else [],
            "seeds sampling; greedy and beam search draw nothing.",
            "Add --sample (or --temperature, --top-k, --top-p), or leave out --seed.",
        )
    if nbest > beam:
        raise ConfigError(
            f"--nbest {nbest} asks for more outputs than the beam keeps (--beam-size {beam}).",
            hint=f"Give --beam-size {nbest} or more, or --nbest {beam} or less.",
        )
    return DecodeOptions(
        beam_size=1 if sampling else beam,
        nbest=nbest,
        length_penalty=_or(flags.length_penalty, DEFAULT_LENGTH_PENALTY),
        max_output_ratio=_or(flags.max_output_ratio, DEFAULT_MAX_OUTPUT_RATIO),
        max_output_add=_or(flags.max_output_add, DEFAULT_MAX_OUTPUT_ADD),
        max_tokens=_or(flags.max_tokens, DEFAULT_MAX_TOKENS),
        sample=sampling,
        temperature=_or(flags.temperature, 1.0),
        top_k=top_k if sampling else 0,
        top_p=_or(flags.top_p, 1.0),
        seed=_or(flags.seed, 0),
    )


#: flag -> (the lowest value, whether it must be above it), and --top-p at most 1
_LOWEST = {
    "beam_size": (1, False),
    "nbest": (1, False),
    "length_penalty": (0, False),
    "max_output_ratio": (0, False),
    "max_output_add": (0, False),
    "max_tokens": (1, False),
    "temperature": (0, True),
    "top_p": (0, True),
}


def _check_ranges(flags: DecodeFlags) -> None:
    for name, (lowest, above) in _LOWEST.items():
        value = getattr(flags, name)
        if value is None or (value > lowest if above else value >= lowest):
            continue
        flag = "--" + name.replace("_", "-")
        raise ConfigError(
            f"{flag} {value}: must be {'above' if above else 'at least'} {lowest}.",
            hint=f"Give a larger {flag}, or leave it out for its default.",
        )
    if flags.top_p is not None and flags.top_p > 1:
        raise ConfigError(
            f"--top-p {flags.top_p}: a probability mass, at most 1.",
            hint="Give --top-p in (0, 1]; 1 keeps every token.",
        )


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


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
        """Row ``i`` continues from the state of row ``rows[i]``."""
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
) -> list[list[Hypothesis]]:
    """The ``nbest`` best hypotheses of each of ``len(first_tokens)`` inputs, best first.

    ``model`` holds ``beam`` rows per input (input ``b`` in rows ``b * beam ..``), all in the
    same state; ``first_tokens`` (inputs,) is what its first step reads (``<bos>``), and
    input ``b`` gets at most ``max_lengths[b]`` output tokens (``<eos>`` included).

    Each step extends every unfinished hypothesis by each row's best tokens (never one of
    ``banned``) and keeps, per input, the ``beam`` best by score among the extensions and the
    finished hypotheses; one that picks ``<eos>`` is finished: it keeps its score and stops
    growing. An input is done when all its hypotheses are finished or reach its maximum
    length; the search stops when every input is done.
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
    history = np.zeros((inputs * k, 0), dtype=np.int64)
    prev = np.repeat(first, k)
    base = (np.arange(inputs) * k)[:, None]
    for position in range(int(limits.max(initial=0))):
        done |= (position >= limits)[:, None]
        if done.all():
            break
        vals, ids = model.step(prev, position).top(k + len(banned))
        vals = vals.astype(np.float64)
        if banned:
            vals[np.isin(ids, list(banned))] = -np.inf
        width = vals.shape[1] + 1  # each row's tokens, then "stay" for a finished one
        grown = np.where(done[..., None], -np.inf, raw[..., None] + vals.reshape(inputs, k, -1))
        stay = np.where(done, raw, -np.inf)[..., None]
        candidates = np.concatenate([grown, stay], axis=2)
        lengths = np.concatenate(
            [np.full(grown.shape, position + 1), length[..., None]], axis=2
        ).reshape(inputs, -1)
        flat = candidates.reshape(inputs, -1)
        ranked = flat / length_penalty(lengths, alpha)
        best = np.argsort(-ranked, axis=1, kind="stable")[:, :k]
        parent, column = best // width, best % width
        stays = column == width - 1
        token = ids.reshape(inputs, k, -1)[
            np.arange(inputs)[:, None], parent, np.minimum(column, width - 2)
        ]
        raw = np.take_along_axis(flat, best, axis=1)
        length = np.take_along_axis(lengths, best, axis=1)
        rows = (base + parent).ravel()
        step_tokens = np.where(stays, -1, token)
        history = np.concatenate([history[rows], step_tokens.reshape(-1, 1)], axis=1)
        done = stays | (token == eos) | np.isneginf(raw)
        model.reorder(rows)
        prev = np.where(stays, eos, token).ravel()
    return _best(raw, length, history.reshape(inputs, k, -1), eos, alpha, nbest)


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


#: ``choose(scores, active) -> (token ids, their log-probabilities)``, (rows,) each
Chooser = Callable[[StepScores, np.ndarray], tuple[np.ndarray, np.ndarray]]


def greedy_chooser(banned: Collection[int] = ()) -> Chooser:
    """Each row's most likely token that is not ``banned`` (ties: the lowest id first, as
    ``topk`` orders them)."""

    def choose(scores: StepScores, active: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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

        def choose(scores: StepScores, active: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            log_probs = scores.full().astype(np.float64)
            tokens = np.zeros(log_probs.shape[0], dtype=np.int64)
            for r in np.flatnonzero(active):
                tokens[r] = self.draw(log_probs[r], generators[r])
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
    :func:`beam_search` gives with ``beam=1``, without its bookkeeping."""
    first = np.asarray(first_tokens, dtype=np.int64)
    limits = np.asarray(max_lengths, dtype=np.int64)
    rows = first.size
    history = np.full((rows, int(limits.max(initial=0))), -1, dtype=np.int64)
    log_prob = np.zeros(rows)
    active = limits > 0
    prev = first
    for position in range(history.shape[1]):
        active &= position < limits
        if not active.any():
            break
        tokens, chosen = choose(model.step(prev, position), active)
        history[active, position] = tokens[active]
        log_prob[active] += chosen[active]
        active &= tokens != eos
        prev = np.where(active, tokens, eos)
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


class DeviceScores:
    """:class:`StepScores` of an NDArray of log-probabilities on the device: ``top`` picks on
    the device (``topk``), so only (rows, k) values are copied to the host."""

    def __init__(self, log_probs: Any) -> None:
        self.log_probs = log_probs

    def top(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        # deferred: MXNet reads its thread settings when it loads (devices.configure_threads)
        import mxnet as mx

        k = min(k, int(self.log_probs.shape[1]))
        vals, ids = mx.nd.topk(self.log_probs, axis=1, k=k, ret_typ="both", is_ascend=False)
        return vals.asnumpy(), np.rint(ids.asnumpy()).astype(np.int64)

    def full(self) -> np.ndarray:
        return np.asarray(self.log_probs.asnumpy())


@contextmanager
def graphs_fit(params_file: Any) -> Iterator[None]:
    """Within the block, a decoding graph that the checkpoint's arrays do not fit (the graph
    runner's ``GraphMismatch``, a ValueError) is a ConfigError naming ``params_file``."""
    # deferred: the runner imports MXNet, which reads its thread settings when it loads
    from mxtrain.engine.graph_runner import GraphMismatch

    try:
        yield
    except GraphMismatch as exc:
        raise ConfigError(
            f"{params_file}: the checkpoint does not fit the model's decoding graphs: {exc}.",
            hint="Decode with the run's own config (no --set model.*=...).",
        ) from exc


def batch_lines(batch: Any, unit: str) -> np.ndarray:
    """The 0-based input line of each row of a predict batch (-1: a padding row), or a
    ConfigError when the iterator's batches do not say (``unit``: what a row holds)."""
    index = getattr(batch, "index", None)
    if index is None:
        raise ConfigError(
            f"The data iterator's batches have no 'index' (the input line of each {unit}), so "
            "outputs cannot be matched with their input lines."
        )
    return np.asarray(index, dtype=np.int64)


def repeat_rows(arrays: Sequence[Any], times: int, axes: Sequence[int] | None = None) -> list[Any]:
    """Each NDArray with every row repeated ``times`` times in place (a beam); rows along
    ``axes`` (one per array; default 0: the contract's seq2seq states; a fused RNN's states
    have the batch on axis 1)."""
    # deferred: MXNet reads its thread settings when it loads (devices.configure_threads)
    import mxnet as mx

    if times == 1:
        return list(arrays)
    axes = axes or [0] * len(arrays)
    return [mx.nd.repeat(a, repeats=times, axis=x) for a, x in zip(arrays, axes, strict=True)]


def take_rows(
    arrays: Sequence[Any], rows: np.ndarray, axes: Sequence[int] | None = None
) -> list[Any]:
    """Each NDArray's rows ``rows`` (along ``axes``, default 0), on its device; nothing leaves
    it."""
    # deferred: MXNet reads its thread settings when it loads (devices.configure_threads)
    import mxnet as mx

    if not arrays:
        return []
    index = mx.nd.array(rows, ctx=arrays[0].context, dtype="int64")
    axes = axes or [0] * len(arrays)
    return [mx.nd.take(a, index, axis=x) for a, x in zip(arrays, axes, strict=True)]


class DecodedLines:
    """Hypotheses per input line (None: the line has none, e.g. blank), best first, and their
    texts, as the records, csv rows and structured arrays ``mxtrain predict`` writes.

    A subclass names the fields: ``HYPOTHESIS_FIELDS`` of each hypothesis and ``LINE_FIELDS``
    of each line, as (name, "text" or a NumPy type) pairs, and fills them in
    :meth:`hypothesis_fields` and :meth:`line_fields`. A record is ``{"line": 1-based,
    **line fields, **the best hypothesis's fields}`` (nulls without one), with ``nbest`` > 1
    also ``"nbest": [hypothesis fields, ...]``; csv and npy hold one row per hypothesis with
    its ``rank`` (1 = the best; a line without hypotheses: one row, rank empty or 0).
    """

    HYPOTHESIS_FIELDS: ClassVar[tuple[tuple[str, str], ...]] = ()
    LINE_FIELDS: ClassVar[tuple[tuple[str, str], ...]] = ()

    def __init__(
        self,
        hypotheses: list[list[Hypothesis] | None],
        texts: list[list[str] | None],
        nbest: int,
    ) -> None:
        self.hypotheses, self.texts, self.nbest = hypotheses, texts, nbest

    def hypothesis_fields(self, hypothesis: Hypothesis, text: str) -> dict[str, Any]:
        raise NotImplementedError

    def line_fields(self, i: int) -> dict[str, Any]:
        return {}

    def totals(self) -> tuple[int, int, int, float]:
        """(lines, lines without output, 0, 0.0): decoded text has no perplexity to report."""
        return len(self.hypotheses), sum(h is None for h in self.hypotheses), 0, 0.0

    def ranked(self, i: int) -> list[dict[str, Any]]:
        """Line ``i``'s hypotheses' fields, best first (empty without any)."""
        hyps, texts = self.hypotheses[i], self.texts[i]
        if hyps is None or texts is None:
            return []
        return [self.hypothesis_fields(h, t) for h, t in zip(hyps, texts, strict=True)]

    def records(self) -> Iterator[dict[str, Any]]:
        nulls = {name: None for name, _ in self.HYPOTHESIS_FIELDS}
        for i in range(len(self.hypotheses)):
            ranked = self.ranked(i)
            record: dict[str, Any] = {"line": i + 1, **self.line_fields(i)}
            record.update(ranked[0] if ranked else nulls)
            if self.nbest > 1:
                record["nbest"] = ranked or None
            yield record

    def _columns(self) -> list[tuple[str, str]]:
        return [("line", "<i8"), ("rank", "<i8"), *self.LINE_FIELDS, *self.HYPOTHESIS_FIELDS]

    def csv_header(self) -> list[str]:
        return [name for name, _ in self._columns()]

    def csv_rows(self) -> Iterator[list[Any]]:
        names = [name for name, _ in (*self.LINE_FIELDS, *self.HYPOTHESIS_FIELDS)]
        for i in range(len(self.hypotheses)):
            line = self.line_fields(i)
            ranked = self.ranked(i) or [{}]
            for rank, hypothesis in enumerate(ranked, start=1):
                values = {**line, **hypothesis}
                yield [i + 1, rank if hypothesis else None, *(values.get(n) for n in names)]

    def to_numpy(self) -> np.ndarray:
        """One row per hypothesis; null numbers are NaN (-1 for integers), null text ''."""
        columns = self._columns()
        rows = list(self.csv_rows())
        dtype = []
        for j, (name, kind) in enumerate(columns):
            if kind == "text":
                width = max([1, *(len(r[j]) for r in rows if r[j] is not None)])
                kind = f"<U{width}"
            dtype.append((name, kind))
        out = np.zeros(len(rows), dtype=dtype)
        for k, row in enumerate(rows):
            out[k] = tuple(
                _null_value(kind) if value is None else value
                for value, (_, kind) in zip(row, dtype, strict=True)
            )
        return out


def _null_value(kind: str) -> Any:
    if kind.startswith("<U"):
        return ""
    return np.nan if kind.startswith("<f") else -1
