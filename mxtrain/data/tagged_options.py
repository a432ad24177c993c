"""Options of the ``tagged_sequences`` iterator (no MXNet import: the config layer reads them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from mxtrain.data.bucket_sentence_options import check_buckets
from mxtrain.errors import InvalidValue
from mxtrain.option_checks import check_positive_int, not_int

FORMATS = ("auto", "conll", "conllu")
DELIMITERS = ("whitespace", "tab")
LONG_POLICIES = ("split", "truncate", "drop")

# Default columns (0-based; negative counts from the end, as in Python) per format.
CONLL_TOKEN_COLUMN = 0
CONLL_LABEL_COLUMN = -1
CONLLU_TOKEN_COLUMN = 1  # FORM
CONLLU_LABEL_COLUMN = 3  # UPOS
CONLLU_COLUMNS = 10


@dataclass(frozen=True)
class TaggedSequencesOptions:
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
    format: Literal["auto", "conll", "conllu"] = field(
        default="auto",
        metadata={
            "doc": "conll: every line a token; conllu: 10 tab-separated columns, '#' comment "
            "lines, multi-word ranges (3-4) and empty nodes (5.1) skipped; auto: conllu when "
            "the first token line has 10 tab-separated columns and an integer ID, else conll"
        },
    )
    delimiter: Literal["whitespace", "tab"] = field(
        default="whitespace",
        metadata={
            "doc": "conll columns are separated by any whitespace, or by single tabs (tokens "
            "may then contain spaces); conllu always uses tabs"
        },
    )
    token_column: int | None = field(
        default=None,
        metadata={
            "doc": "0-based column of the token (negative: from the end); null: 0 for conll, "
            "1 (FORM) for conllu"
        },
    )
    label_column: int | None = field(
        default=None,
        metadata={
            "doc": "0-based column of the label (negative: from the end); null: -1 (the last) "
            "for conll, 3 (UPOS) for conllu. Not read when predicting"
        },
    )
    batch_size: int = field(default=32, metadata={"doc": "sentences per batch"})
    buckets: list[int] | Literal["auto"] = field(
        default="auto",
        metadata={
            "doc": "sorted sentence lengths (tokens) to pad to, or auto: quantiles of the "
            "sentence lengths (eval iterators reuse the train iterator's buckets)"
        },
    )
    num_buckets: int = field(
        default=8, metadata={"doc": "how many buckets 'buckets: auto' derives at most"}
    )
    shuffle: bool = field(
        default=True,
        metadata={
            "doc": "train only: shuffle sentences and batches, seeded by (seed, epoch); "
            "eval iterators always read in a fixed order"
        },
    )
    min_count: int = field(
        default=1,
        metadata={
            "doc": "tokens seen fewer times in the training data become <unk> (2 teaches the "
            "model what to do with unseen words); labels are always all kept"
        },
    )
    max_vocab: int | None = field(
        default=None,
        metadata={
            "doc": "largest token vocabulary size, the 3 specials <pad> <unk> <eos> included"
        },
    )
    long_sentences: Literal["split", "truncate", "drop"] = field(
        default="split",
        metadata={
            "doc": "sentences longer than the largest bucket: split into chunks, truncate or "
            "drop (always counted and reported); predicting never cuts a sentence"
        },
    )
    max_sentences: int | None = field(
        default=None, metadata={"doc": "read only the first N sentences (quick runs and tests)"}
    )
    lowercase: bool = field(
        default=False, metadata={"doc": "lowercase the tokens (not the labels) before lookup"}
    )

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``InvalidValue`` naming the first impossible value."""
        if not isinstance(self.source, str) or not self.source.strip():
            raise InvalidValue("source", "must be the path of a CoNLL or CoNLL-U file")
        if self.format not in FORMATS:
            raise InvalidValue(
                "format", f"must be one of {', '.join(FORMATS)}, not {self.format!r}"
            )
        if self.delimiter not in DELIMITERS:
            raise InvalidValue(
                "delimiter", f"must be one of {', '.join(DELIMITERS)}, not {self.delimiter!r}"
            )
        if self.long_sentences not in LONG_POLICIES:
            raise InvalidValue(
                "long_sentences",
                f"must be one of {', '.join(LONG_POLICIES)}, not {self.long_sentences!r}",
            )
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
        check_positive_int("num_buckets", self.num_buckets)
        check_positive_int("min_count", self.min_count)
        if self.max_sentences is not None:
            check_positive_int("max_sentences", self.max_sentences)
        if self.max_vocab is not None and (not_int(self.max_vocab) or self.max_vocab < 4):
            raise InvalidValue(
                "max_vocab",
                f"must be at least 4 (3 specials and one token), not {self.max_vocab!r}",
            )
        check_buckets(self.buckets)

    def columns(self, fmt: str) -> tuple[int, int]:
        """(token column, label column) for the resolved format ``conll`` or ``conllu``."""
        if fmt == "conllu":
            defaults = (CONLLU_TOKEN_COLUMN, CONLLU_LABEL_COLUMN)
        else:
            defaults = (CONLL_TOKEN_COLUMN, CONLL_LABEL_COLUMN)
        token = defaults[0] if self.token_column is None else self.token_column
        label = defaults[1] if self.label_column is None else self.label_column
        return token, label
