"""Metrics of decoded output: BLEU and chrF are sacreBLEU's own numbers; WER and PER on
hand-computed corpora (several references, empty strings, whitespace vs character tokens)."""

from __future__ import annotations

import functools

import pytest
import sacrebleu
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from mxtrain.cli.main import cli
from mxtrain.metric_tracker import lower_is_better
from mxtrain.text_metrics import (
    DECODING_METRICS,
    bleu,
    chrf,
    decoding_scores,
    edit_distance,
    is_decoding_metric,
    sequence_error_rate,
    split_tokens,
    token_error_rate,
)

HYPOTHESES = [
    "the cat sat on the mat today",
    "a quick brown fox jumps over a lazy dog",
    "it is raining , again .",
    "short one",
]
REFERENCES = [
    "the cat is sitting on the mat today",
    "the quick brown fox jumped over the lazy dog",
    "it 's raining again .",
    "a short one",
]
SECOND_REFERENCES = [
    "today the cat sat on the mat",
    "a fast brown fox jumps over a lazy dog",
    "it rains again .",
    "short one",
]

# a perfect score goes through exp(mean(log(100 * precision))) in float64: a few rounding
# steps, each at most one ulp (2.2e-16 relative) of a number at most 100
CLOSE = 100 * 8 * 2.3e-16


def test_bleu_is_sacrebleus_corpus_bleu() -> None:
    expected = sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES]).score
    assert 0 < expected < 100
    assert bleu(HYPOTHESES, REFERENCES) == expected  # the same computation: exactly equal


def test_chrf_is_sacrebleus_corpus_chrf() -> None:
    expected = sacrebleu.corpus_chrf(HYPOTHESES, [REFERENCES]).score
    assert 0 < expected < 100
    assert chrf(HYPOTHESES, REFERENCES) == expected


def test_several_references_per_input_are_sacrebleus_reference_streams() -> None:
    both = [[a, b] for a, b in zip(REFERENCES, SECOND_REFERENCES, strict=True)]
    streams = [REFERENCES, SECOND_REFERENCES]
    assert bleu(HYPOTHESES, both) == sacrebleu.corpus_bleu(HYPOTHESES, streams).score
    assert chrf(HYPOTHESES, both) == sacrebleu.corpus_chrf(HYPOTHESES, streams).score
    # a second reference helps: "short one" and the fox line match one exactly
    assert bleu(HYPOTHESES, both) > bleu(HYPOTHESES, REFERENCES)


def test_inputs_may_have_different_numbers_of_references() -> None:
    """A missing reference is no reference (not an empty one): the same as repeating one of
    the input's own references, which adds no n-gram and no closer length."""
    ragged: list[str | list[str]] = [[REFERENCES[0], SECOND_REFERENCES[0]], *REFERENCES[1:]]
    padded = [[REFERENCES[0], SECOND_REFERENCES[0]]] + [[r, r] for r in REFERENCES[1:]]
    assert bleu(HYPOTHESES, ragged) == bleu(HYPOTHESES, padded)
    assert chrf(HYPOTHESES, ragged) == chrf(HYPOTHESES, padded)
    single = [[r] for r in REFERENCES]
    assert bleu(HYPOTHESES, single) == bleu(HYPOTHESES, REFERENCES)


def test_bleu_and_chrf_of_identical_and_disjoint_corpora() -> None:
    assert bleu(REFERENCES, REFERENCES) == pytest.approx(100.0, abs=CLOSE)
    assert chrf(REFERENCES, REFERENCES) == pytest.approx(100.0, abs=CLOSE)
    disjoint = ["xx yy 77 ww vv"] * len(REFERENCES)
    assert bleu(disjoint, REFERENCES) == 0.0
    assert chrf(["7777"] * len(REFERENCES), REFERENCES) == 0.0


def test_sequence_error_rate_counts_outputs_equal_to_no_reference() -> None:
    hypotheses = ["HH AH0 L OW1", "W ER1 L D", "T EH1 S T", "  R IY1   D "]
    references = [
        "HH AH0 L OW1",
        ["W ER0 L D", "W ER1 L D"],  # matches the second pronunciation: right
        "T EH1 S",
        "R IY1 D",  # whitespace around and between tokens does not count
    ]
    assert sequence_error_rate(hypotheses, references) == pytest.approx(100 * 1 / 4)
    assert sequence_error_rate(["", "a"], ["", "b"]) == 50.0  # empty equals empty


def test_token_error_rate_uses_the_closest_reference_and_its_length() -> None:
    # 1 edit of 2 tokens; then "x y" is 2 edits from "x z w" but 1 from "x y z" (3 tokens)
    hypotheses = ["a b c", "x y"]
    references: list[str | list[str]] = ["a c", ["x z w", "x y z"]]
    assert token_error_rate(hypotheses, references) == pytest.approx(100 * 2 / 5)
    # a tie goes to the reference listed first, whose length counts
    assert token_error_rate(["a b c"], [["a b", "a b c d"]]) == pytest.approx(100 * 1 / 2)
    assert token_error_rate(["a b c"], [["a b c d", "a b"]]) == pytest.approx(100 * 1 / 4)


