"""LSTM language model: embedding -> N-layer LSTM -> fully connected -> softmax.

MXNet is imported inside functions so that listing or validating models does not load it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from mxtrain.data.base import DataInfo

CELLS = ("auto", "fused", "unfused")
SymGen = Callable[[Any], tuple[Any, tuple[str, ...], tuple[str, ...]]]


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

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first impossible value."""
        for name in ("num_embed", "num_hidden", "num_layers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")
        dropout = self.dropout
        if isinstance(dropout, bool) or not isinstance(dropout, int | float):
            raise ValueError(f"dropout must be a number in [0, 1), not {dropout!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), not {dropout!r}")
        if self.cell not in CELLS:
            raise ValueError(f"cell must be one of {', '.join(CELLS)}, not {self.cell!r}")

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
    converts fused parameters), ``pred_weight``, ``pred_bias``.
    """
    vocab_size, num_classes = data_info.vocab_size, data_info.num_classes
    if not vocab_size or not num_classes or vocab_size < 1 or num_classes < 1:
        raise ValueError(
            "lstm_lm needs a data iterator that reports vocab_size and num_classes "
            f"(got vocab_size={vocab_size}, num_classes={num_classes})"
        )
    if options.ignore_padding and data_info.pad_id is None:
        raise ValueError(
            "lstm_lm with ignore_padding: true needs the data iterator's pad_id; "
            "set ignore_padding: false for data without padding"
        )
    pad_id = data_info.pad_id

    def sym_gen(bucket_key: Any) -> tuple[Any, tuple[str, ...], tuple[str, ...]]:
        import mxnet as mx

        if isinstance(bucket_key, bool) or not isinstance(bucket_key, int) or bucket_key < 1:
            raise ValueError(f"lstm_lm bucket keys are sequence lengths, got {bucket_key!r}")
        seq_len = bucket_key
        data = mx.sym.Variable("data")
        label = mx.sym.Variable("softmax_label")
        x = mx.sym.Embedding(data, input_dim=vocab_size, output_dim=options.num_embed, name="embed")
        if options.dropout > 0:
            x = mx.sym.Dropout(x, p=options.dropout, name="embed_dropout")
        if options.fused:
            # the RNN operator wants (time, batch, channel); swap here rather than let the cell
            # do it with a warning
            cell = mx.rnn.FusedRNNCell(
                options.num_hidden,
                num_layers=options.num_layers,
                mode="lstm",
                dropout=options.dropout,
                prefix="lstm_",
            )
            x = mx.sym.swapaxes(x, dim1=0, dim2=1)
            x, _ = cell.unroll(seq_len, inputs=x, layout="TNC", merge_outputs=True)
            x = mx.sym.swapaxes(x, dim1=0, dim2=1)
        else:
            stack = mx.rnn.SequentialRNNCell()
            for i in range(options.num_layers):
                stack.add(mx.rnn.LSTMCell(options.num_hidden, prefix=f"lstm_l{i}_"))
                if options.dropout > 0 and i + 1 < options.num_layers:
                    stack.add(mx.rnn.DropoutCell(options.dropout, prefix=f"lstm_d{i}_"))
            x, _ = stack.unroll(seq_len, inputs=x, layout="NTC", merge_outputs=True)
        x = mx.sym.reshape(x, shape=(-1, options.num_hidden))
        if options.dropout > 0:
            x = mx.sym.Dropout(x, p=options.dropout, name="pred_dropout")
        x = mx.sym.FullyConnected(x, num_hidden=num_classes, name="pred")
        label = mx.sym.reshape(label, shape=(-1,))
        ignore: dict[str, Any] = {}
        if options.ignore_padding:
            ignore = {"use_ignore": True, "ignore_label": pad_id}
        out = mx.sym.SoftmaxOutput(x, label, name="softmax", **ignore)
        return out, ("data",), ("softmax_label",)

    return sym_gen
