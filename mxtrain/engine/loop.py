"""The fit and score loops over a BucketingModule.

The loop keeps MXNet's asynchronous engine busy: metrics are accumulated on the device and
read once per log interval, the next batch is fetched (in a background thread) and its
bucket bound while the current batch computes, and nothing per batch calls ``asnumpy()``.
Before every training batch the random generator is reseeded from (seed, epoch, batch), so
dropout replays exactly when a run is continued from a checkpoint.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import mxnet as mx

from mxtrain.engine.bucketing import BucketingModule
from mxtrain.engine.prefetch import PrefetchIter
from mxtrain.errors import DivergedError


class Metric(Protocol):
    """The device-side metric interface (see mxtrain.metrics)."""

    name: str

    def update(self, labels: Sequence[Any], preds: Sequence[Any]) -> None: ...
    def get(self) -> dict[str, float]: ...
    def get_interval(self) -> dict[str, float]: ...
    def reset(self) -> None: ...
    def reset_interval(self) -> None: ...


class MetricSet:
    """Several metrics updated together, read together."""

    def __init__(self, metrics: Sequence[Metric]) -> None:
        self.metrics = list(metrics)

    def update(self, labels: Sequence[Any], preds: Sequence[Any]) -> None:
        for metric in self.metrics:
            metric.update(labels, preds)

    def get(self) -> dict[str, float]:
        values: dict[str, float] = {}
        for metric in self.metrics:
            values.update(metric.get())
        return values

    def get_interval(self) -> dict[str, float]:
        values: dict[str, float] = {}
        for metric in self.metrics:
            values.update(metric.get_interval())
        return values

    def reset(self) -> None:
        for metric in self.metrics:
            metric.reset()

    def reset_interval(self) -> None:
        for metric in self.metrics:
            metric.reset_interval()


def batch_seed(seed: int, epoch: int, batch: int) -> int:
    """A well-mixed 31-bit seed for one training batch, stable across processes."""
    digest = hashlib.blake2b(f"{seed}/{epoch}/{batch}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


@dataclass
class IntervalRecord:
    """Statistics of one log interval (or of a whole epoch)."""

    epoch: int  # 1-based
    batch: int  # batches done in this epoch
    batches: int  # batches in this interval
    samples: int
    tokens: int | None
    seconds: float
    metrics: dict[str, float]
    lr: float | None

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_s(self) -> float | None:
        if self.tokens is None:
            return None
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class EpochResult:
    """What one epoch produced."""

    epoch: int  # 1-based
    train: IntervalRecord
    eval: dict[str, float] | None = None
    eval_seconds: float | None = None


class FitHooks(Protocol):
    """Callbacks of the fit loop."""

    def on_epoch_start(self, epoch: int, num_batches: int | None) -> None:
        """Called before the first batch of ``epoch`` (1-based)."""

    def on_interval(self, record: IntervalRecord) -> None:
        """Called every ``log_interval`` batches with the interval's statistics."""

    def on_epoch_end(self, result: EpochResult) -> None:
        """Called after the epoch and its evaluation."""


class NoHooks:
    """Fit-loop callbacks that do nothing."""

    def on_epoch_start(self, epoch: int, num_batches: int | None) -> None:
        pass

    def on_interval(self, record: IntervalRecord) -> None:
        pass

    def on_epoch_end(self, result: EpochResult) -> None:
        pass


@dataclass
class FitOptions:
    """How the loop runs; the config layer fills it from ``fit:``."""

    num_epoch: int
    begin_epoch: int = 0  # epochs already done
    log_interval: int = 50
    prefetch: int = 2
    max_batches_per_epoch: int | None = None
    eval_max_batches: int | None = None
    seed: int = 1
    metric_factory: Callable[[], MetricSet] = field(default=lambda: MetricSet([]))


def _batches(data_iter: Any, prefetch: int) -> tuple[Iterator[Any], Callable[[], None]]:
    """An iterator over the epoch's batches and a function that releases its resources."""
    if prefetch > 0:
        prefetcher = PrefetchIter(data_iter, depth=prefetch)
        return iter(prefetcher), prefetcher.close
    return iter(data_iter), lambda: None


def _count(batch: Any) -> tuple[int, int | None]:
    """(real samples, real tokens or None) in one batch, from host-side attributes only."""
    samples = batch.data[0].shape[0] - (batch.pad or 0)
    tokens = getattr(batch, "num_tokens", None)
    return samples, tokens


def _current_lr(module: BucketingModule) -> float | None:
    optimizer = module.optimizer
    if optimizer is None:
        return None
    try:
        return float(optimizer.learning_rate)
    except (AttributeError, TypeError, ValueError):
        return None


