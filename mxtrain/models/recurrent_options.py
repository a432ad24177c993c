"""Options every recurrent model shares: sizes, dropout, cell choices, and their checks.

Also the layer-size limits every built-in model's options check. No MXNet import: the config
loader and `mxtrain check` read these before the thread settings are made.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from mxtrain.errors import InvalidValue
from mxtrain.option_checks import CheckedOptions, check_positive_int, documented

MODES = ("lstm", "gru")
CELLS = ("auto", "fused", "unfused")

#: Widest layer a config may ask for (units, filters, embedding size, layers). Far above any
#: useful width, and small enough that one layer's shape never overflows the 32-bit sizes
#: MXNet 1.9.1 (built without large-tensor support) uses: 10**10 units passed ``check`` and
#: then died in ``fit`` with an MXNetError.
MAX_LAYER_SIZE = 2**20
#: Most parameters the options may imply (estimated without the data's vocabulary or input
#: width): 2**31 - 1 is the largest tensor MXNet 1.9.1 indexes, and that many float32 values
#: are already 8 GiB before gradients and optimizer state.
MAX_PARAMETERS = 2**31 - 1


def check_layer_sizes(options: object, *names: str) -> None:
    """Raise ``InvalidValue`` unless each named option is an integer in 1..MAX_LAYER_SIZE."""
    for name in names:
        check_size(name, getattr(options, name))


def check_size(name: str, value: object) -> None:
    """Raise ``InvalidValue`` unless ``value`` is an integer in 1..MAX_LAYER_SIZE."""
    check_positive_int(name, value)
    if value > MAX_LAYER_SIZE:  # type: ignore[operator]
        raise InvalidValue(name, f"must be at most {MAX_LAYER_SIZE:,} (2**20), not {value:,}")


def check_parameter_count(name: str, estimate: int) -> None:
    """Raise ``InvalidValue`` (naming option ``name``) when ``estimate`` exceeds
    MAX_PARAMETERS."""
    if estimate > MAX_PARAMETERS:
        raise InvalidValue(
            name,
            f"is too large: these sizes give about {estimate:,} parameters, more than the "
            f"{MAX_PARAMETERS:,} (2**31 - 1) one MXNet model can hold",
        )


class RecurrentSizes(Protocol):
    """The sizes every recurrent model's options declare (read-only: frozen dataclasses)."""

    @property
    def num_embed(self) -> int: ...
    @property
    def num_hidden(self) -> int: ...
    @property
    def num_layers(self) -> int: ...


def check_recurrent_sizes(options: RecurrentSizes) -> None:
    """num_embed/num_hidden/num_layers in range and their parameter count bounded."""
    check_layer_sizes(options, "num_embed", "num_hidden", "num_layers")
    hidden, embed, layers = options.num_hidden, options.num_embed, options.num_layers
    # an LSTM layer has 4 gates of hidden x (input + hidden) weights
    check_parameter_count("num_hidden", 4 * hidden * (hidden + max(hidden, embed)) * layers)


def check_dropout(value: object) -> None:
    """Raise ``InvalidValue`` unless ``value`` is a probability in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidValue("dropout", f"must be a number in [0, 1), not {value!r}")
    if not 0.0 <= value < 1.0:
        raise InvalidValue("dropout", f"must be in [0, 1), not {value!r}")


#: what the recurrent models' dropout does, and their state size (the tagger says per direction)
DROPOUT_DOC = "dropout after the embedding, between layers and before the output"
STATE_DOC = "size of each recurrent layer's state"


def embed_size(default: int) -> Any:
    """The ``num_embed`` field of a recurrent model's options."""
    return documented(default, "size of the token embeddings")


def state_size(default: int, doc: str = STATE_DOC) -> Any:
    """The ``num_hidden`` field of a recurrent model's options."""
    return documented(default, doc)


def layer_count(default: int) -> Any:
    """The ``num_layers`` field of a recurrent model's options."""
    return documented(default, "number of stacked recurrent layers")


def dropout_rate(doc: str = DROPOUT_DOC) -> Any:
    """The ``dropout`` field of a recurrent model's options (0: none)."""
    return documented(0.0, doc)


@dataclass(frozen=True)
class PretrainedEmbedding(CheckedOptions):
    """``pretrained_embedding``: word vectors that start the model's word embedding."""

    source: str = documented(
        "",
        "a text file of word vectors: word2vec or fastText .vec (a 'count dims' first line) or "
        "GloVe (none), one word and its numbers a line; relative to the config file's folder",
    )
    freeze: bool = documented(
        False,
        "keep the whole embedding as initialized (vectors, and the initializer's values for "
        "words without one) instead of training it",
    )

    add_words: bool | int = documented(
        False,
        "also add the file's words to the vocabulary (after the training data's own), so "
        "words the training data lacks are known at predict time with their vectors: true: "
        "every word, N: the file's first N (files list the commonest first); needs a "
        "vocabulary built from the training data",
    )

    def validate(self) -> None:
        if not isinstance(self.source, str) or not self.source.strip():
            raise InvalidValue("source", "must name a file of word vectors, e.g. glove.6B.100d.txt")
        if not isinstance(self.freeze, bool):
            raise InvalidValue("freeze", f"must be true or false, not {self.freeze!r}")
        if not isinstance(self.add_words, bool) and (
            not isinstance(self.add_words, int) or self.add_words < 1
        ):
            raise InvalidValue(
                "add_words", f"must be true, false or a positive integer, not {self.add_words!r}"
            )


def pretrained_field() -> Any:
    """The ``pretrained_embedding`` field of a model with a word embedding (null: none)."""
    return documented(
        None,
        "start the word embedding from pretrained vectors: {source: vectors.txt, freeze: "
        "false}; vocabulary words without a vector keep the initializer's values (the log "
        "says how many got one); the vectors' size must equal num_embed",
    )


class RecurrentOptions(CheckedOptions):
    """What the options of every recurrent model share: the field helpers above, and a check
    when constructed (``validate``, each class's own)."""
