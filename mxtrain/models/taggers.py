"""The sequence tagger: (bi)LSTM/GRU over token ids, one label distribution per token.

Its options: :mod:`mxtrain.models.tagger_options`. Recurrent layers and their parameter names:
:mod:`mxtrain.models.rnn_common`.
"""

from __future__ import annotations

from typing import Any

import mxnet as mx

from mxtrain.data.base import DataInfo
from mxtrain.models.rnn_common import (
    RecurrentStack,
    SymGen,
    char_inputs_size,
    check_bucket_key,
    check_sizes,
    rnn_layers,
    word_features,
)
from mxtrain.models.tagger_options import RnnTaggerOptions


def build_rnn_tagger(options: RnnTaggerOptions, data_info: DataInfo) -> SymGen:
    """Return ``sym_gen(bucket_key) -> (symbol, ("data",), ("softmax_label",))``.

    Embedding (and/or character-aware word vectors from the ``chars`` input,
    :mod:`mxtrain.models.char_words`, with ``char_embed``) -> (bi)LSTM/GRU layers -> per-token
    fully connected layer -> softmax over the labels. Inputs are (batch, time) token ids and
    label ids; the output is (batch * time, num_classes) probabilities in batch-major order,
    named ``softmax``. Positions whose label
    is the data's ``pad_id`` (padding) give no gradient (``ignore_label``). Padding must come
    after each sentence's tokens; the real length of a row is its count of non-pad tokens.

    Parameters: ``embed_weight``, the recurrent layers' (see :mod:`mxtrain.models.rnn_common`,
    prefix ``lstm_`` or ``gru_``), ``pred_weight``, ``pred_bias``.
    """
    vocab_size, num_classes = check_sizes("rnn_tagger", data_info)
    pad_id = data_info.pad_id
    if pad_id is None:
        raise ValueError(
            "rnn_tagger needs the data iterator's pad_id: padding positions must get no "
            "gradient (use a tagging iterator such as tagged_sequences)"
        )
    directions = 2 if options.bidirectional else 1
    width = options.num_hidden * directions
    char_vocab_size = char_inputs_size("rnn_tagger", options, data_info)
    inputs = ("data", "chars") if char_vocab_size else ("data",)

    def sym_gen(bucket_key: Any) -> tuple[Any, tuple[str, ...], tuple[str, ...]]:
        seq_len = check_bucket_key("rnn_tagger", bucket_key)
        data = mx.sym.Variable("data")
        label = mx.sym.Variable("softmax_label")
        embedding = None
        if options.word_embed:
            embedding = mx.sym.Embedding(
                data, input_dim=vocab_size, output_dim=options.num_embed, name="embed"
            )
        x = word_features(options, embedding, seq_len, char_vocab_size)
        if options.dropout > 0:
            x = mx.sym.Dropout(x, p=options.dropout, name="embed_dropout")
        lengths = None
        if options.bidirectional:
            # ids are non-negative, so with pad id 0 clip(ids, 0, 1) marks the real tokens
            # exactly as ids != 0 does, in an operator ONNX export can convert
            real = mx.sym.clip(data, 0, 1) if pad_id == 0 else data != pad_id
            lengths = mx.sym.sum(real, axis=1, name="lengths")
        stack = RecurrentStack(
            options.cell,
            options.num_hidden,
            options.num_layers,
            options.dropout,
            fused=options.use_fused,
            prefix=f"{options.cell}_",
        )
        x = rnn_layers(x, seq_len, stack, bidirectional=options.bidirectional, lengths=lengths)
        x = mx.sym.reshape(x, shape=(-1, width))
        if options.dropout > 0:
            x = mx.sym.Dropout(x, p=options.dropout, name="pred_dropout")
        x = mx.sym.FullyConnected(x, num_hidden=num_classes, name="pred")
        label = mx.sym.reshape(label, shape=(-1,))
        out = mx.sym.SoftmaxOutput(x, label, use_ignore=True, ignore_label=pad_id, name="softmax")
        return out, inputs, ("softmax_label",)

    if options.word_embed:
        sym_gen.word_embedding = "embed_weight"  # type: ignore[attr-defined]
    return sym_gen
