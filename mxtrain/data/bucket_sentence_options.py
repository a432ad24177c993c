"""Options of the ``bucket_sentence`` iterator (no MXNet import: the config layer reads them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise
from typing import ClassVar, Literal

from mxtrain.errors import InvalidValue
from mxtrain.option_checks import check_positive_int, check_sharding, not_int

TREEBANK_PREFIX = "treebank:"
LEVELS = ("word", "char")
LONG_POLICIES = ("split", "truncate", "drop")
AUTO_BUCKET_RULES = ("quantile", "padding")
DEFAULT_SPECIALS = ("<pad>", "<unk>", "<eos>")


@dataclass(frozen=True)
class BucketSentenceOptions:
    """Sentences, one per line, turned into bucketed (batch, time) next-token batches.

    Construction checks the values and raises ``InvalidValue`` on impossible ones; the config
    loader turns that into a ``ConfigError`` pointing at the YAML file and line.
    """

    #: keys data.eval must share with data.train (the check runs in the config loader)
    must_match_train: ClassVar[tuple[str, ...]] = ("level", "lowercase")

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
    batch_size: int = field(
        default=32, metadata={"doc": "sentences per batch (unless batch_tokens is set)"}
    )
    batch_tokens: int | None = field(
        default=None,
        metadata={
            "doc": "token budget per batch: each bucket of length L takes max(1, batch_tokens "
            "// L) sentences instead of batch_size (capped so no bucket has more positions "
            "than the default, longest, bucket, which the module binds first)"
        },
    )
    buckets: list[int] | Literal["auto"] = field(
        default="auto",
        metadata={
            "doc": "sorted sequence lengths to pad to, or auto: quantiles of the sentence "
            "lengths (eval iterators reuse the train iterator's buckets)"
        },
    )
    num_buckets: int | None = field(
        default=8,
        metadata={
            "doc": "how many buckets 'buckets: auto' derives at most (null: no limit, "
            "auto_buckets: padding only)"
        },
    )
    auto_buckets: Literal["quantile", "padding"] = field(
        default="quantile",
        metadata={
            "doc": "how 'buckets: auto' places boundaries: quantile (length quantiles) or "
            "padding (the fewest buckets whose padding stays within max_padding)"
        },
    )
    max_padding: float = field(
        default=0.1,
        metadata={
            "doc": "auto_buckets: padding: largest share of padded positions from rounding "
            "lengths up to buckets (0 to 1, exclusive)"
        },
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
    vocab: str | None = field(
        default=None,
        metadata={
            "doc": "train: load this saved vocab.json (relative to the config file's folder) "
            "instead of building one; unknown words become <unk>"
        },
    )
    specials: list[str] = field(
        default_factory=list,
        metadata={
            "doc": "extra reserved tokens (e.g. [<bos>]) with the ids after <pad> 0, <unk> 1, "
            "<eos> 2"
        },
    )
    min_count: int = field(
        default=1, metadata={"doc": "tokens seen fewer times in the training data become <unk>"}
    )
    max_vocab: int | None = field(
        default=None,
        metadata={
            "doc": "largest vocabulary size, the specials (<pad> <unk> <eos> and specials) included"
        },
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
    num_parts: int = field(
        default=1,
        metadata={
            "doc": "distributed training: split each epoch's sentences into this many disjoint "
            "parts, one per worker; every part yields the same number of batches"
        },
    )
    part_index: int = field(
        default=0, metadata={"doc": "which part (0 to num_parts - 1) this worker reads"}
    )

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``InvalidValue`` naming the first impossible value."""
        if not isinstance(self.source, str) or not self.source.strip():
            raise InvalidValue(
                "source", "must be 'treebank:train|valid|test' or the path of a text file"
            )
        if self.level not in LEVELS:
            raise InvalidValue("level", f"must be one of {', '.join(LEVELS)}, not {self.level!r}")
        if self.long_sentences not in LONG_POLICIES:
            raise InvalidValue(
                "long_sentences",
                f"must be one of {', '.join(LONG_POLICIES)}, not {self.long_sentences!r}",
            )
        check_positive_int("batch_size", self.batch_size)
        if self.batch_tokens is not None:
            check_positive_int("batch_tokens", self.batch_tokens)
        if self.auto_buckets not in AUTO_BUCKET_RULES:
            raise InvalidValue(
                "auto_buckets",
                f"must be one of {', '.join(AUTO_BUCKET_RULES)}, not {self.auto_buckets!r}",
            )
        if self.num_buckets is None:
            if self.auto_buckets != "padding":
                raise InvalidValue(
                    "num_buckets",
                    "may be null only with auto_buckets: padding (the quantile "
                    "rule needs a number of buckets)",
                )
        else:
            check_positive_int("num_buckets", self.num_buckets)
        mp = self.max_padding
        if isinstance(mp, bool) or not isinstance(mp, int | float) or not 0 <= mp < 1:
            raise InvalidValue("max_padding", f"must be a number from 0 to below 1, not {mp!r}")
        check_positive_int("min_count", self.min_count)
        if self.max_sentences is not None:
            check_positive_int("max_sentences", self.max_sentences)
        if self.vocab is not None and (not isinstance(self.vocab, str) or not self.vocab.strip()):
            raise InvalidValue(
                "vocab", f"must be the path of a vocab.json file or null, not {self.vocab!r}"
            )
        self._validate_specials()
        reserved = len(DEFAULT_SPECIALS) + len(self.specials)
        if self.max_vocab is not None and (
            not_int(self.max_vocab) or self.max_vocab < reserved + 1
        ):
            raise InvalidValue(
                "max_vocab",
                f"must be at least {reserved + 1} ({reserved} specials and one "
                f"token), not {self.max_vocab!r}",
            )
        check_sharding(self.num_parts, self.part_index)
        check_buckets(self.buckets)

    def _validate_specials(self) -> None:
        specials = self.specials
        if isinstance(specials, str) or not isinstance(specials, list | tuple):
            raise InvalidValue(
                "specials", f"must be a list of tokens such as [<bos>], not {specials!r}"
            )
        seen: set[str] = set()
        for token in specials:
            if (
                not isinstance(token, str)
                or not token
                or token != token.strip()
                or (len(token.split()) != 1)
            ):
                raise InvalidValue(
                    "specials", f"must be non-empty tokens without whitespace, not {token!r}"
                )
            if token in DEFAULT_SPECIALS:
                raise InvalidValue(
                    "specials",
                    f"must not list {token}: it is always reserved (ids 0-2 are "
                    f"{', '.join(DEFAULT_SPECIALS)}); list only extra tokens",
                )
            if token in seen:
                raise InvalidValue("specials", f"lists {token!r} twice")
            seen.add(token)


def check_buckets(buckets: object) -> None:
    """Raise ``InvalidValue`` unless ``buckets`` is 'auto' or strictly increasing lengths."""
    if isinstance(buckets, str):
        if buckets != "auto":
            raise InvalidValue("buckets", f"must be 'auto' or a list of lengths, not {buckets!r}")
        return
    lengths = list(buckets)  # type: ignore[call-overload]
    if not lengths:
        raise InvalidValue("buckets", "must not be empty: give lengths like [10, 20, 40] or 'auto'")
    if any(not_int(b) or b < 1 for b in lengths):
        raise InvalidValue("buckets", f"must be positive integers, got {lengths}")
    if any(a >= b for a, b in pairwise(lengths)):
        raise InvalidValue(
            "buckets",
            f"must be strictly increasing, got {lengths} (did you mean {sorted(set(lengths))}?)",
        )
