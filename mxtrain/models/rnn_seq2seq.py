"""The attentional LSTM encoder-decoder ``rnn_seq2seq``.

Encoder: source embedding -> ``num_layers`` bidirectional LSTM layers (fused operators; the
right-to-left direction starts at each row's last real token, :func:`rnn_layers`) -> a linear
projection of the two directions (2 * num_hidden) to ``num_hidden``: the memory attention reads.
The decoder's initial state: h = tanh(W mean(memory over the real source positions)) for each
layer, c = 0.

Decoder: target embedding -> ``num_layers`` LSTM layers (one fused operator over all target
positions) -> attention over the memory, padding masked out (``dot``: h . m, ``general``:
h . W m, ``mlp``: v . tanh(W h + U m)) -> the attentional state tanh(W_c [context; h]) ->
output layer -> softmax. The attentional state is not fed back into the next step's input (no
input feeding, unlike Luong et al. 2015): so the recurrent layers of all target positions run
as one operator in training, the design choice that makes training fast. A decoder step
(:meth:`RnnSeq2SeqSymGen.decoder_step`) is the same fused operator over one position, its
begin states the carried ones and its final states the new ones, then the same attention.
The recurrent layers are always fused RNN operators (CPU and GPU; no unfused variant).

Parameters: ``source_embed_weight`` and ``target_embed_weight`` (``embed_weight`` when shared),
``encoder_l{i}_parameters`` / ``encoder_r{i}_parameters`` (each direction of layer i),
``encoder_proj_{weight,bias}``, ``decoder_init_{weight,bias}``, ``decoder_parameters``,
``attention_key_weight`` (general, mlp), ``attention_query_{weight,bias}`` and
``attention_score_weight`` (mlp), ``attention_out_weight``, ``output_bias`` and
``output_weight`` (not when tied: the output layer reads the target embedding).
"""

from __future__ import annotations

from typing import Any

import mxnet as mx

from mxtrain.data.base import DataInfo
from mxtrain.models.rnn_common import RecurrentStack, rnn_layers
from mxtrain.models.seq2seq_common import (
    Seq2SeqSymGen,
    masked_softmax,
    real_tokens,
    source_mask_bias,
)
from mxtrain.models.seq2seq_options import RnnSeq2SeqOptions


