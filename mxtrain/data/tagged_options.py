"""Options of the ``tagged_sequences`` iterator (no MXNet import: the config layer reads them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from mxtrain.data import source_options as shared
from mxtrain.data.bucket_sentence_options import DEFAULT_SPECIALS
from mxtrain.errors import InvalidValue
from mxtrain.option_checks import check_choice, check_positive_int, documented, not_int

FORMATS = ("auto", "conll", "conllu")
DELIMITERS = ("whitespace", "tab")

# Default columns (0-based; negative counts from the end, as in Python) per format.
CONLL_TOKEN_COLUMN = 0
CONLL_LABEL_COLUMN = -1
CONLLU_TOKEN_COLUMN = 1  # FORM
CONLLU_LABEL_COLUMN = 3  # UPOS
CONLLU_COLUMNS = 10


@dataclass(frozen=True)
class TaggedSequencesOptions(shared.SourceOptions):
    """Token/label sequences from CoNLL-style files, bucketed into (batch, time) batches.

    Construction checks the values and raises ``InvalidValue`` on impossible ones; the config
    loader turns that into a ``ConfigError`` pointing at the YAML file and line.
    """

    source: str = field(
        metadata={
            "doc": "a UTF-8 CoNLL or CoNLL-U file: one token per line, its columns separated by "
            "whitespace (or tabs), a blank line after each sentence (relative to the config "
            "file's folder)"
        },
    )
    format: Literal["auto", "conll", "conllu"] = documented(
        "auto",
        "conll: every line a token; conllu: 10 tab-separated columns, '#' comment "
        "lines, multi-word ranges (3-4) and empty nodes (5.1) skipped; auto: conllu when "
        "the first token line has 10 tab-separated columns and an integer ID, else conll",
    )
    delimiter: Literal["whitespace", "tab"] = documented(
        "whitespace",
        "conll columns are separated by any whitespace, or by single tabs (tokens "
        "may then contain spaces); conllu always uses tabs",
    )
    token_column: int | None = documented(
        None,
        "0-based column of the token (negative: from the end); null: 0 for conll, "
        "1 (FORM) for conllu",
    )
    label_column: int | None = documented(
        None,
        "0-based column of the label (negative: from the end); null: -1 (the last) "
        "for conll, 3 (UPOS) for conllu. Not read when predicting",
    )
    batch_size: int = shared.batch_size_field("sentences")
    buckets: list[int] | Literal["auto"] = shared.buckets_field("sentence lengths (tokens)")
    num_buckets: int | None = shared.num_buckets_field()
    auto_buckets: Literal["quantile", "padding"] = shared.auto_buckets_field()
    max_padding: float = shared.max_padding_field()
    shuffle: bool = shared.shuffle_field(
        "sentences and batches", "eval iterators always read in a fixed order"
    )
    min_count: int = documented(
        1,
        "tokens seen fewer times in the training data become <unk> (2 teaches the "
        "model what to do with unseen words); labels are always all kept",
    )
    max_vocab: int | None = documented(
        None, "largest token vocabulary size, the 3 specials <pad> <unk> <eos> included"
    )
    long_sentences: Literal["split", "truncate", "drop"] = shared.long_sentences_field(
        "; predicting never cuts a sentence"
    )
    max_sentences: int | None = shared.max_sentences_field("sentences")
    lowercase: bool = documented(False, "lowercase the tokens (not the labels) before lookup")
    vocab: str | None = shared.vocab_file_field()

    def validate(self) -> None:
        """Raise ``InvalidValue`` naming the first impossible value."""
        shared.check_source(self.source, "the path of a CoNLL or CoNLL-U file")
        check_choice("format", self.format, FORMATS)
        check_choice("delimiter", self.delimiter, DELIMITERS)
        shared.check_long_sentences(self.long_sentences)
        for name in ("token_column", "label_column"):
            value = getattr(self, name)
            if value is not None and not_int(value):
                raise InvalidValue(name, f"must be an integer column index or null, not {value!r}")
        if self.format == "conllu":
            for name in ("token_column", "label_column"):
                value = getattr(self, name)
                if value is not None and not -CONLLU_COLUMNS <= value < CONLLU_COLUMNS:
                    raise InvalidValue(
                        name,
                        f"must be between -{CONLLU_COLUMNS} and {CONLLU_COLUMNS - 1}: "
                        f"CoNLL-U lines have {CONLLU_COLUMNS} columns, not {value!r}",
                    )
        if (
            self.token_column is not None
            and self.label_column is not None
            and self.token_column == self.label_column
        ):
            raise InvalidValue(
                "token_column",
                f"and label_column are both {self.token_column}: the labels would be the tokens",
            )
        check_positive_int("batch_size", self.batch_size)
        shared.check_auto_buckets(self.auto_buckets, self.num_buckets, self.max_padding)
        check_positive_int("min_count", self.min_count)
        shared.check_optional_positive_int("max_sentences", self.max_sentences)
        shared.check_max_vocab(self.max_vocab, len(DEFAULT_SPECIALS))
        shared.check_buckets(self.buckets)
        shared.check_bucketed_batch(self.batch_size, self.buckets)
        shared.check_vocab_file(self.vocab)

    def columns(self, fmt: str) -> tuple[int, int]:
        """(token column, label column) for the resolved format ``conll`` or ``conllu``."""
        if fmt == "conllu":
            defaults = (CONLLU_TOKEN_COLUMN, CONLLU_LABEL_COLUMN)
        else:
            defaults = (CONLL_TOKEN_COLUMN, CONLL_LABEL_COLUMN)
        token = defaults[0] if self.token_column is None else self.token_column
        label = defaults[1] if self.label_column is None else self.label_column
        return token, label
