"""The decoding side of ``mxtrain predict``: its decoding flags (:class:`DecodeFlags` ->
:class:`~mxtrain.decoding.search.DecodeOptions`), its predict batches and the records, csv
rows and arrays of decoded lines (:class:`DecodedLines`).

The searches themselves (beam search, greedy, sampling) are :mod:`mxtrain.decoding.search`,
which fit's evaluations share; seq2seq predict is :mod:`mxtrain.inference.seq2seq`, language
model generation :mod:`mxtrain.inference.generate`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import numpy as np

from mxtrain.data.base import TASK_SEQ2SEQ
from mxtrain.decoding.search import (
    DEFAULT_BEAM_SIZE,
    DEFAULT_LENGTH_PENALTY,
    DEFAULT_MAX_OUTPUT_ADD,
    DEFAULT_MAX_OUTPUT_RATIO,
    DEFAULT_MAX_TOKENS,
    DecodeOptions,
    Hypothesis,
)
from mxtrain.errors import ConfigError

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
