"""The character-aware word options a model with word inputs may take (no MXNet import).

``char_embed > 0`` gives every word a vector computed from its characters (a character CNN
with max-pooling: :mod:`mxtrain.models.char_words`), beside the word embedding or
(``word_embed: false``) instead of it, so word forms the vocabulary lacks still get a
representation of their own.
"""

from __future__ import annotations

from typing import Any, Protocol

from mxtrain.errors import InvalidValue
from mxtrain.option_checks import check_positive_int, documented, not_int

#: the widest character embedding, filter bank, kernel and longest word (far above use)
MAX_CHAR_SIZE = 4096


def char_embed_field() -> Any:
    return documented(
        0,
        "size of the character embeddings of the character-aware word vectors (a "
        "character CNN with max-pooling over each word's characters); 0: none",
    )


def char_filters_field() -> Any:
    return documented(50, "filters of the character CNN: the size of a word's character vector")


def char_kernel_field() -> Any:
    return documented(3, "characters each filter reads at once (odd)")


def char_max_len_field() -> Any:
    return documented(
        20,
        "characters read per word (the first ones); batches pad characters to their own "
        "longest word, up to this",
    )


def word_embed_field() -> Any:
    return documented(
        True,
        "the word embedding, concatenated with the character vector when char_embed > 0; "
        "false: the character vector alone (needs char_embed > 0)",
    )


class CharWordOptions(Protocol):
    """The fields :func:`check_char_options` reads."""

    @property
    def char_embed(self) -> int: ...
    @property
    def char_filters(self) -> int: ...
    @property
    def char_kernel(self) -> int: ...
    @property
    def char_max_len(self) -> int: ...
    @property
    def word_embed(self) -> bool: ...


def check_char_options(options: CharWordOptions) -> None:
    """Raise ``InvalidValue`` naming the first impossible character option."""
    if not_int(options.char_embed) or not 0 <= options.char_embed <= MAX_CHAR_SIZE:
        raise InvalidValue(
            "char_embed", f"must be an integer in 0..{MAX_CHAR_SIZE}, not {options.char_embed!r}"
        )
    for key in ("char_filters", "char_kernel", "char_max_len"):
        value = getattr(options, key)
        check_positive_int(key, value)
        if value > MAX_CHAR_SIZE:
            raise InvalidValue(key, f"must be at most {MAX_CHAR_SIZE}, not {value!r}")
    if options.char_kernel % 2 == 0:
        raise InvalidValue(
            "char_kernel",
            f"must be odd (the CNN pads each side by half a kernel), not {options.char_kernel}",
        )
    if not isinstance(options.word_embed, bool):
        raise InvalidValue("word_embed", f"must be true or false, not {options.word_embed!r}")
    if not options.word_embed and options.char_embed == 0:
        raise InvalidValue(
            "word_embed",
            "false needs char_embed > 0: without either the model reads nothing of the words",
        )


def reads_chars(options: Any) -> int | None:
    """``char_max_len`` when a model's options ask for character-aware words, else None."""
    if getattr(options, "char_embed", 0):
        return int(options.char_max_len)
    return None
