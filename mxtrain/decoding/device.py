"""Step scores and beam rows on the device (MXNet NDArrays), for the step models of
:mod:`mxtrain.decoding.seq2seq` and :mod:`mxtrain.inference.generate`.

Beam search needs only each row's ``beam`` best tokens: the best ``beam`` continuations of a
sentence are among them. :class:`DeviceScores` picks them on the device (``topk``), so only
(rows, beam) values reach the host per step, never the (rows, vocabulary) log-probabilities;
the recurrent states never leave the device (``take`` reorders them there). Measured on a
2-core CPU for 160 rows (32 inputs x beam 5): ``topk`` then copying (160, 7) took 2.9 ms for
10k words and 8.3 ms for 32k, copying the whole (160, V) and ``argpartition`` on the host
24.6 and 67 ms; for a 60-symbol G2P vocabulary 0.18 against 0.11 ms, small next to a step.
Sampling reads the whole distribution of each row (it draws from all of it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


class DeviceScores:
    """:class:`StepScores` of an NDArray of log-probabilities on the device: ``top`` picks on
    the device (``topk``), so only (rows, k) values are copied to the host."""

    def __init__(self, log_probs: Any) -> None:
        self.log_probs = log_probs

    def top(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        # deferred: MXNet reads its thread settings when it loads (devices.configure_threads)
        import mxnet as mx

        k = min(k, int(self.log_probs.shape[1]))
        vals, ids = mx.nd.topk(self.log_probs, axis=1, k=k, ret_typ="both", is_ascend=False)
        return vals.asnumpy(), np.rint(ids.asnumpy()).astype(np.int64)

    def full(self) -> np.ndarray:
        return np.asarray(self.log_probs.asnumpy())


def repeat_rows(arrays: Sequence[Any], times: int, axes: Sequence[int] | None = None) -> list[Any]:
    """Each NDArray with every row repeated ``times`` times in place (a beam); rows along
    ``axes`` (one per array; default 0: the contract's seq2seq states; a fused RNN's states
    have the batch on axis 1)."""
    # deferred: MXNet reads its thread settings when it loads (devices.configure_threads)
    import mxnet as mx

    if times == 1:
        return list(arrays)
    axes = axes or [0] * len(arrays)
    return [mx.nd.repeat(a, repeats=times, axis=x) for a, x in zip(arrays, axes, strict=True)]


def take_rows(
    arrays: Sequence[Any], rows: np.ndarray, axes: Sequence[int] | None = None
) -> list[Any]:
    """Each NDArray's rows ``rows`` (along ``axes``, default 0), on its device; nothing leaves
    it."""
    # deferred: MXNet reads its thread settings when it loads (devices.configure_threads)
    import mxnet as mx

    if not arrays:
        return []
    index = mx.nd.array(rows, ctx=arrays[0].context, dtype="int64")
    axes = axes or [0] * len(arrays)
    return [mx.nd.take(a, index, axis=x) for a, x in zip(arrays, axes, strict=True)]