class RnnSeq2SeqSymGen(Seq2SeqSymGen):
    """``sym_gen`` of ``rnn_seq2seq`` (module docstring). Statics: ``encoder_memory`` (N, S,
    H), ``attention_keys`` (N, S, H; not with dot attention: the memory is the keys) and
    ``source_bias`` (N, S); states ``decoder_hidden`` and ``decoder_cell`` (N, layers, H)."""

    model = "rnn_seq2seq"
    state_names = ("decoder_hidden", "decoder_cell")

    options: RnnSeq2SeqOptions

    def __init__(self, options: RnnSeq2SeqOptions, data_info: DataInfo) -> None:
        # tied: the attentional layer is as wide as the embedding the output layer reads
        width = options.num_embed if options.tie_embeddings else options.num_hidden
        super().__init__(options, data_info, num_embed=options.num_embed, output_width=width)
        keys = () if options.attention == "dot" else ("attention_keys",)
        self.static_names = ("encoder_memory", *keys, "source_bias")

    def _dropout(self, x: Any, name: str) -> Any:
        p = self.options.dropout
        return mx.sym.Dropout(x, p=p, name=name) if p > 0 else x

    def encode(self, source: Any, seq_len: int, max_steps: int | None) -> dict[str, Any]:
        opts = self.options
        real = real_tokens(source, self.pad_id)
        lengths = mx.sym.sum(real, axis=1, name="source_lengths")
        x = self._dropout(self.embed(source, "source"), "source_embed_dropout")
        stack = RecurrentStack(
            "lstm", opts.num_hidden, opts.num_layers, opts.dropout, fused=True, prefix="encoder_"
        )
        x = rnn_layers(x, seq_len, stack, bidirectional=True, lengths=lengths)
        memory = mx.sym.FullyConnected(
            x, num_hidden=opts.num_hidden, flatten=False, name="encoder_proj"
        )
        encoded = {"encoder_memory": memory, "source_bias": source_mask_bias(source, self.pad_id)}
        if opts.attention != "dot":
            encoded["attention_keys"] = mx.sym.FullyConnected(
                memory,
                num_hidden=opts.num_hidden,
                no_bias=True,
                flatten=False,
                name="attention_key",
            )
        # the mean over real positions (an empty source: over none, giving 0, not NaN)
        total = mx.sym.sum(mx.sym.broadcast_mul(memory, mx.sym.expand_dims(real, axis=2)), axis=1)
        mean = mx.sym.broadcast_div(total, mx.sym.reshape(mx.sym.maximum(lengths, 1), (-1, 1)))
        init = mx.sym.FullyConnected(
            mean, num_hidden=opts.num_layers * opts.num_hidden, name="decoder_init"
        )
        hidden = mx.sym.reshape(mx.sym.tanh(init), shape=(0, opts.num_layers, opts.num_hidden))
        encoded["decoder_hidden"] = hidden
        encoded["decoder_cell"] = mx.sym.zeros_like(hidden)
        return encoded

    def _decoder_layers(self, x: Any, seq_len: int, hidden: Any, cell: Any) -> tuple[Any, Any]:
        """(T, N, E) inputs and (N, layers, H) begin states -> (N, T, H) outputs and the
        final [h, c], (layers, N, H) each."""
        opts = self.options
        rnn = mx.rnn.FusedRNNCell(
            opts.num_hidden,
            num_layers=opts.num_layers,
            mode="lstm",
            dropout=opts.dropout,
            get_next_state=True,
            prefix="decoder_",
        )
        begin = [mx.sym.swapaxes(s, dim1=0, dim2=1) for s in (hidden, cell)]
        out, finals = rnn.unroll(
            seq_len, inputs=x, begin_state=begin, layout="TNC", merge_outputs=True
        )
        return mx.sym.swapaxes(out, dim1=0, dim2=1), finals

    def _attentional(self, queries: Any, inputs: dict[str, Any]) -> Any:
        """(N, Tq, H) decoder outputs -> (N, Tq, output_width) tanh(W_c [context; h])."""
        opts = self.options
        memory = inputs["encoder_memory"]
        if opts.attention == "mlp":
            projected = mx.sym.FullyConnected(
                queries, num_hidden=opts.num_hidden, flatten=False, name="attention_query"
            )
            energy = mx.sym.tanh(
                mx.sym.broadcast_add(
                    mx.sym.expand_dims(projected, axis=2),
                    mx.sym.expand_dims(inputs["attention_keys"], axis=1),
                )
            )  # (N, Tq, S, H)
            scores = mx.sym.FullyConnected(
                energy, num_hidden=1, no_bias=True, flatten=False, name="attention_score"
            )
            scores = mx.sym.reshape(scores, shape=(0, 0, 0))
        else:
            keys = memory if opts.attention == "dot" else inputs["attention_keys"]
            scores = mx.sym.batch_dot(queries, keys, transpose_b=True)  # (N, Tq, S)
        weights = masked_softmax(scores, mx.sym.expand_dims(inputs["source_bias"], axis=1))
        context = mx.sym.batch_dot(weights, memory)
        combined = mx.sym.concat(context, queries, dim=2)
        return mx.sym.tanh(
            mx.sym.FullyConnected(
                combined,
                num_hidden=self.output_width,
                no_bias=True,
                flatten=False,
                name="attention_out",
            )
        )

    def decode_all(self, target: Any, seq_len: int, encoded: dict[str, Any]) -> Any:
        x = self._dropout(self.embed(target, "target"), "target_embed_dropout")
        x = mx.sym.swapaxes(x, dim1=0, dim2=1)
        outputs, _ = self._decoder_layers(
            x, seq_len, encoded["decoder_hidden"], encoded["decoder_cell"]
        )
        hidden = self._attentional(outputs, encoded)
        hidden = mx.sym.reshape(hidden, shape=(-1, self.output_width))
        return self._dropout(hidden, "output_dropout")

    def decode_one(
        self, prev_token: Any, step: Any, inputs: dict[str, Any], max_steps: int
    ) -> tuple[Any, list[Any]]:
        # the position does not change an RNN's step; reading it (0 * step) keeps the step
        # graph's inputs those of every model
        prev_token = mx.sym.broadcast_add(prev_token, 0 * step)
        x = mx.sym.expand_dims(self.embed(prev_token, "target"), axis=0)  # (1, N, E)
        outputs, finals = self._decoder_layers(
            x, 1, inputs["decoder_hidden"], inputs["decoder_cell"]
        )
        hidden = mx.sym.reshape(self._attentional(outputs, inputs), shape=(-1, self.output_width))
        return hidden, [mx.sym.swapaxes(s, dim1=0, dim2=1) for s in finals]

    def carried_shapes(self, seq_len: int, batch: int, max_steps: int) -> dict[str, tuple]:
        size, layers = self.options.num_hidden, self.options.num_layers
        shapes = {
            "encoder_memory": (batch, seq_len, size),
            "attention_keys": (batch, seq_len, size),
            "source_bias": (batch, seq_len),
            "decoder_hidden": (batch, layers, size),
            "decoder_cell": (batch, layers, size),
        }
        return {n: shapes[n] for n in (*self.static_names, *self.state_names)}


def build_rnn_seq2seq(options: RnnSeq2SeqOptions, data_info: DataInfo) -> RnnSeq2SeqSymGen:
    """The ``sym_gen`` of ``rnn_seq2seq`` (see :class:`RnnSeq2SeqSymGen`)."""
    return RnnSeq2SeqSymGen(options, data_info)
