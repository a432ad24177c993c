"""Options of the ``bucket_sentence`` iterator (no MXNet import: the config layer reads them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from mxtrain.data import source_options as shared
from mxtrain.errors import InvalidValue
from mxtrain.option_checks import (
    check_choice,
    check_positive_int,
    check_sharding,
    check_tensor,
    documented,
)

TREEBANK_PREFIX = "treebank:"
LEVELS = ("word", "char")
LAST_BATCHES = ("short", "pad")
DEFAULT_SPECIALS = ("<pad>", "<unk>", "<eos>")


@dataclass(frozen=True)
class BucketSentenceOptions(shared.SourceOptions):
    """Sentences, one per line, turned into bucketed (batch, time) next-token batches.

    Construction checks the values and raises ``InvalidValue`` on impossible ones; the config
    loader turns that into a ``ConfigError`` pointing at the YAML file and line.
    """

    #: keys data.eval shares with data.train: inherited when it does not set them, refused
    #: when it sets another value (both in the config loader)
    must_match_train: ClassVar[tuple[str, ...]] = ("level", "lowercase")

    source: str = shared.text_source_field(" (relative to the config file's folder)")
    level: Literal["word", "char"] = shared.level_field()
    batch_size: int = shared.batch_size_field("sentences", "unless batch_tokens is set")
    batch_tokens: int | None = documented(
        None,
        "token budget per batch: each bucket of length L takes max(1, batch_tokens "
        "// L) sentences instead of batch_size (capped so no bucket has more positions "
        "than the default, longest, bucket, which the module binds first)",
    )
    last_batch: Literal["short", "pad"] = documented(
        "short",
        "short: each bucket's last batch holds just its remaining sentences (at "
        "least one per device), the same gradients as padding it; pad: fill it up to the "
        "batch size with padding rows, which cost as much time as real ones (on "
        "heavy-tailed lengths, a rare long bucket's last batch is mostly such rows)",
    )
    buckets: list[int] | Literal["auto"] = shared.buckets_field("sequence lengths")
    num_buckets: int | None = shared.num_buckets_field()
    auto_buckets: Literal["quantile", "padding"] = shared.auto_buckets_field()
    max_padding: float = shared.max_padding_field()
    shuffle: bool = shared.shuffle_field(
        "sentences and batches", "eval iterators always read in a fixed order"
    )
    add_eos: bool = documented(True, "append <eos> to each sentence so the model learns to end")
    vocab: str | None = shared.vocab_file_field()
    specials: list[str] = shared.specials_field()  # noqa: RUF009 - a field with a default_factory
    min_count: int = shared.min_count_field()
    max_vocab: int | None = shared.max_vocab_field()
    long_sentences: Literal["split", "truncate", "drop"] = shared.long_sentences_field()
    max_sentences: int | None = shared.max_sentences_field("lines")
    lowercase: bool = shared.lowercase_field()
    num_parts: int = shared.num_parts_field(
        "distributed training: split each epoch's sentences into this many disjoint "
        "parts, one per worker; every part yields the same number of batches"
    )
    part_index: int = shared.part_index_field()

    def validate(self) -> None:
        """Raise ``InvalidValue`` naming the first impossible value."""
        shared.check_source(self.source, "'treebank:train|valid|test' or the path of a text file")
        check_choice("level", self.level, LEVELS)
        shared.check_long_sentences(self.long_sentences)
        check_positive_int("batch_size", self.batch_size)
        shared.check_optional_positive_int("batch_tokens", self.batch_tokens)
        check_choice("last_batch", self.last_batch, LAST_BATCHES)
        shared.check_auto_buckets(self.auto_buckets, self.num_buckets, self.max_padding)
        check_positive_int("min_count", self.min_count)
        shared.check_optional_positive_int("max_sentences", self.max_sentences)
        shared.check_vocab_file(self.vocab)
        self._validate_specials()
        shared.check_max_vocab(self.max_vocab, len(DEFAULT_SPECIALS) + len(self.specials))
        check_sharding(self.num_parts, self.part_index)
        shared.check_buckets(self.buckets)
        shared.check_bucketed_batch(self.batch_size, self.buckets)
        if self.batch_tokens is not None:
            check_tensor("batch_tokens", "a batch", [self.batch_tokens])

    def _validate_specials(self) -> None:
        check_specials(self.specials)


def check_specials(specials: object) -> None:
    """Extra reserved tokens: a list of distinct tokens without whitespace, none of the
    default ones."""
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