def test_token_error_rate_with_empty_strings() -> None:
    assert token_error_rate([""], ["a b"]) == 100.0  # two deletions of two tokens
    # an output for an empty reference is all insertions, and adds nothing to the total
    assert token_error_rate(["a", "b c"], ["", "b c"]) == pytest.approx(100 * 1 / 2)
    with pytest.raises(ValueError, match="no tokens"):
        token_error_rate(["a", ""], ["", " "])


def test_whitespace_and_character_tokens() -> None:
    assert split_tokens(" ab  c ", "whitespace") == ["ab", "c"]
    assert split_tokens(" ab  c ", "chars") == ["a", "b", " ", "c"]
    # whitespace: "ab c" -> "abc" is a substitution and a deletion, of 1 reference token
    assert token_error_rate(["ab c"], ["abc"], "whitespace") == 200.0
    # characters: one deleted space, of 3 reference characters
    assert token_error_rate(["ab c"], ["abc"], "chars") == pytest.approx(100 / 3)
    assert sequence_error_rate(["k ae t"], ["k  ae t"], "chars") == 0.0
    with pytest.raises(ValueError, match="tokens must be one of"):
        split_tokens("a", "bytes")


def test_edit_distance_by_hand() -> None:
    assert edit_distance(list("kitten"), list("sitting")) == 3
    assert edit_distance([], list("abc")) == 3 and edit_distance(list("abc"), []) == 3
    assert edit_distance([], []) == 0
    assert edit_distance(["HH", "AH0"], ["HH", "AH1"]) == 1


@functools.cache
def _distance_by_definition(a: str, b: str) -> int:
    """The recursive definition, for tiny strings only."""
    if not a or not b:
        return len(a) + len(b)
    return min(
        _distance_by_definition(a[1:], b) + 1,
        _distance_by_definition(a, b[1:]) + 1,
        _distance_by_definition(a[1:], b[1:]) + (a[0] != b[0]),
    )


@given(st.text("abc", max_size=6), st.text("abc", max_size=6))
def test_edit_distance_matches_the_recursive_definition(a: str, b: str) -> None:
    assert edit_distance(list(a), list(b)) == _distance_by_definition(a, b)


def test_corpus_shapes_are_checked() -> None:
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        sequence_error_rate(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="no hypotheses"):
        bleu([], [])
    with pytest.raises(ValueError, match="input 1 has an empty list"):
        token_error_rate(["a", "b"], ["a", []])
    with pytest.raises(TypeError, match="not a string"):
        sequence_error_rate("a b", "a b")


def test_decoding_scores_by_name() -> None:
    hypotheses, references = ["a b c d e", "x y"], ["a b c d e", ["x z", "x y"]]
    scores = decoding_scores(["wer", "bleu", "per", "chrf"], hypotheses, references)
    assert list(scores) == ["wer", "bleu", "per", "chrf"]
    assert scores["wer"] == 0.0 and scores["per"] == 0.0
    assert scores["bleu"] == bleu(hypotheses, references)
    assert scores["chrf"] == chrf(hypotheses, references)
    chars = decoding_scores(["per"], ["ab"], ["abc"], tokens="chars")
    assert chars == {"per": pytest.approx(100 / 3)}
    with pytest.raises(ValueError, match="not decoding metrics: perplexity"):
        decoding_scores(["bleu", "perplexity"], hypotheses, references)
    with pytest.raises(ValueError, match="tokens must be one of"):
        decoding_scores(["wer"], hypotheses, references, tokens="words")


def test_the_table_says_which_way_is_better() -> None:
    assert [m.name for m in DECODING_METRICS.values()] == list(DECODING_METRICS)
    assert {n for n, m in DECODING_METRICS.items() if m.lower_is_better} == {"wer", "per"}
    assert is_decoding_metric("bleu") and not is_decoding_metric("perplexity")


def test_the_metric_tracker_judges_decoding_metrics_by_their_table_entry() -> None:
    assert lower_is_better("wer") and lower_is_better("per")
    assert not lower_is_better("bleu") and not lower_is_better("chrf")
    assert not lower_is_better("wer", "max")  # the config's mode still wins


def test_list_metrics_shows_the_decoding_metrics_marked() -> None:
    result = CliRunner().invoke(cli, ["list", "metrics"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line for line in result.output.splitlines()[1:]}
    for name in DECODING_METRICS:
        assert rows[name].endswith("[seq2seq, decoded output]")
    assert "[seq2seq" not in rows["perplexity"]
