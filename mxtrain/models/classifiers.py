"""Row-wise classifiers and regressors: ``mlp``, ``lenet`` and ``rnn_classifier``.

They read batches of the ``ndarray`` and ``csv`` iterators (:mod:`mxtrain.data.arrays`): one
bucket whose key is the shape of one row's features. The output layer follows the data's task
(``data_info.task``):

* ``classify``: a fully connected layer to ``num_classes`` and ``SoftmaxOutput`` (named
  ``softmax``; output ``(batch, num_classes)`` probabilities). Padding rows carry the label
  ``data_info.pad_id`` (-1), which the softmax ignores (no gradient).
* ``regress``: a fully connected layer to the number of targets and ``LinearRegressionOutput``
  (named ``regression``; output ``(batch,)`` or ``(batch, K)`` values, squared loss). Padding
  rows carry NaN targets; they get no gradient.

The data and label inputs are named as the iterator reports (``data_info.data_name`` and
``label_name``: ``data`` and ``softmax_label`` by default). MXNet is imported inside functions
so that listing or validating models does not load it.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from mxtrain.data.base import DataInfo
from mxtrain.errors import InvalidValue
from mxtrain.models.rnn_common import (
    CELLS,
    MODES,
    RecurrentOptions,
    SymGen,
    check_dropout,
    check_layer_sizes,
    check_parameter_count,
    check_recurrent_sizes,
    check_size,
    dropout_rate,
    embed_size,
    layer_count,
    state_size,
)
from mxtrain.option_checks import check_choice, documented

ACTIVATIONS = ("relu", "tanh", "sigmoid")
POOLINGS = ("last", "mean", "max")
MASKED = -1e9  # what max pooling sees at padding positions


# --------------------------------------------------------------------------------------------
# Option checks and the shared output layer
# --------------------------------------------------------------------------------------------


def _names(data_info: DataInfo) -> tuple[str, str]:
    return (
        str(getattr(data_info, "data_name", "data")),
        str(getattr(data_info, "label_name", "softmax_label")),
    )


def _check_task(model: str, data_info: DataInfo) -> str:
    """The task of the output layer; ValueError when the data cannot feed it."""
    task = data_info.task or "classify"
    if task == "classify":
        classes = data_info.num_classes
        if not classes or classes < 2:
            raise InvalidValue(
                model,
                f"needs a data iterator that reports num_classes (at least 2) for "
                f"task classify (got {classes}); use the ndarray or csv iterator",
            )
    elif task != "regress":
        raise InvalidValue(
            model,
            f"predicts one class (classify) or values (regress) per row, but the data "
            f"iterator reports task {task!r}",
        )
    return task


def _output(x: Any, label: Any, data_info: DataInfo, task: str) -> Any:
    """Output layer and loss for ``task`` on top of features ``x`` (batch, hidden)."""
    import mxnet as mx  # deferred: `mxtrain check` imports the options classes without MXNet

    if task == "classify":
        x = mx.sym.FullyConnected(x, num_hidden=int(data_info.num_classes or 0), name="pred")
        ignore: dict[str, Any] = {}
        if data_info.pad_id is not None:
            ignore = {"use_ignore": True, "ignore_label": data_info.pad_id}
        return mx.sym.SoftmaxOutput(x, label, name="softmax", **ignore)
    shape = tuple(getattr(data_info, "label_shape", ()) or ())
    x = mx.sym.FullyConnected(x, num_hidden=math.prod(shape) if shape else 1, name="pred")
    x = mx.sym.reshape(x, shape=(-1, *shape))
    # NaN targets mark padding rows: they see a clean target and pass no gradient back
    real = label == label
    target = mx.sym.where(real, label, mx.sym.zeros_like(label))
    x = mx.sym.where(real, x, mx.sym.BlockGrad(x))
    return mx.sym.LinearRegressionOutput(x, target, name="regression")


# --------------------------------------------------------------------------------------------
# mlp
# --------------------------------------------------------------------------------------------


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


def build_mlp(options: MlpOptions, data_info: DataInfo) -> SymGen:
    """Return ``sym_gen(feature_shape) -> (symbol, (data,), (label,))``.

    Layers: flatten -> [FC ``fc{i}`` -> BatchNorm ``bn{i}`` -> activation -> dropout] per hidden
    size -> the task's output layer (``pred`` FC + loss).
    """
    task = _check_task("mlp", data_info)
    data_name, label_name = _names(data_info)

    def sym_gen(bucket_key: Any) -> tuple[Any, tuple[str, ...], tuple[str, ...]]:
        import mxnet as mx  # deferred: `mxtrain check` imports the options classes without MXNet

        x = mx.sym.flatten(mx.sym.Variable(data_name))
        for i, size in enumerate(options.hidden, start=1):
            x = mx.sym.FullyConnected(x, num_hidden=size, name=f"fc{i}")
            if options.batch_norm:
                x = mx.sym.BatchNorm(x, name=f"bn{i}")
            x = mx.sym.Activation(x, act_type=options.activation, name=f"act{i}")
            if options.dropout > 0:
                x = mx.sym.Dropout(x, p=options.dropout, name=f"drop{i}")
        out = _output(x, mx.sym.Variable(label_name), data_info, task)
        return out, (data_name,), (label_name,)

    return sym_gen


# --------------------------------------------------------------------------------------------
# lenet
# --------------------------------------------------------------------------------------------


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


def build_lenet(options: LenetOptions, data_info: DataInfo) -> SymGen:
    """Return ``sym_gen(feature_shape) -> (symbol, (data,), (label,))``.

    Rows are images ``(C, H, W)``, or ``(H, W)`` for one channel. Parameters: ``conv1``,
    ``conv2``, ``fc1``, ``pred``.
    """
    task = _check_task("lenet", data_info)
    data_name, label_name = _names(data_info)
    shape = tuple(getattr(data_info, "feature_shape", ()) or ())
    if shape and len(shape) not in (2, 3):
        raise ValueError(
            f"lenet reads images, rows of shape (channels, height, width) or (height, width); "
            f"this data has rows of shape {shape}"
        )

    def sym_gen(bucket_key: Any) -> tuple[Any, tuple[str, ...], tuple[str, ...]]:
        import mxnet as mx  # deferred: `mxtrain check` imports the options classes without MXNet

        key = tuple(bucket_key) if isinstance(bucket_key, tuple | list) else ()
        if len(key) not in (2, 3):
            raise ValueError(
                f"lenet bucket keys are image shapes (C, H, W) or (H, W), got {bucket_key!r}"
            )
        x = mx.sym.Variable(data_name)
        if len(key) == 2:
            x = mx.sym.expand_dims(x, axis=1)
        k, pad = options.kernel, options.kernel // 2
        for i, channels in enumerate(options.channels, start=1):
            x = mx.sym.Convolution(
                x, kernel=(k, k), pad=(pad, pad), num_filter=channels, name=f"conv{i}"
            )
            x = mx.sym.Activation(x, act_type=options.activation, name=f"conv{i}_act")
            x = mx.sym.Pooling(
                x,
                pool_type="max",
                kernel=(2, 2),
                stride=(2, 2),
                pooling_convention="full",
                name=f"pool{i}",
            )
        x = mx.sym.flatten(x)
        x = mx.sym.FullyConnected(x, num_hidden=options.hidden, name="fc1")
        x = mx.sym.Activation(x, act_type=options.activation, name="fc1_act")
        if options.dropout > 0:
            x = mx.sym.Dropout(x, p=options.dropout, name="drop")
        out = _output(x, mx.sym.Variable(label_name), data_info, task)
        return out, (data_name,), (label_name,)

    return sym_gen


# --------------------------------------------------------------------------------------------
# rnn_classifier
# --------------------------------------------------------------------------------------------


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


def build_rnn_classifier(options: RnnClassifierOptions, data_info: DataInfo) -> SymGen:
    """Return ``sym_gen((seq_len,)) -> (symbol, (data,), (label,))``.

    Parameters: ``embed_weight``; ``rnn_parameters`` (fused) or ``rnn_l{i}_{i2h,h2h}_*``
    (unfused), and with ``bidirectional`` the same with prefix ``rnn_bwd_``; ``pred_*``. The
    backward direction runs a forward RNN over each row reversed within its length
    (``SequenceReverse``), so it starts at the last real token, never at padding.
    """
    task = _check_task("rnn_classifier", data_info)
    vocab_size = data_info.vocab_size
    if not vocab_size or vocab_size < 2:
        raise ValueError(
            "rnn_classifier reads token ids and needs a data iterator that reports vocab_size; "
            "give the ndarray iterator an integer array (ids right-padded with 0)"
        )
    data_name, label_name = _names(data_info)

    def recurrent(x: Any, prefix: str, steps: int) -> Any:
        """(T, B, E) -> (T, B, H): a stack of forward-only layers."""
        import mxnet as mx  # deferred: `mxtrain check` imports the options classes without MXNet

        if options.fused:
            cell = mx.rnn.FusedRNNCell(
                options.num_hidden,
                num_layers=options.num_layers,
                mode=options.mode,
                dropout=options.dropout,
                prefix=prefix,
            )
            out, _ = cell.unroll(steps, inputs=x, layout="TNC", merge_outputs=True)
            return out
        stack = mx.rnn.SequentialRNNCell()
        make = mx.rnn.LSTMCell if options.mode == "lstm" else mx.rnn.GRUCell
        for i in range(options.num_layers):
            stack.add(make(options.num_hidden, prefix=f"{prefix}l{i}_"))
            if options.dropout > 0 and i + 1 < options.num_layers:
                stack.add(mx.rnn.DropoutCell(options.dropout, prefix=f"{prefix}d{i}_"))
        out, _ = stack.unroll(steps, inputs=x, layout="TNC", merge_outputs=True)
        return out

    def pool(out: Any, lengths: Any) -> Any:
        """(T, B, H) -> (B, H) over each row's real positions."""
        import mxnet as mx  # deferred: `mxtrain check` imports the options classes without MXNet

        if options.pooling == "last":
            return mx.sym.SequenceLast(out, sequence_length=lengths, use_sequence_length=True)
        if options.pooling == "mean":
            masked = mx.sym.SequenceMask(
                out, sequence_length=lengths, use_sequence_length=True, value=0.0
            )
            total = mx.sym.sum(masked, axis=0)
            return mx.sym.broadcast_div(total, mx.sym.reshape(lengths, shape=(-1, 1)))
        masked = mx.sym.SequenceMask(
            out, sequence_length=lengths, use_sequence_length=True, value=MASKED
        )
        return mx.sym.max(masked, axis=0)

    def sym_gen(bucket_key: Any) -> tuple[Any, tuple[str, ...], tuple[str, ...]]:
        import mxnet as mx  # deferred: `mxtrain check` imports the options classes without MXNet

        key = tuple(bucket_key) if isinstance(bucket_key, tuple | list) else (bucket_key,)
        steps = key[0] if len(key) == 1 else None
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(
                f"rnn_classifier bucket keys are (sequence_length,), got {bucket_key!r}"
            )
        data = mx.sym.Variable(data_name)
        # a row's length: the position of its last non-zero id (at least 1)
        positions = mx.sym.reshape(mx.sym.arange(1, steps + 1), shape=(1, steps))
        last = mx.sym.max(mx.sym.broadcast_mul(data != 0, positions), axis=1)
        lengths = mx.sym.maximum(last, 1)
        x = mx.sym.Embedding(data, input_dim=vocab_size, output_dim=options.num_embed, name="embed")
        if options.dropout > 0:
            x = mx.sym.Dropout(x, p=options.dropout, name="embed_dropout")
        x = mx.sym.swapaxes(x, dim1=0, dim2=1)  # (T, B, E)
        pooled = [pool(recurrent(x, "rnn_", steps), lengths)]
        if options.bidirectional:
            rev = mx.sym.SequenceReverse(x, sequence_length=lengths, use_sequence_length=True)
            pooled.append(pool(recurrent(rev, "rnn_bwd_", steps), lengths))
        h = pooled[0] if len(pooled) == 1 else mx.sym.concat(*pooled, dim=1)
        if options.dropout > 0:
            h = mx.sym.Dropout(h, p=options.dropout, name="pred_dropout")
        out = _output(h, mx.sym.Variable(label_name), data_info, task)
        return out, (data_name,), (label_name,)

    return sym_gen
