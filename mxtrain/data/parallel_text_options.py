"""Options of the ``parallel_text`` iterator (no MXNet import: the config layer reads them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from mxtrain.data import source_options as shared
from mxtrain.data.bucket_sentence_options import DEFAULT_SPECIALS, LAST_BATCHES
from mxtrain.errors import InvalidValue
from mxtrain.option_checks import (
    MAX_SEQUENCE_LENGTH,
    check_bool,
    check_choice,
    check_positive_int,
    check_sharding,
    check_tensor,
    documented,
    not_int,
)

TOKENS = ("whitespace", "chars")
LONG_PAIRS = ("skip", "error")
#: the decoder's first input, reserved in both vocabularies right after <pad> <unk> <eos>
BOS = "<bos>"
SPECIALS = (BOS,)


@dataclass(frozen=True)
class ParallelTextOptions(shared.SourceOptions):
    """Parallel text: line i of ``source`` pairs with line i of ``target``; bucketed by
    (source length, decoder length) for encoder-decoder models.

    Construction checks the values and raises ``InvalidValue`` on impossible ones; the config
    loader turns that into a ``ConfigError`` pointing at the YAML file and line.
    """

    #: keys data.eval shares with data.train: inherited when it does not set them, refused
    #: when it sets another value (both in the config loader)
    must_match_train: ClassVar[tuple[str, ...]] = (
        "tokens",
        "lowercase",
        "shared_vocab",
        "reverse_target",
    )
    #: other ways of sizing a batch that a --batch-size (pairs) replaces in score and predict
    batch_size_replaces: ClassVar[tuple[str, ...]] = ("batch_tokens",)

    source: str = field(
        metadata={
            "doc": "a UTF-8 text file of source sequences, one per line (relative to the "
            "config file's folder); `mxtrain predict --input` replaces it"
        },
    )
    target: str = field(
        metadata={
            "doc": "a UTF-8 text file of target sequences, line i the target of source line i "
            "(relative to the config file's folder); not read when predicting"
        },
    )
    tokens: Literal["whitespace", "chars"] = documented(
        "whitespace",
        "whitespace: tokens are whitespace-separated words; chars: every character is a "
        "token and one space token stands between words (runs of spaces count as one)",
    )
    lowercase: bool = shared.lowercase_field()
    shared_vocab: bool = documented(
        False,
        "one vocabulary built from both sides (vocab.json) instead of one per side "
        "(vocab.json for the source, target_vocab.json for the target)",
    )
    reverse_target: bool = documented(
        False,
        "the model reads and writes each target sequence last token first: a right-to-left "
        "model, e.g. to rerank a left-to-right model's outputs (predict and score --rerank); "
        "its outputs are turned back, so outputs, references and metrics read left to right",
    )
    batch_size: int = shared.batch_size_field("pairs", "unless batch_tokens is set")
    batch_tokens: int | None = documented(
        None,
        "when set, replaces batch_size: target tokens per batch (Sockeye's word-based "
        "batches): a bucket of T decoder positions takes max(1, batch_tokens // T) pairs, "
        "and no more source or target positions than the default (largest) bucket",
    )
    last_batch: Literal["short", "pad"] = documented(
        "short",
        "short: each bucket's last batch holds just its remaining pairs (at least one per "
        "device); pad: fill it up to the batch size with all-padding rows",
    )
    buckets: list[tuple[int, int]] | Literal["auto"] = documented(
        "auto",
        "[S, T] pairs to pad to: S source tokens and T decoder positions (target tokens + 1, "
        "for <bos>/<eos>); the list must hold the largest [S, T] of all (the default "
        "bucket). auto: chosen from the data within max_padding and num_buckets (eval "
        "iterators reuse the train iterator's buckets)",
    )
    num_buckets: int | None = documented(
        16,
        "buckets: auto: at most this many buckets (null: no limit); every bucket's first batch "
        "is slower and keeps memory of its own (see fit.bucket_memory)",
    )
    max_padding: float = documented(
        0.1,
        "buckets: auto: largest share of padded positions, source and target positions "
        "counted together (0 to 1, exclusive); the fewest buckets found within it are used",
    )
    max_source_length: int | None = documented(
        None, "pairs whose source has more tokens are long pairs (null: no cap)"
    )
    max_target_length: int | None = documented(
        None,
        "pairs whose target has more tokens (<bos>/<eos> not counted) are long pairs "
        "(null: no cap)",
    )
    long_pairs: Literal["skip", "error"] = documented(
        "skip",
        "pairs longer than every bucket or a cap: skip them (counted in the log) or stop "
        "with an error naming the first one; predicting keeps every line",
    )
    shuffle: bool = shared.shuffle_field(
        "pairs and batches", "eval iterators always read in a fixed order"
    )
    vocab: str | None = documented(
        None,
        "train: load this saved vocab.json (relative to the config file's folder) "
        "instead of building the vocabularies; without shared_vocab the target "
        "vocabulary is the target_vocab.json beside it; unknown tokens become <unk>",
    )
    min_count: int = documented(
        1, "tokens seen fewer times in the training data (per side) become <unk>"
    )
    max_vocab: int | None = documented(
        None,
        "largest vocabulary size per side, the specials <pad> <unk> <eos> <bos> included",
    )
    max_pairs: int | None = documented(
        None, "read only the first N pairs (quick runs and tests; predicting reads every line)"
    )
    num_parts: int = shared.num_parts_field(
        "distributed training: split each epoch's pairs into this many disjoint parts, one "
        "per worker; every part yields the same number of batches"
    )
    part_index: int = shared.part_index_field()

    def validate(self) -> None:
        """Raise ``InvalidValue`` naming the first impossible value."""
        shared.check_source(self.source, "the path of a text file, one sequence per line")
        if not isinstance(self.target, str) or not self.target.strip():
            raise InvalidValue("target", "must be the path of a text file, one sequence per line")
        check_choice("tokens", self.tokens, TOKENS)
        check_bool("reverse_target", self.reverse_target)
        check_positive_int("batch_size", self.batch_size)
        shared.check_optional_positive_int("batch_tokens", self.batch_tokens)
        check_choice("last_batch", self.last_batch, LAST_BATCHES)
        check_pair_buckets(self.buckets)
        shared.check_auto_buckets("padding", self.num_buckets, self.max_padding)
        shared.check_optional_positive_int("max_source_length", self.max_source_length)
        shared.check_optional_positive_int("max_target_length", self.max_target_length)
        check_choice("long_pairs", self.long_pairs, LONG_PAIRS)
        shared.check_vocab_file(self.vocab)
        check_positive_int("min_count", self.min_count)
        shared.check_max_vocab(self.max_vocab, len(DEFAULT_SPECIALS) + len(SPECIALS))
        shared.check_optional_positive_int("max_pairs", self.max_pairs)
        check_sharding(self.num_parts, self.part_index)
        if isinstance(self.buckets, list | tuple):
            largest = max(t for _, t in self.buckets)
            shared.check_batch(
                "a batch of the largest bucket", self.batch_size, ("buckets", largest)
            )
        if self.batch_tokens is not None:
            check_tensor("batch_tokens", "a batch", [self.batch_tokens])


def check_pair_buckets(buckets: object) -> None:
    """``auto``, or distinct [S, T] pairs (S >= 1 source tokens, T >= 2 decoder positions)
    that include their elementwise maximum, the default bucket every other one shares memory
    with."""
    if isinstance(buckets, str):
        if buckets != "auto":
            raise InvalidValue(
                "buckets", f"must be 'auto' or a list of [S, T] pairs, not {buckets!r}"
            )
        return
    if not isinstance(buckets, list | tuple) or not buckets:
        raise InvalidValue("buckets", "must be 'auto' or a non-empty list of [S, T] pairs")
    pairs: list[tuple[int, int]] = []
    for item in buckets:
        if (
            not isinstance(item, list | tuple)
            or len(item) != 2
            or any(not_int(v) for v in item)
            or item[0] < 1
            or item[1] < 2
        ):
            raise InvalidValue(
                "buckets",
                f"must be [S, T] pairs of integers, S >= 1 source tokens and T >= 2 decoder "
                f"positions (a target token and <eos>), not {_shown(item)}",
            )
        if max(item) > MAX_SEQUENCE_LENGTH:
            raise InvalidValue(
                "buckets", f"must be at most {MAX_SEQUENCE_LENGTH:,} long, not {list(item)}"
            )
        pair = (int(item[0]), int(item[1]))
        if pair in pairs:
            raise InvalidValue("buckets", f"lists {list(pair)} twice")
        pairs.append(pair)
    largest = (max(s for s, _ in pairs), max(t for _, t in pairs))
    if largest not in pairs:
        raise InvalidValue(
            "buckets",
            f"must include {list(largest)}, the largest source and decoder lengths together: "
            "the model binds it first as the default bucket and every other bucket shares "
            f"its memory; add [{largest[0]}, {largest[1]}]",
        )


def _shown(item: object) -> str:
    """A bucket as the YAML wrote it: ``[10, 1]`` rather than the tuple it was read as."""
    return repr(list(item)) if isinstance(item, tuple) else repr(item)
