"""Character-aware word vectors: a character CNN with max-pooling over each word.

Input ``chars``: (batch, length, characters) character ids, 0 padding (after a word's last
character, and whole padding words). Every character is embedded, a convolution of
``char_kernel`` characters (padded by half a kernel on each side) gives ``char_filters``
features at each character, and a word's vector is their maximum over its own characters
(ReLU, then max). Padding characters embed to zero, exactly as the convolution's own padding,
and never win the maximum, so a word's vector does not depend on how far its batch pads
characters; a padding word's vector is zero. Parameters: ``char_embed_weight``,
``char_conv_weight``, ``char_conv_bias``.
"""

from __future__ import annotations

from typing import Any

import mxnet as mx

#: what a padding position adds before the maximum: below any real feature
MASKED = -1e9


def char_word_vectors(
    chars: Any, seq_len: int, char_vocab_size: int, embed: int, filters: int, kernel: int
) -> Any:
    """(batch, seq_len, filters) word vectors from ``chars`` (batch, seq_len, characters)."""
    real = mx.sym.clip(chars, 0, 1)  # ids are non-negative: 1 for characters, 0 for padding
    x = mx.sym.Embedding(chars, input_dim=char_vocab_size, output_dim=embed, name="char_embed")
    x = mx.sym.broadcast_mul(x, mx.sym.expand_dims(real, axis=3))
    x = mx.sym.reshape(x, shape=(-3, 0, 0))  # (batch * words, characters, embed)
    x = mx.sym.transpose(x, axes=(0, 2, 1))  # (batch * words, embed, characters)
    x = mx.sym.Convolution(
        x, kernel=(kernel,), pad=(kernel // 2,), num_filter=filters, name="char_conv"
    )
    x = mx.sym.Activation(x, act_type="relu")
    real = mx.sym.expand_dims(mx.sym.reshape(real, shape=(-3, 0)), axis=1)  # (b * w, 1, c)
    x = mx.sym.broadcast_add(x, (1 - real) * MASKED)
    pooled = mx.sym.max(x, axis=2)  # (batch * words, filters)
    pooled = mx.sym.broadcast_mul(pooled, mx.sym.max(real, axis=2))  # padding words: 0
    return mx.sym.reshape(pooled, shape=(-1, seq_len, filters))
