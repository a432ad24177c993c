"""The pre-norm Transformer encoder-decoder ``transformer_seq2seq`` (Vaswani et al. 2017, with
the layer normalisation before each sublayer as in Xiong et al. 2020, and a final one).

Embeddings are scaled by sqrt(model_size) and added to sinusoid positions (sin in the first
half of the channels, cos in the second). Encoder layer: x + SelfAttention(LN(x)) with the
source's padding masked, then x + FFN(LN(x)). Decoder layer: causal self-attention, then
attention over the encoder's output (source padding masked), then the FFN, each pre-normed
and residual. Target padding needs no mask: it only follows the real tokens, which the causal
mask keeps from seeing it, and its labels are ignored.

Decoding one position (:meth:`TransformerSeq2SeqSymGen.decoder_step`) recomputes nothing:
the encoder graph computes each decoder layer's cross-attention keys and values once
(statics ``cross_keys_{i}`` / ``cross_values_{i}``, (N, heads, S, model_size / heads)), and
each step writes its self-attention key and value at position ``step`` of fixed-size caches
(states ``self_keys_{i}`` / ``self_values_{i}``, (N, heads, max_steps, model_size / heads),
zero at first) and attends over the positions up to ``step``. Arrays keep the heads split
(batch still on axis 0) so that a step needs no transposes.

Parameter names: ``{source,target}_embed_weight`` (``embed_weight`` when shared),
``encoder{i}_`` and ``decoder{i}_`` layers with ``self_{query,key,value,output}``,
``cross_...`` (decoder), ``ffn_{inner,outer}`` (``_weight``, ``_bias``) and
``{self,cross,ffn}_norm_{gamma,beta}``; ``encoder_norm_*``, ``decoder_norm_*``,
``output_bias`` and ``output_weight`` (not when tied).
"""

from __future__ import annotations

import math
from typing import Any

import mxnet as mx

from mxtrain.data.base import DataInfo
from mxtrain.models.seq2seq_common import (
    MASKED_SCORE,
    Seq2SeqSymGen,
    masked_softmax,
    source_mask_bias,
)
from mxtrain.models.seq2seq_options import TransformerSeq2SeqOptions

#: the wavelength scale of the sinusoid positions (Vaswani et al. 2017)
POSITION_SCALE = 10000.0


def _dense(x: Any, size: int, name: str) -> Any:
    return mx.sym.FullyConnected(x, num_hidden=size, flatten=False, name=name)


def _split_heads(x: Any, heads: int) -> Any:
    """(N, T, d) -> (N, heads, T, d / heads)."""
    return mx.sym.transpose(mx.sym.reshape(x, shape=(0, 0, heads, -1)), axes=(0, 2, 1, 3))


def _fold_heads(x: Any) -> Any:
    """(N, heads, T, dh) -> (N * heads, T, dh)."""
    return mx.sym.reshape(x, shape=(-3, -2))


def _attend(queries: Any, keys: Any, values: Any, bias: Any, head_size: int) -> Any:
    """Scaled dot-product attention: (B, Tq, dh) queries, (B, Tk, dh) keys and values, bias
    broadcast onto the (B, Tq, Tk) scores -> (B, Tq, dh)."""
    scores = mx.sym.batch_dot(queries * (1.0 / math.sqrt(head_size)), keys, transpose_b=True)
    return mx.sym.batch_dot(masked_softmax(scores, bias), values)


def _heads_bias(source_bias: Any, heads: int) -> Any:
    """(N, S) source bias -> (N * heads, 1, S), onto every head's (Tq, S) scores."""
    bias = mx.sym.reshape(source_bias, shape=(0, 1, 1, -1))
    return _fold_heads(mx.sym.broadcast_axis(bias, axis=1, size=heads))


def _positions(first: Any, count: int, size: int) -> Any:
    """Sinusoid encodings of ``count`` positions from ``first`` ((1,), or None: 0):
    (1, count, size), sin of position * frequency in the first half, cos in the second."""
    half = size // 2
    frequencies = mx.sym.exp(mx.sym.arange(0, half) * (-math.log(POSITION_SCALE) / half))
    positions = mx.sym.reshape(mx.sym.arange(0, count), shape=(-1, 1))
    if first is not None:
        positions = mx.sym.broadcast_add(positions, mx.sym.reshape(first, shape=(1, 1)))
    angles = mx.sym.broadcast_mul(positions, mx.sym.reshape(frequencies, shape=(1, -1)))
    encodings = mx.sym.concat(mx.sym.sin(angles), mx.sym.cos(angles), dim=1)
    return mx.sym.expand_dims(encodings, axis=0)


