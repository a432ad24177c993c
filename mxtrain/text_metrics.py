"""Metrics of decoded sequences: BLEU, chrF, sequence error rate (WER) and token error rate
(PER/CER), and the table of these "decoding metrics" that config, fit and score consult.

Unlike the device metrics of :mod:`mxtrain.metrics`, which read the model's softmax batch by
batch under teacher forcing, these score whole output strings against reference strings, so
they need the eval set decoded first (a seq2seq model's beam search). Every score is in
percent (0-100), as sacreBLEU reports BLEU and chrF and as the G2P papers report WER and PER.

References come one or several per input: ``references[i]`` is a string, or a sequence of
strings when input ``i`` has several right answers (a word with several pronunciations).
BLEU and chrF are sacreBLEU's own corpus scores (BLEU with its default ``13a`` tokenization,
chrF with its defaults: character 6-grams, beta 2). No MXNet import here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TypeAlias, cast

#: how a string is split into the tokens that WER and PER compare (a run's ``tokens`` setting):
#: ``whitespace``: the words between runs of whitespace; ``chars``: every character of the
#: string with its whitespace runs collapsed to one space (a space counts as a character)
TOKENS = ("whitespace", "chars")

#: one reference string per input, or a sequence of acceptable references per input
References: TypeAlias = Sequence[str | Sequence[str]]


def split_tokens(text: str, tokens: str = "whitespace") -> list[str]:
    """``text`` as the tokens WER and PER compare (see :data:`TOKENS`); leading and trailing
    whitespace never counts."""
    if tokens == "whitespace":
        return text.split()
    if tokens == "chars":
        return list(" ".join(text.split()))
    raise ValueError(f"tokens must be one of {', '.join(TOKENS)}, got {tokens!r}")


def edit_distance(hypothesis: Sequence[str], reference: Sequence[str]) -> int:
    """Levenshtein distance: the fewest insertions, deletions and substitutions of single
    tokens that turn ``hypothesis`` into ``reference`` (O(len * len), for short sequences)."""
    previous = list(range(len(reference) + 1))
    for i, token in enumerate(hypothesis, start=1):
        current = [i]
        for j, wanted in enumerate(reference, start=1):
            current.append(
                min(
                    previous[j] + 1,  # token deleted
                    current[j - 1] + 1,  # wanted inserted
                    previous[j - 1] + (token != wanted),  # kept or substituted
                )
            )
        previous = current
    return previous[-1]


def reference_sets(hypotheses: Sequence[str], references: References) -> list[list[str]]:
    """Each input's references as a list of strings, checked against the hypotheses: as many
    inputs on both sides, at least one of each, and at least one reference per input."""
    if isinstance(hypotheses, str) or isinstance(references, str):
        raise TypeError("hypotheses and references must be sequences of strings, not a string")
    if len(hypotheses) != len(references):
        raise ValueError(
            f"{len(hypotheses)} hypotheses but {len(references)} references: one entry "
            "(a string or a list of strings) per hypothesis is needed"
        )
    if not hypotheses:
        raise ValueError("no hypotheses to score: a corpus score needs at least one")
    sets = [[refs] if isinstance(refs, str) else list(refs) for refs in references]
    for i, refs in enumerate(sets):
        if not refs:
            raise ValueError(f"input {i} has an empty list of references")
    return sets


def _reference_streams(sets: list[list[str]]) -> list[list[str]]:
    """sacreBLEU's layout: stream k holds every input's k-th reference, None where an input
    has fewer (sacreBLEU documents and skips those, though its annotation says str)."""
    width = max(len(refs) for refs in sets)
    streams = [[refs[k] if k < len(refs) else None for refs in sets] for k in range(width)]
    return cast("list[list[str]]", streams)


def bleu(hypotheses: Sequence[str], references: References) -> float:
    """Corpus BLEU (0-100) by sacreBLEU with its defaults: ``13a`` tokenization, exponential
    smoothing, case-sensitive, 4-grams; several references per input count together."""
    # deferred: import cost (~0.1 s); config validation and `mxtrain check` read this module
    from sacrebleu.metrics import BLEU

    streams = _reference_streams(reference_sets(hypotheses, references))
    return float(BLEU().corpus_score(list(hypotheses), streams).score)


def chrf(hypotheses: Sequence[str], references: References) -> float:
    """Corpus chrF (0-100) by sacreBLEU with its defaults (character 6-grams, beta 2, no word
    n-grams); with several references each input counts its best-matching one."""
    # deferred: import cost (~0.1 s); config validation and `mxtrain check` read this module
    from sacrebleu.metrics import CHRF

    streams = _reference_streams(reference_sets(hypotheses, references))
    return float(CHRF().corpus_score(list(hypotheses), streams).score)


def sequence_error_rate(
    hypotheses: Sequence[str], references: References, tokens: str = "whitespace"
) -> float:
    """WER as the G2P papers use it: the percentage of outputs whose tokens are not exactly
    those of a reference (of any one, when an input has several)."""
    sets = reference_sets(hypotheses, references)
    wrong = 0
    for hypothesis, refs in zip(hypotheses, sets, strict=True):
        output = split_tokens(hypothesis, tokens)
        wrong += all(split_tokens(ref, tokens) != output for ref in refs)
    return 100.0 * wrong / len(sets)


def token_error_rate(
    hypotheses: Sequence[str], references: References, tokens: str = "whitespace"
) -> float:
    """PER (phones) or CER (``tokens="chars"``): the total token edit distance over the total
    number of reference tokens, in percent.

    With several references an input is measured against its closest one (the fewest edits;
    on a tie the one listed first), whose length then counts in the total, as the G2P papers
    do. An empty reference adds no tokens, so an output for it counts its tokens as errors.
    Raises ValueError when no reference has a token (the rate has no denominator).
    """
    sets = reference_sets(hypotheses, references)
    edits = total = 0
    for hypothesis, refs in zip(hypotheses, sets, strict=True):
        output = split_tokens(hypothesis, tokens)
        candidates = [split_tokens(ref, tokens) for ref in refs]
        distance, closest = min(
            ((edit_distance(output, ref), ref) for ref in candidates), key=lambda pair: pair[0]
        )
        edits += distance
        total += len(closest)
    if total == 0:
        raise ValueError("the references have no tokens: the token error rate is undefined")
    return 100.0 * edits / total


@dataclass(frozen=True)
class DecodingMetric:
    """One metric of decoded output: its name in configs and logs, which way is better, a
    one-line summary for ``mxtrain list metrics``, and how to compute it over a corpus
    (``compute(hypotheses, references, tokens)``; ``tokens`` as in :data:`TOKENS`)."""

    name: str
    lower_is_better: bool
    summary: str
    compute: Callable[[Sequence[str], References, str], float]


def _corpus_bleu(hypotheses: Sequence[str], references: References, _tokens: str) -> float:
    return bleu(hypotheses, references)  # sacreBLEU tokenizes itself (13a)


def _corpus_chrf(hypotheses: Sequence[str], references: References, _tokens: str) -> float:
    return chrf(hypotheses, references)  # characters, whatever the run's tokens


#: the decoding metrics by name: fit.eval_metrics, checkpoint.best_metric and
#: fit.early_stopping.metric may name them for a seq2seq model; fit.metrics may not (they are
#: not computed per batch)
DECODING_METRICS: Mapping[str, DecodingMetric] = MappingProxyType(
    {
        metric.name: metric
        for metric in (
            DecodingMetric(
                "bleu",
                False,
                "corpus BLEU (sacreBLEU, 13a tokenization), 0-100",
                _corpus_bleu,
            ),
            DecodingMetric(
                "chrf",
                False,
                "corpus chrF (sacreBLEU: character 6-grams, beta 2), 0-100",
                _corpus_chrf,
            ),
            DecodingMetric(
                "wer",
                True,
                "% of outputs equal to no reference (sequence error rate)",
                sequence_error_rate,
            ),
            DecodingMetric(
                "per",
                True,
                "% edits per reference token (PER; CER for tokens: chars)",
                token_error_rate,
            ),
        )
    }
)


def is_decoding_metric(name: str) -> bool:
    """Whether ``name`` is a metric of decoded output (one of :data:`DECODING_METRICS`)."""
    return name in DECODING_METRICS


def decoding_scores(
    names: Sequence[str],
    hypotheses: Sequence[str],
    references: References,
    tokens: str = "whitespace",
) -> dict[str, float]:
    """The decoding metrics ``names`` of one decoded corpus, by name, in the order asked.

    ``hypotheses`` are the outputs as text (tokens joined back the way the data splits
    them), ``references`` one string or several per output, ``tokens`` the run's
    ``whitespace``/``chars`` setting (what WER and PER compare).
    """
    unknown = [name for name in names if name not in DECODING_METRICS]
    if unknown:
        raise ValueError(
            f"not decoding metrics: {', '.join(unknown)} (known: {', '.join(DECODING_METRICS)})"
        )
    if tokens not in TOKENS:
        raise ValueError(f"tokens must be one of {', '.join(TOKENS)}, got {tokens!r}")
    return {name: DECODING_METRICS[name].compute(hypotheses, references, tokens) for name in names}
