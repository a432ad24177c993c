"""LSTM language model: embedding -> N-layer LSTM -> fully connected -> softmax.

MXNet is imported inside functions so that listing or validating models does not load it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from mxtrain.data.base import DataInfo
from mxtrain.models.rnn_common import (
    LOSS_DOC,
    LOSSES,
    SymGen,
    build_rnn_lm,
    check_choice,
    check_dropout,
    check_positive,
)

CELLS = ("auto", "fused", "unfused")


@dataclass(frozen=True)
class LstmLmOptions:
    """Sizes and regularisation of the LSTM language model.

    Construction raises ``ValueError`` on impossible values; the config loader turns that
    into a ``ConfigError`` pointing at the YAML file and line.
    """

    num_embed: int = field(default=200, metadata={"doc": "size of the token embeddings"})
    num_hidden: int = field(default=200, metadata={"doc": "size of each LSTM layer's state"})
    num_layers: int = field(default=2, metadata={"doc": "number of stacked LSTM layers"})
    dropout: float = field(
        default=0.0,
        metadata={"doc": "dropout after the embedding, between LSTM layers and before the output"},
    )
    cell: Literal["auto", "fused", "unfused"] = field(
        default="auto",
        metadata={
            "doc": "fused: one RNN operator (fast, CPU and GPU); unfused: one LSTMCell per "
            "layer and step; auto: fused"
        },
    )
    ignore_padding: bool = field(
        default=True,
        metadata={"doc": "padding positions get no gradient (SoftmaxOutput ignore_label = pad id)"},
    )
    loss: Literal["nll", "softmax_output"] = field(default="nll", metadata={"doc": LOSS_DOC})

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first impossible value."""
        check_positive(self, "num_embed", "num_hidden", "num_layers")
        check_dropout(self.dropout)
        check_choice("cell", self.cell, CELLS)
        check_choice("loss", self.loss, LOSSES)

    @property
    def fused(self) -> bool:
        """Whether the fused RNN operator is used (auto picks it: it runs on CPU and GPU)."""
        return self.cell in ("auto", "fused")


def build_lstm_lm(options: LstmLmOptions, data_info: DataInfo) -> SymGen:
    """Return ``sym_gen(bucket_key) -> (symbol, ("data",), ("softmax_label",))``.

    Inputs are (batch, time) token ids; the output is (batch * time, num_classes)
    probabilities in batch-major order, named ``softmax``. Parameters: ``embed_weight``,
    ``lstm_parameters`` (fused) or ``lstm_l{i}_{i2h,h2h}_{weight,bias}`` (unfused: the
    names of ``FusedRNNCell.unfuse()``, so ``unfuse().pack_weights(unpack_weights(p))``
    converts fused parameters), ``pred_weight``, ``pred_bias``. The graph is built by
    :func:`mxtrain.models.rnn_common.build_rnn_lm`, shared with ``gru_lm``.
    """
    return build_rnn_lm(options, data_info, model="lstm_lm", mode="lstm")
