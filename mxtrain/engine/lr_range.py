"""The learning-rate range test behind ``mxtrain lr-find``.

From the model's initial state, train ``updates`` batches with a learning rate that grows
exponentially from ``start`` to ``end`` and record each batch's training loss (the mean
cross-entropy of its real labels, log perplexity), smoothed by an exponential moving
average with bias correction. The test stops early once the smoothed loss exceeds
``DIVERGED`` times its lowest value or a loss is not finite: the rate is too high by then.
The suggested rate is where the smoothed loss falls fastest against log(lr), before its
minimum (Smith 2017, "Cyclical Learning Rates for Training Neural Networks").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import mxnet as mx
import numpy as np

from mxtrain.engine.bucketing import BucketingModule
from mxtrain.engine.loop import MetricSet, batch_seed

#: the test stops once the smoothed loss exceeds this many times its lowest value
DIVERGED = 4.0
#: weight of the past in the moving average of the loss
SMOOTHING = 0.98


@dataclass(frozen=True)
class RangePoint:
    """One update of the test."""

    update: int  # from 1
    lr: float
    loss: float  # the batch's mean cross-entropy
    smoothed: float


def rates(start: float, end: float, updates: int) -> list[float]:
    """``updates`` learning rates growing exponentially from ``start`` to ``end``."""
    if updates == 1:
        return [start]
    return [start * (end / start) ** (i / (updates - 1)) for i in range(updates)]


def lr_range_test(
    module: BucketingModule,
    data_iter: Any,
    perplexity: Callable[[], MetricSet],
    *,
    start: float,
    end: float,
    updates: int,
    seed: int,
) -> tuple[list[RangePoint], str | None]:
    """Train ``updates`` batches of ``data_iter`` (epochs repeat as needed) at rising rates;
    ``perplexity`` makes a metric set computing ``perplexity`` of one batch. Returns the
    points and why the test stopped early (``"diverged"``), or None when it ran through."""
    average, lowest, points = 0.0, math.inf, []
    batches = _endless(data_iter)
    for i, lr in enumerate(rates(start, end, updates)):
        epoch, index, batch = next(batches)
        module.optimizer.set_learning_rate(lr)
        mx.random.seed(batch_seed(seed, epoch, index))
        module.forward_backward(batch)
        metrics = perplexity()
        module.update_metric(metrics, batch.label)
        module.update()
        loss = math.log(max(metrics.get()["perplexity"], 1.0))
        average = SMOOTHING * average + (1 - SMOOTHING) * loss
        smoothed = average / (1 - SMOOTHING ** (i + 1))
        points.append(RangePoint(i + 1, lr, loss, smoothed))
        if not math.isfinite(loss) or smoothed > DIVERGED * lowest:
            return points, "diverged"
        lowest = min(lowest, smoothed)
    return points, None


def _endless(data_iter: Any) -> Iterator[tuple[int, int, Any]]:
    """(epoch from 0, batch index, batch) over as many epochs of ``data_iter`` as asked."""
    epoch = 0
    while True:
        if hasattr(data_iter, "set_epoch"):
            data_iter.set_epoch(epoch)
        data_iter.reset()
        found = False
        for index, batch in enumerate(data_iter):
            found = True
            yield epoch, index, batch
        if not found:
            raise ValueError("the training data gave no batch")
        epoch += 1


def suggest(points: list[RangePoint]) -> float | None:
    """The rate where the smoothed loss falls fastest against log10(lr), among the points
    before its lowest value (the first tenth left out: the average is still settling); None
    when fewer than 5 points come before the lowest."""
    lowest = min(range(len(points)), key=lambda i: points[i].smoothed, default=0)
    head = points[: lowest + 1]
    skip = len(head) // 10
    head = head[skip:]
    if len(head) < 5:
        return None
    logs = np.log10([p.lr for p in head])
    slopes = np.gradient(np.array([p.smoothed for p in head]), logs)
    return float(head[int(np.argmin(slopes))].lr)
