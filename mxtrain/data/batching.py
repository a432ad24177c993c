"""Cutting one bucket's padded matrices into DataBatches (shared by the sequence iterators)."""

from __future__ import annotations

from typing import Any

import mxnet as mx
import numpy as np


def bucket_batches(
    data: np.ndarray,
    label: np.ndarray,
    row_tokens: np.ndarray,
    index: np.ndarray,
    *,
    length: int,
    batch_size: int,
    real_rows: int,
    desc_data: list[Any],
    desc_label: list[Any],
) -> list[Any]:
    """DataBatches of ``batch_size`` rows over whole padded matrices of one bucket.

    The matrices hold ``real_rows`` real rows followed by padding rows, and their row count
    is a multiple of ``batch_size``. Each batch carries ``pad`` (its padding rows), ``index``
    (source line of each row, -1 for padding), ``bucket_key`` and ``num_tokens`` (the real
    label tokens, counted here once so ``next()`` does no work).
    """
    nd_data = mx.nd.array(data, dtype=np.float32)
    nd_label = mx.nd.array(label, dtype=np.float32)
    tokens = row_tokens.reshape(-1, batch_size).sum(axis=1)
    batches = []
    for j in range(tokens.size):
        lo, hi = j * batch_size, (j + 1) * batch_size
        batch = mx.io.DataBatch(
            data=[nd_data[lo:hi]],
            label=[nd_label[lo:hi]],
            pad=max(0, hi - real_rows),
            index=index[lo:hi],
            bucket_key=length,
            provide_data=desc_data,
            provide_label=desc_label,
        )
        batch.num_tokens = int(tokens[j])
        batches.append(batch)
    return batches