def _check_finite(values: dict[str, float], epoch: int, batch: int) -> None:
    bad = {k: v for k, v in values.items() if not math.isfinite(v)}
    if bad:
        names = ", ".join(f"{k}={v}" for k, v in bad.items())
        raise DivergedError(
            f"training diverged in epoch {epoch} at batch {batch}: {names}.",
            hint="Lower optimizer.learning_rate, set optimizer.clip_gradient, or check the "
            "data; the checkpoints saved before this point are intact.",
        )


def score(
    module: BucketingModule,
    data_iter: Any,
    metrics: MetricSet,
    *,
    max_batches: int | None = None,
    prefetch: int = 2,
) -> dict[str, float]:
    """Run ``data_iter`` through ``module`` in inference mode and return the metric values."""
    data_iter.reset()
    metrics.reset()
    batches, release = _batches(data_iter, prefetch)
    try:
        for nbatch, batch in enumerate(batches):
            if max_batches is not None and nbatch >= max_batches:
                break
            module.prepare(batch)
            module.forward(batch, is_train=False)
            module.update_metric(metrics, batch.label)
    finally:
        release()
    return metrics.get()


def fit(
    module: BucketingModule,
    train_iter: Any,
    options: FitOptions,
    *,
    eval_iter: Any = None,
    hooks: FitHooks | None = None,
) -> list[EpochResult]:
    """Train ``module`` (bound, initialized, optimizer ready) for the configured epochs."""
    hooks = hooks or NoHooks()
    metrics = options.metric_factory()
    results = []
    for epoch_index in range(options.begin_epoch, options.num_epoch):
        epoch = epoch_index + 1
        if hasattr(train_iter, "set_epoch"):
            train_iter.set_epoch(epoch_index)
        train_iter.reset()
        metrics.reset()
        num_batches = getattr(train_iter, "num_batches", None)
        if options.max_batches_per_epoch is not None:
            limit = options.max_batches_per_epoch
            num_batches = min(num_batches, limit) if num_batches is not None else limit
        hooks.on_epoch_start(epoch, num_batches)
        train_record = _train_epoch(module, train_iter, metrics, options, epoch, hooks)
        result = EpochResult(epoch=epoch, train=train_record)
        if eval_iter is not None:
            started = time.perf_counter()
            result.eval = score(
                module,
                eval_iter,
                options.metric_factory(),
                max_batches=options.eval_max_batches,
                prefetch=options.prefetch,
            )
            result.eval_seconds = time.perf_counter() - started
        hooks.on_epoch_end(result)
        results.append(result)
    return results


def _train_epoch(
    module: BucketingModule,
    train_iter: Any,
    metrics: MetricSet,
    options: FitOptions,
    epoch: int,
    hooks: FitHooks,
) -> IntervalRecord:
    limit = options.max_batches_per_epoch
    batches, release = _batches(train_iter, options.prefetch)
    epoch_start = interval_start = time.perf_counter()
    totals = [0, 0, 0]  # samples, tokens, batches (whole epoch)
    window = [0, 0, 0]  # the same, since the last log interval
    has_tokens = True
    nbatch = 0
    try:
        batch = next(batches, None)
        if batch is not None:
            module.prepare(batch)
        while batch is not None and (limit is None or nbatch < limit):
            mx.random.seed(batch_seed(options.seed, epoch - 1, nbatch))
            module.forward_backward(batch)
            module.update()
            upcoming = next(batches, None) if limit is None or nbatch + 1 < limit else None
            if upcoming is not None:
                module.prepare(upcoming)  # bind its bucket while this batch computes
            module.update_metric(metrics, batch.label)
            samples, tokens = _count(batch)
            has_tokens = has_tokens and tokens is not None
            for acc in (totals, window):
                acc[0] += samples
                acc[1] += tokens or 0
                acc[2] += 1
            nbatch += 1
            batch = upcoming
            if options.log_interval > 0 and nbatch % options.log_interval == 0:
                values = metrics.get_interval()  # the one sync point per interval
                _check_finite(values, epoch, nbatch)
                now = time.perf_counter()
                hooks.on_interval(
                    IntervalRecord(
                        epoch=epoch,
                        batch=nbatch,
                        batches=window[2],
                        samples=window[0],
                        tokens=window[1] if has_tokens else None,
                        seconds=now - interval_start,
                        metrics=values,
                        lr=_current_lr(module),
                    )
                )
                metrics.reset_interval()
                window = [0, 0, 0]
                interval_start = time.perf_counter()
    finally:
        release()
    values = metrics.get()
    _check_finite(values, epoch, nbatch)
    return IntervalRecord(
        epoch=epoch,
        batch=nbatch,
        batches=totals[2],
        samples=totals[0],
        tokens=totals[1] if has_tokens else None,
        seconds=time.perf_counter() - epoch_start,
        metrics=values,
        lr=_current_lr(module),
    )
