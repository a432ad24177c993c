"""Which way a metric is better, and the one tracker of its best value so far.

Used for the best checkpoint (``checkpoint.best_metric``), early stopping
(``fit.early_stopping``), the ``*`` mark in epoch summaries and the best value that
``mxtrain runs``/``show`` read back from metrics.jsonl. A metric says its own direction with a
``lower_is_better`` attribute (mxtrain's metrics do; a plugin metric may); a metric that does
not is judged by its name (a decoding metric by its entry in
:data:`~mxtrain.text_metrics.DECODING_METRICS`, others by :data:`LOWER_IS_BETTER`), and
``mode: min|max`` in the config wins over both.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from mxtrain.text_metrics import DECODING_METRICS

#: metric names whose smaller values are better, for metrics that do not say
LOWER_IS_BETTER = ("perplexity", "loss", "error", "mae", "mse", "rmse", "cross_entropy")


def declared_direction(metrics: Iterable[Any], name: str) -> bool | None:
    """The ``lower_is_better`` that the metric reporting ``name`` declares, if it does."""
    for metric in metrics:
        declared = getattr(metric, "lower_is_better", None)
        if getattr(metric, "name", None) == name and isinstance(declared, bool):
            return declared
    return None


def lower_is_better(metric: str, mode: str = "auto", declared: bool | None = None) -> bool:
    """Whether a smaller ``metric`` is better: ``mode`` min/max if given, else what the metric
    declares, else its name."""
    if mode != "auto":
        return mode == "min"
    if declared is not None:
        return declared
    if metric in DECODING_METRICS:  # wer, per: lower; bleu, chrf: higher
        return DECODING_METRICS[metric].lower_is_better
    return metric in LOWER_IS_BETTER


class MetricTracker:
    """The best value of one metric so far, and how many values since it last improved.

    A value improves on the best by more than ``min_delta`` in the metric's direction; a
    value that is not finite never improves. ``get_state``/``set_state`` carry the best and
    the count through checkpoints, so early stopping resumes where it stood.
    """

    def __init__(
        self,
        metric: str,
        lower_is_better: bool,
        *,
        min_delta: float = 0.0,
        patience: int | None = None,
    ) -> None:
        self.metric = metric
        self.lower_is_better = lower_is_better
        self.min_delta = min_delta
        self.patience = patience
        self.best: float | None = None
        self.epoch: int | None = None  # where the best was seen
        self.bad = 0  # values since the best

    def improves(self, value: float) -> bool:
        """Whether ``value`` would be a new best."""
        if not math.isfinite(value):
            return False
        if self.best is None:
            return True
        if self.lower_is_better:
            return value < self.best - self.min_delta
        return value > self.best + self.min_delta

    def update(self, value: float, epoch: int | None = None) -> bool:
        """Record one value; True when it is the best so far."""
        if self.improves(value):
            self.best, self.epoch, self.bad = value, epoch, 0
            return True
        self.bad += 1
        return False

    @property
    def out_of_patience(self) -> bool:
        """True once ``patience`` values in a row have not improved (never without one)."""
        return self.patience is not None and self.bad >= self.patience

    def summary(self) -> dict[str, Any] | None:
        """``{"metric", "value", "epoch"}`` of the best so far, None before the first."""
        if self.best is None:
            return None
        return {"metric": self.metric, "value": self.best, "epoch": self.epoch}

    def get_state(self) -> dict[str, Any]:
        return {"best": self.best, "bad": self.bad}

    def set_state(self, state: dict[str, Any] | None) -> None:
        state = state or {}
        self.best = state.get("best")
        self.bad = int(state.get("bad", 0))


class PlateauWatch:
    """When ``lr_scheduler.type: plateau`` decays the learning rate: after more than
    ``patience`` evaluations in a row without an improvement of ``metric`` (by more than
    ``min_delta``), then not again during ``cooldown`` evaluations. ``reductions`` counts the
    decays so far; ``get_state``/``set_state`` carry everything through checkpoints."""

    def __init__(
        self, metric: str, lower_is_better: bool, *, patience: int, cooldown: int, min_delta: float
    ) -> None:
        self.tracker = MetricTracker(metric, lower_is_better, min_delta=min_delta)
        self.patience = patience
        self.cooldown = cooldown
        self.cooling = 0  # evaluations of the cooldown still to come
        self.reductions = 0

    def observe(self, values: dict[str, float]) -> bool:
        """Record one evaluation; True when the learning rate decays now."""
        value = values.get(self.tracker.metric)
        if value is None:
            return False
        self.tracker.update(value)
        if self.cooling > 0:
            self.cooling -= 1
            self.tracker.bad = 0
            return False
        if self.tracker.bad > self.patience:
            self.reductions += 1
            self.cooling = self.cooldown
            self.tracker.bad = 0
            return True
        return False

    def get_state(self) -> dict[str, Any]:
        return {**self.tracker.get_state(), "cooling": self.cooling, "reductions": self.reductions}

    def set_state(self, state: dict[str, Any] | None) -> None:
        state = state or {}
        self.tracker.set_state(state)
        self.cooling = int(state.get("cooling", 0))
        self.reductions = int(state.get("reductions", 0))
