"""The one predict loop: every batch forwarded with one batch in flight, results in input order.

Each task says how to reduce a forward's outputs on the device (``reduce``: queue the work,
read nothing) and how to store the reduced values of one batch (``collect``). The values of a
batch are read back while the device computes the next one, so the engine never waits for
the host; ``index`` on each batch says which input row (line, sentence) each batch row holds
(-1 for padding rows).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from mxtrain.errors import ConfigError


def predict_batches(
    opened: Any,
    reduce: Callable[[Any, Any], Any],
    collect: Callable[[np.ndarray, Any], None],
    *,
    unit: str,
) -> int:
    """Forward every batch of ``opened.data_iter`` through ``opened.module``;
    ``reduce(module, batch)`` queues the reductions, ``collect(index, reduced)`` stores them one
    batch later. ``unit`` names what ``index`` points at, for the error when it is missing.
    Returns the number of batches."""
    data_iter, module = opened.data_iter, opened.module
    data_iter.reset()
    pending = None
    batches = 0
    for batch in data_iter:
        module.forward(batch, is_train=False)
        reduced = reduce(module, batch)
        if pending is not None:
            collect(*pending)  # the previous batch's results, while this one computes
        index = getattr(batch, "index", None)
        if index is None:
            raise ConfigError(
                f"The data iterator's batches have no 'index' ({unit}), so predictions cannot "
                "be written in input order."
            )
        pending = (np.asarray(index, dtype=np.int64), reduced)
        batches += 1
    if pending is not None:
        collect(*pending)
    return batches
