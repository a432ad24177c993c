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
``label_name``: ``data`` and ``softmax_label`` by default). Their options:
:mod:`mxtrain.models.classifier_options`.
"""

from __future__ import annotations

import math
from typing import Any

import mxnet as mx

from mxtrain.data.base import DataInfo
from mxtrain.errors import InvalidValue
from mxtrain.models.classifier_options import LenetOptions, MlpOptions, RnnClassifierOptions
from mxtrain.models.rnn_common import SymGen

MASKED = -1e9  # what max pooling sees at padding positions


# --------------------------------------------------------------------------------------------
# Data checks and the shared output layer
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
    if task == "classify":
        x = mx.sym.FullyConnected(x, num_hidden=int(data_info.num_classes or 0), name="pred")
        ignore: dict[str, Any] = {}
        if data_info.pad_id is not None:
            ignore = {"use_ignore": True, "ignore_label": data_info.pad_id}
        return mx.sym.SoftmaxOutput(x, label, name="softmax", **ignore)
    shape = tuple(getattr(data_info, "label_shape", ()) or ())
    x = mx.sym.FullyConnected(x, num_hidden=math.prod(shape) if shape else 1, name="pred")
    return regression_output(x, label, shape)


def regression_output(x: Any, label: Any, shape: tuple[int, ...]) -> Any:
    """The regression loss of predictions ``x``, reshaped to rows of the label's ``shape``."""
    x = mx.sym.reshape(x, shape=(-1, *shape))
    # NaN targets mark padding rows: they see a clean target and pass no gradient back
    real = label == label
    target = mx.sym.where(real, label, mx.sym.zeros_like(label))
    x = mx.sym.where(real, x, mx.sym.BlockGrad(x))
    return mx.sym.LinearRegressionOutput(x, target, name="regression")


# --------------------------------------------------------------------------------------------
# mlp
# --------------------------------------------------------------------------------------------


def build_mlp(options: MlpOptions, data_info: DataInfo) -> SymGen:
    """Return ``sym_gen(feature_shape) -> (symbol, (data,), (label,))``.

    Layers: flatten -> [FC ``fc{i}`` -> BatchNorm ``bn{i}`` -> activation -> dropout] per hidden
    size -> the task's output layer (``pred`` FC + loss).
    """
    task = _check_task("mlp", data_info)
    data_name, label_name = _names(data_info)

    def sym_gen(bucket_key: Any) -> tuple[Any, tuple[str, ...], tuple[str, ...]]:
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

    sym_gen.word_embedding = "embed_weight"  # type: ignore[attr-defined]
    return sym_gen
