"""Options of the row-wise classifiers and regressors ``mlp``, ``lenet`` and
``rnn_classifier`` (no MXNet import: the config loader and `mxtrain check` read them)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Literal

from mxtrain.errors import InvalidValue
from mxtrain.models.recurrent_options import (
    CELLS,
    MODES,
    PretrainedEmbedding,
    RecurrentOptions,
    check_dropout,
    check_layer_sizes,
    check_parameter_count,
    check_recurrent_sizes,
    check_size,
    dropout_rate,
    embed_size,
    layer_count,
    pretrained_field,
    state_size,
)
from mxtrain.option_checks import check_choice, documented

ACTIVATIONS = ("relu", "tanh", "sigmoid")
POOLINGS = ("last", "mean", "max")


@dataclass(frozen=True)
class MlpOptions:
    """A multi-layer perceptron over the flattened features of each row."""

    hidden: list[int] = field(
        default_factory=lambda: [64],
        metadata={"doc": "sizes of the hidden layers, in order ([] for a linear model)"},
    )
    activation: Literal["relu", "tanh", "sigmoid"] = documented(
        "relu", "non-linearity after each hidden layer"
    )
    dropout: float = documented(0.0, "dropout after each hidden layer (training only)")
    batch_norm: bool = documented(
        False, "batch normalization after each hidden layer, before the activation"
    )

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``InvalidValue`` naming the first impossible value."""
        if not isinstance(self.hidden, list | tuple):
            raise InvalidValue("hidden", f"must be a list of layer sizes, not {self.hidden!r}")
        for size in self.hidden:
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise InvalidValue(
                    "hidden", f"must hold positive layer sizes, got {list(self.hidden)}"
                )
            check_size("hidden", size)
        sizes = list(self.hidden)
        check_parameter_count("hidden", sum(a * b for a, b in itertools.pairwise(sizes)))
        check_choice("activation", self.activation, ACTIVATIONS)
        check_dropout(self.dropout)


@dataclass(frozen=True)
class LenetOptions:
    """A small LeNet-style CNN for images: conv-pool-conv-pool-fc-output.

    Convolutions keep the image size (padding ``kernel // 2``) and each pooling halves it
    (rounding up), so any image of at least 1 x 1 pixels fits.
    """

    channels: list[int] = field(
        default_factory=lambda: [20, 50],
        metadata={"doc": "output channels of the two convolutions"},
    )
    kernel: int = documented(5, "convolution kernel size (odd)")
    hidden: int = documented(500, "size of the fully connected layer")
    activation: Literal["relu", "tanh", "sigmoid"] = documented(
        "relu", "non-linearity after each convolution and the FC layer"
    )
    dropout: float = documented(0.0, "dropout before the output layer (training only)")

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``InvalidValue`` naming the first impossible value."""
        channels = self.channels
        if not isinstance(channels, list | tuple) or len(channels) != 2:
            raise InvalidValue("channels", f"must be a list of two sizes, not {channels!r}")
        for size in channels:
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise InvalidValue("channels", f"must hold positive sizes, got {list(channels)}")
            check_size("channels", size)
        check_layer_sizes(self, "kernel")
        check_parameter_count("channels", channels[0] * channels[1] * self.kernel**2)
        if self.kernel % 2 == 0:
            raise InvalidValue(
                "kernel", f"must be odd (the image keeps its size), not {self.kernel}"
            )
        check_layer_sizes(self, "hidden")
        check_choice("activation", self.activation, ACTIVATIONS)
        check_dropout(self.dropout)


@dataclass(frozen=True)
class RnnClassifierOptions(RecurrentOptions):
    """Token sequences -> embedding -> LSTM/GRU -> pooling over time -> output layer.

    Rows are token ids, right-padded with 0 (the ``ndarray`` iterator with an integer array:
    id 0 is padding and never a real token). A row's length is the position of its last
    non-zero id; the pooling only sees positions before it, so appending padding does not
    change a row's output.
    """

    num_embed: int = embed_size(64)
    num_hidden: int = state_size(64)
    num_layers: int = layer_count(1)
    mode: Literal["lstm", "gru"] = documented("lstm", "recurrent cell type")
    cell: Literal["auto", "fused", "unfused"] = documented(
        "auto",
        "fused: one RNN operator per direction (fast, CPU and GPU); unfused: one "
        "cell per layer and step; auto: fused",
    )
    bidirectional: bool = documented(
        False,
        "also read each row backwards (from its last real token) and concatenate "
        "both directions' pooled states",
    )
    pooling: Literal["last", "mean", "max"] = documented(
        "last",
        "last: the state after the last real token; mean/max: over the real "
        "positions (padding is never pooled)",
    )
    dropout: float = dropout_rate()
    pretrained_embedding: PretrainedEmbedding | None = pretrained_field()

    def validate(self) -> None:
        """Raise ``InvalidValue`` naming the first impossible value."""
        check_recurrent_sizes(self)
        check_choice("mode", self.mode, MODES)
        check_choice("cell", self.cell, CELLS)
        check_choice("pooling", self.pooling, POOLINGS)
        check_dropout(self.dropout)

    @property
    def fused(self) -> bool:
        """Whether the fused RNN operator is used (auto picks it: it runs on CPU and GPU)."""
        return self.cell in ("auto", "fused")