class TransformerSeq2SeqSymGen(Seq2SeqSymGen):
    """``sym_gen`` of ``transformer_seq2seq`` (module docstring)."""

    model = "transformer_seq2seq"

    options: TransformerSeq2SeqOptions

    def __init__(self, options: TransformerSeq2SeqOptions, data_info: DataInfo) -> None:
        size = options.model_size
        super().__init__(options, data_info, num_embed=size, output_width=size)
        self.heads = options.num_heads
        self.head_size = options.model_size // options.num_heads
        layers = range(options.decoders)
        self.static_names = (
            "source_bias",
            *(f"cross_{kind}_{i}" for i in layers for kind in ("keys", "values")),
        )
        self.state_names = tuple(f"self_{kind}_{i}" for i in layers for kind in ("keys", "values"))

    def _dropout(self, x: Any, name: str) -> Any:
        p = self.options.dropout
        return mx.sym.Dropout(x, p=p, name=name) if p > 0 else x

    def _norm(self, x: Any, name: str) -> Any:
        return mx.sym.LayerNorm(x, axis=-1, name=name)

    def _embed(self, embedded: Any, positions: Any, name: str) -> Any:
        """sqrt(d) * embedding + positions ((1, T, d), broadcast over the batch), dropped out."""
        scaled = embedded * math.sqrt(self.options.model_size)
        return self._dropout(mx.sym.broadcast_add(scaled, positions), f"{name}_dropout")

    def _merge_heads(self, x: Any) -> Any:
        """(N * heads, T, dh) -> (N, T, d)."""
        x = mx.sym.reshape(x, shape=(-4, -1, self.heads, -2))
        return mx.sym.reshape(mx.sym.transpose(x, axes=(0, 2, 1, 3)), shape=(0, 0, -3))

    def _ffn(self, x: Any, prefix: str) -> Any:
        """x + FFN(LN(x))."""
        opts = self.options
        y = self._norm(x, f"{prefix}ffn_norm")
        y = mx.sym.Activation(_dense(y, opts.ffn_size, f"{prefix}ffn_inner"), act_type="relu")
        y = _dense(self._dropout(y, f"{prefix}ffn_dropout"), opts.model_size, f"{prefix}ffn_outer")
        return x + self._dropout(y, f"{prefix}ffn_out_dropout")

    def _self_attention(self, x: Any, prefix: str, bias: Any) -> Any:
        """x + SelfAttention(LN(x)) over all positions of (N, T, d) ``x``."""
        size = self.options.model_size
        y = self._norm(x, f"{prefix}self_norm")
        q, k, v = (
            _fold_heads(_split_heads(_dense(y, size, f"{prefix}self_{part}"), self.heads))
            for part in ("query", "key", "value")
        )
        y = self._merge_heads(_attend(q, k, v, bias, self.head_size))
        y = _dense(y, size, f"{prefix}self_output")
        return x + self._dropout(y, f"{prefix}self_dropout")

    def _cross_attention(self, x: Any, prefix: str, keys: Any, values: Any, bias: Any) -> Any:
        """x + CrossAttention(LN(x)) over the source's (N, heads, S, dh) keys and values."""
        size = self.options.model_size
        y = self._norm(x, f"{prefix}cross_norm")
        q = _fold_heads(_split_heads(_dense(y, size, f"{prefix}cross_query"), self.heads))
        y = _attend(q, _fold_heads(keys), _fold_heads(values), bias, self.head_size)
        y = _dense(self._merge_heads(y), size, f"{prefix}cross_output")
        return x + self._dropout(y, f"{prefix}cross_dropout")

    def encode(self, source: Any, seq_len: int, max_steps: int | None) -> dict[str, Any]:
        opts = self.options
        source_bias = source_mask_bias(source, self.pad_id)
        positions = _positions(None, seq_len, opts.model_size)
        x = self._embed(self.embed(source, "source"), positions, "source_embed")
        bias = _heads_bias(source_bias, self.heads)
        for i in range(opts.num_layers):
            x = self._self_attention(x, f"encoder{i}_", bias)
            x = self._ffn(x, f"encoder{i}_")
        x = self._norm(x, "encoder_norm")
        encoded = {"source_bias": source_bias}
        for i in range(opts.decoders):
            for kind, part in (("keys", "key"), ("values", "value")):
                projected = _dense(x, opts.model_size, f"decoder{i}_cross_{part}")
                encoded[f"cross_{kind}_{i}"] = _split_heads(projected, self.heads)
        if max_steps is not None:  # empty caches, (N, heads, max_steps, dh)
            zero = mx.sym.reshape(
                mx.sym.zeros_like(mx.sym.slice_axis(source, axis=1, begin=0, end=1)),
                shape=(0, 1, 1, 1),
            )
            for name in self.state_names:
                encoded[name] = mx.sym.broadcast_to(
                    zero, shape=(0, self.heads, max_steps, self.head_size)
                )
        return encoded

    def decode_all(self, target: Any, seq_len: int, encoded: dict[str, Any]) -> Any:
        opts = self.options
        positions = _positions(None, seq_len, opts.model_size)
        x = self._embed(self.embed(target, "target"), positions, "target_embed")
        steps = mx.sym.arange(0, seq_len)
        later = mx.sym.broadcast_greater(
            mx.sym.reshape(steps, shape=(1, -1)), mx.sym.reshape(steps, shape=(-1, 1))
        )
        causal = mx.sym.reshape(later * MASKED_SCORE, shape=(1, seq_len, seq_len))
        cross_bias = _heads_bias(encoded["source_bias"], self.heads)
        for i in range(opts.decoders):
            prefix = f"decoder{i}_"
            x = self._self_attention(x, prefix, causal)
            keys, values = encoded[f"cross_keys_{i}"], encoded[f"cross_values_{i}"]
            x = self._cross_attention(x, prefix, keys, values, cross_bias)
            x = self._ffn(x, prefix)
        x = self._norm(x, "decoder_norm")
        return mx.sym.reshape(x, shape=(-1, opts.model_size))

    def _cached_self_attention(
        self, x: Any, prefix: str, step: Any, caches: tuple[Any, Any], max_steps: int
    ) -> tuple[Any, list[Any]]:
        """x + SelfAttention(LN(x)) of one position ((N, 1, d) ``x``) over the cached keys and
        values of positions 0..step, this position's written at ``step``; -> (x, caches)."""
        size = self.options.model_size
        y = self._norm(x, f"{prefix}self_norm")
        # (N, 1, d) -> (N, heads, 1, dh): with one position, a reshape splits the heads
        split = (0, self.heads, 1, self.head_size)
        here = mx.sym.reshape(mx.sym.one_hot(step, depth=max_steps), shape=(1, 1, -1, 1))
        new_caches = []
        for part, cache in zip(("key", "value"), caches, strict=True):
            projected = mx.sym.reshape(_dense(y, size, f"{prefix}self_{part}"), shape=split)
            new_caches.append(
                mx.sym.broadcast_add(
                    mx.sym.broadcast_mul(cache, 1 - here), mx.sym.broadcast_mul(projected, here)
                )
            )
        q = mx.sym.reshape(_dense(y, size, f"{prefix}self_query"), shape=(-1, 1, self.head_size))
        slots = mx.sym.reshape(mx.sym.arange(0, max_steps), shape=(1, 1, -1))
        later = mx.sym.broadcast_greater(slots, mx.sym.reshape(step, shape=(1, 1, 1)))
        keys, values = (_fold_heads(c) for c in new_caches)
        y = _attend(q, keys, values, later * MASKED_SCORE, self.head_size)
        y = _dense(mx.sym.reshape(y, shape=(-1, 1, size)), size, f"{prefix}self_output")
        return x + self._dropout(y, f"{prefix}self_dropout"), new_caches

    def decode_one(
        self, prev_token: Any, step: Any, inputs: dict[str, Any], max_steps: int
    ) -> tuple[Any, list[Any]]:
        opts = self.options
        position = _positions(step, 1, opts.model_size)  # (1, 1, d)
        embedded = mx.sym.reshape(self.embed(prev_token, "target"), shape=(0, 1, -1))
        x = self._embed(embedded, position, "target_embed")
        cross_bias = _heads_bias(inputs["source_bias"], self.heads)
        states = []
        for i in range(opts.decoders):
            prefix = f"decoder{i}_"
            caches = (inputs[f"self_keys_{i}"], inputs[f"self_values_{i}"])
            x, new_caches = self._cached_self_attention(x, prefix, step, caches, max_steps)
            states.extend(new_caches)
            keys, values = inputs[f"cross_keys_{i}"], inputs[f"cross_values_{i}"]
            x = self._cross_attention(x, prefix, keys, values, cross_bias)
            x = self._ffn(x, prefix)
        x = self._norm(x, "decoder_norm")
        return mx.sym.reshape(x, shape=(-1, opts.model_size)), states

    def carried_shapes(self, seq_len: int, batch: int, max_steps: int) -> dict[str, tuple]:
        heads, head_size = self.heads, self.head_size
        shapes: dict[str, tuple] = {"source_bias": (batch, seq_len)}
        for name in self.static_names[1:]:
            shapes[name] = (batch, heads, seq_len, head_size)
        for name in self.state_names:
            shapes[name] = (batch, heads, max_steps, head_size)
        return shapes


def build_transformer_seq2seq(
    options: TransformerSeq2SeqOptions, data_info: DataInfo
) -> TransformerSeq2SeqSymGen:
    """The ``sym_gen`` of ``transformer_seq2seq`` (see :class:`TransformerSeq2SeqSymGen`)."""
    return TransformerSeq2SeqSymGen(options, data_info)
