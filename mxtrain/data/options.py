"""Options of the ``bucket_sentence`` iterator (no MXNet import: the config layer reads them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise
from typing import Literal

TREEBANK_PREFIX = "treebank:"
LEVELS = ("word", "char")
LONG_POLICIES = ("split", "truncate", "drop")


@dataclass(frozen=True)
class BucketSentenceOptions:
    """Sentences, one per line, turned into bucketed (batch, time) next-token batches.

    Construction checks the values and raises ``ValueError`` on impossible ones; the config
    loader turns that into a ``ConfigError`` pointing at the YAML file and line.
    """

    source: str = field(
        default="treebank:train",
        metadata={
            "doc": "treebank:train|valid|test (PTB from the treebank package) or a UTF-8 text "
            "file, one sentence per line (relative to the config file's folder)"
        },
    )
    level: Literal["word", "char"] = field(
        default="word",
        metadata={
            "doc": "tokens are whitespace-separated words, or characters (plus a space token)"
        },
    )
    batch_size: int = field(default=32, metadata={"doc": "sentences per batch"})
    buckets: list[int] | Literal["auto"] = field(
        default="auto",
        metadata={
            "doc": "sorted sequence lengths to pad to, or auto: quantiles of the sentence "
            "lengths (eval iterators reuse the train iterator's buckets)"
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
    add_eos: bool = field(
        default=True, metadata={"doc": "append <eos> to each sentence so the model learns to end"}
    )
    min_count: int = field(
        default=1, metadata={"doc": "tokens seen fewer times in the training data become <unk>"}
    )
    max_vocab: int | None = field(
        default=None,
        metadata={"doc": "largest vocabulary size, the 3 specials <pad> <unk> <eos> included"},
    )
    long_sentences: Literal["split", "truncate", "drop"] = field(
        default="split",
        metadata={
            "doc": "sentences longer than the largest bucket: split into chunks, truncate or "
            "drop (always counted and reported)"
        },
    )
    max_sentences: int | None = field(
        default=None, metadata={"doc": "read only the first N lines (quick runs and tests)"}
    )
    lowercase: bool = field(default=False, metadata={"doc": "lowercase the text before tokenizing"})

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first impossible value."""
        if not isinstance(self.source, str) or not self.source.strip():
            raise ValueError(
                "source must be 'treebank:train|valid|test' or the path of a text file"
            )
        if self.level not in LEVELS:
            raise ValueError(f"level must be one of {', '.join(LEVELS)}, not {self.level!r}")
        if self.long_sentences not in LONG_POLICIES:
            raise ValueError(
                f"long_sentences must be one of {', '.join(LONG_POLICIES)}, "
                f"not {self.long_sentences!r}"
            )
        _positive("batch_size", self.batch_size)
        _positive("num_buckets", self.num_buckets)
        _positive("min_count", self.min_count)
        if self.max_sentences is not None:
            _positive("max_sentences", self.max_sentences)
        if self.max_vocab is not None and (_not_int(self.max_vocab) or self.max_vocab < 4):
            raise ValueError(
                f"max_vocab must be at least 4 (3 specials and one token), not {self.max_vocab!r}"
            )
        if isinstance(self.buckets, str):
            if self.buckets != "auto":
                raise ValueError(
                    f"buckets must be 'auto' or a list of lengths, not {self.buckets!r}"
                )
            return
        buckets = list(self.buckets)
        if not buckets:
            raise ValueError("buckets must not be empty: give lengths like [10, 20, 40] or 'auto'")
        if any(_not_int(b) or b < 1 for b in buckets):
            raise ValueError(f"buckets must be positive integers, got {buckets}")
        if any(a >= b for a, b in pairwise(buckets)):
            raise ValueError(
                f"buckets must be strictly increasing, got {buckets} "
                f"(did you mean {sorted(set(buckets))}?)"
            )


def _not_int(value: object) -> bool:
    return isinstance(value, bool) or not isinstance(value, int)


def _positive(name: str, value: object) -> None:
    if _not_int(value) or value < 1:  # type: ignore[operator]
        raise ValueError(f"{name} must be a positive integer, not {value!r}")
