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
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import mxnet as mx

from mxtrain.crashpoints import crash_point
from mxtrain.engine.bucketing import BucketingModule
from mxtrain.engine.monitoring import BatchProfiler, ParameterMonitor
from mxtrain.engine.prefetch import PrefetchIter
from mxtrain.errors import DivergedError, PreemptedError
from mxtrain.metric_tracker import MetricTracker, PlateauWatch


class Metric(Protocol):
    """The device-side metric interface (see mxtrain.metrics)."""

    name: str

    def update(self, labels: Sequence[Any], preds: Sequence[Any]) -> None: ...
    def get(self) -> dict[str, float]: ...
    def get_interval(self) -> dict[str, float]: ...
    def reset(self) -> None: ...
    def reset_interval(self) -> None: ...
    def get_state(self) -> Any: ...
    def set_state(self, state: Any) -> None: ...


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

    def get_state(self) -> dict[str, Any]:
        """Running sums of every metric, JSON-able (synchronises)."""
        return {m.name: m.get_state() for m in self.metrics}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore what ``get_state`` returned."""
        for metric in self.metrics:
            metric.set_state(state[metric.name])


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
class Position:
    """Where training stands: enough to continue exactly from here."""

    epoch: int  # 0-based index of the epoch in progress (= epochs completed when batch is 0)
    batch: int  # batches of that epoch already trained
    metrics: dict[str, Any]  # MetricSet.get_state() of the epoch in progress
    totals: list[int]  # [samples, tokens, batches] of the epoch so far
    updates: int = 0  # parameter updates since the run began
    seconds: float = 0.0  # training time since the run began (resumes included)
    early_stopping: dict[str, Any] | None = None  # MetricTracker.get_state()
    # seconds spent on this epoch's batches so far (None: saved by an mxtrain without it)
    epoch_seconds: float | None = 0.0
    plateau: dict[str, Any] | None = None  # PlateauWatch.get_state() (lr_scheduler: plateau)

    def to_json(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "batch": self.batch,
            "metrics": self.metrics,
            "totals": list(self.totals),
            "updates": self.updates,
            "seconds": self.seconds,
            "early_stopping": self.early_stopping,
            "epoch_seconds": self.epoch_seconds,
            "plateau": self.plateau,
        }

    @classmethod
    def from_json(cls, data: Any) -> Position:
        """The position saved by :meth:`to_json`; ValueError naming the field when a value
        is missing, of the wrong type or negative (a checkpoint must not resume from there)."""
        if not isinstance(data, dict):
            raise ValueError(f"the position is {type(data).__name__}, not a mapping")

        def count(key: str, default: int | None = None) -> int:
            value = data.get(key, default)
            if type(value) is not int or value < 0:
                raise ValueError(f"{key} is {value!r}, not a non-negative integer")
            return value

        seconds = data.get("seconds", 0.0)
        if type(seconds) not in (int, float) or not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"seconds is {seconds!r}, not a non-negative number")
        totals = data.get("totals")
        if not isinstance(totals, list) or not all(type(t) is int and t >= 0 for t in totals):
            raise ValueError(f"totals is {totals!r}, not a list of non-negative integers")
        epoch_seconds = data.get("epoch_seconds")
        if epoch_seconds is not None and (
            type(epoch_seconds) not in (int, float)
            or not math.isfinite(epoch_seconds)
            or epoch_seconds < 0
        ):
            raise ValueError(f"epoch_seconds is {epoch_seconds!r}, not a non-negative number")
        metrics, early = data.get("metrics"), data.get("early_stopping")
        if not isinstance(metrics, dict):
            raise ValueError(f"metrics is {metrics!r}, not a mapping")
        if early is not None and not isinstance(early, dict):
            raise ValueError(f"early_stopping is {early!r}, not a mapping")
        plateau = data.get("plateau")
        if plateau is not None and not isinstance(plateau, dict):
            raise ValueError(f"plateau is {plateau!r}, not a mapping")
        return cls(
            count("epoch"),
            count("batch"),
            metrics,
            list(totals),
            count("updates", 0),
            float(seconds),
            early,
            None if epoch_seconds is None else float(epoch_seconds),
            plateau,
        )


def _follow_plateau(module: BucketingModule, watch: PlateauWatch) -> None:
    """Give the module's plateau schedule the decays ``watch`` counted."""
    schedule = getattr(getattr(module, "optimizer", None), "lr_scheduler", None)
    schedule = getattr(schedule, "inner", schedule)  # unit: epochs wraps it
    if hasattr(schedule, "reductions"):
        setattr(schedule, "reductions", watch.reductions)  # noqa: B010 (typed Any | None)


def _plateau_decays(module: BucketingModule, options: FitOptions, values: dict[str, float]) -> bool:
    """Record one evaluation for the plateau schedule; True (and logged) when the learning
    rate decays now."""
    watch = options.plateau
    if watch is None or not watch.observe(values):
        return False
    _follow_plateau(module, watch)
    module.logger.info(
        "lr_scheduler plateau: %s has not improved for %d evaluations; learning rate now %s",
        watch.tracker.metric,
        watch.patience + 1,
        _current_lr(module),
    )
    return True


def _patience_ran_out(stopper: MetricTracker | None, values: dict[str, float]) -> bool:
    """Record one evaluation in the early-stopping tracker; True when patience ran out."""
    if stopper is None:
        return False
    stopper.update(values[stopper.metric])
    return stopper.out_of_patience


@dataclass
class EpochResult:
    """What one epoch (or the part of it trained before training ended) produced."""

    epoch: int  # 1-based
    train: IntervalRecord
    position: Position  # where training stands after this epoch (or partial epoch)
    eval: dict[str, float] | None = None
    eval_seconds: float | None = None
    finished: str | None = None  # why training ends here: max_updates, max_time, early_stopping

    @property
    def partial(self) -> bool:
        return self.position.batch > 0


class FitHooks(Protocol):
    """Callbacks of the fit loop."""

    def on_epoch_start(self, epoch: int, num_batches: int | None) -> None:
        """Called before the first batch of ``epoch`` (1-based)."""

    def on_batch_end(self, epoch: int, batch: int) -> None:
        """Called after every batch (``batch`` batches of ``epoch`` done)."""

    def on_interval(self, record: IntervalRecord) -> None:
        """Called every ``log_interval`` batches with the interval's statistics."""

    def on_eval(self, epoch: int, batch: int, values: dict[str, float], seconds: float) -> None:
        """Called after an evaluation inside an epoch (``fit.eval_interval``)."""

    def on_epoch_end(self, result: EpochResult) -> None:
        """Called after the epoch (or the last, partial one) and its evaluation."""

    def on_stop(self, position: Position) -> None:
        """Called when a stop was requested, after the current batch; save a checkpoint."""


class WorkerAgreement(Protocol):
    """Collective decisions of distributed workers (every worker calls these in step)."""

    def epoch_batches(self, epoch: int, train_iter: Any, limit: int | None) -> int | None:
        """The batch limit of this epoch: the smallest count of any worker (and ``limit``)."""

    def at_interval(self, seconds: float) -> str | None:
        """At a log interval: ``max_time`` when training must end here (stops latch)."""

    def at_epoch_end(self, seconds: float) -> str | None:
        """After an epoch's batches: ``max_time`` when training must end (stops latch)."""


class NoHooks:
    """Fit-loop callbacks that do nothing."""

    def on_epoch_start(self, epoch: int, num_batches: int | None) -> None:
        pass

    def on_batch_end(self, epoch: int, batch: int) -> None:
        pass

    def on_interval(self, record: IntervalRecord) -> None:
        pass

    def on_eval(self, epoch: int, batch: int, values: dict[str, float], seconds: float) -> None:
        pass

    def on_epoch_end(self, result: EpochResult) -> None:
        pass

    def on_stop(self, position: Position) -> None:
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
    # the evaluations' metrics (None: metric_factory's)
    eval_metric_factory: Callable[[], MetricSet] | None = None
    resume_from: Position | None = None  # continue inside an epoch (mid-epoch checkpoint)
    should_stop: Callable[[], bool] = field(default=lambda: False)  # polled after each batch
    # polled where should_stop is: true ends training early as finished "callback" (a
    # callback asked; None on distributed runs, whose coordinator agrees on it instead)
    finish_requested: Callable[[], bool] | None = None
    eval_interval: int | None = None  # also evaluate every N batches
    max_updates: int | None = None
    max_time: float | None = None
    early_stopping: MetricTracker | None = None
    # lr_scheduler.type plateau: counts the decays from the evaluations; the module's
    # optimizer's schedule takes the count (None: no plateau schedule)
    plateau: PlateauWatch | None = None
    # Update every K batches with gradients summed over them (module bound with grad_req
    # 'add'). Stops, checkpoints and evaluations only happen between two updates.
    grad_accumulation: int = 1
    # fit.profile / fit.monitor (engine.monitoring): None costs nothing per batch
    profiler: BatchProfiler | None = None
    monitor: ParameterMonitor | None = None
    # Distributed workers (mxtrain.distributed.Coordinator): agreed batch counts per epoch
    # and agreed stops, consulted at epoch starts/ends and log intervals only. None (one
    # process) costs nothing; with one, should_stop/max_time must be left to it.
    coordinator: WorkerAgreement | None = None
    # A module that evaluates with another graph than training's (the full softmax of a model
    # trained with a sampled one), bound on the training module's parameter arrays. None: the
    # training module evaluates.
    eval_module: BucketingModule | None = None
    # More metrics of each evaluation, computed from the training module (e.g. a seq2seq
    # model's eval set decoded under its current parameters: mxtrain.decoding.evaluation),
    # merged into the device metrics' values before early stopping and checkpoints see them.
    # It must leave the module and the random streams as they are. None: none.
    extra_evaluation: Callable[[BucketingModule], dict[str, float]] | None = None


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
    # an evaluation between two training batches must not touch the training streams' state
    with module.separate_states():
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
    """Train ``module`` (bound, initialized, optimizer ready) for the configured epochs.

    With ``options.resume_from`` the first epoch continues where that position left off:
    the same batch order (it depends only on seed and epoch), the batches already trained
    skipped, and the metric sums, counters and early-stopping state restored. Training ends
    early (``EpochResult.finished``) on max_updates, max_time or early stopping. Raises
    PreemptedError after ``hooks.on_stop`` when ``options.should_stop()`` turns true.
    """
    hooks = hooks or NoHooks()
    metrics = options.metric_factory()
    results: list[EpochResult] = []
    resume = options.resume_from
    run = _RunCounters(resume)
    if options.early_stopping is not None and resume is not None:
        options.early_stopping.set_state(resume.early_stopping)
    if options.plateau is not None and resume is not None:
        options.plateau.set_state(resume.plateau)
        _follow_plateau(module, options.plateau)
    if options.should_stop():  # a stop request that came while the run was being set up
        start = resume or Position(options.begin_epoch, 0, {}, [0, 0, 0])
        if resume is not None:
            hooks.on_stop(start)  # the same checkpoint again: the stop message names it
        raise PreemptedError(
            "stopped on request before the first batch"
            + (
                "; the checkpoint resumed from is unchanged."
                if resume
                else "; nothing was trained yet, and a resume starts from the beginning."
            ),
            hint="Continue with `mxtrain resume RUN_FOLDER`.",
        )
    try:
        _fit_epochs(module, train_iter, options, eval_iter, hooks, metrics, run, results)
    finally:
        if options.profiler is not None:
            options.profiler.finish()  # training ended before the last profiled batch
    return results


def _fit_epochs(
    module: BucketingModule,
    train_iter: Any,
    options: FitOptions,
    eval_iter: Any,
    hooks: FitHooks,
    metrics: MetricSet,
    run: _RunCounters,
    results: list[EpochResult],
) -> None:
    resume = options.resume_from
    first_epoch = resume.epoch if resume is not None else options.begin_epoch
    for epoch_index in range(first_epoch, options.num_epoch):
        epoch = epoch_index + 1
        if hasattr(train_iter, "set_epoch"):
            train_iter.set_epoch(epoch_index)
        train_iter.reset()
        metrics.reset()
        start = resume if resume is not None and resume.epoch == epoch_index else None
        if start is not None and start.batch == 0:
            start = None  # an epoch-end checkpoint: this epoch starts from scratch
        if start is None:
            # recurrent state carried across batches starts each epoch from zeros (a resumed
            # epoch continues from the state its checkpoint restored)
            module.reset_states()
        limit = options.max_batches_per_epoch
        if options.coordinator is not None:  # before skipping: it may count the batches
            limit = options.coordinator.epoch_batches(epoch, train_iter, limit)
        if start is not None:
            for _ in range(start.batch):  # host-side only: the iterator's next() is cheap
                train_iter.next()
            metrics.set_state(start.metrics)
        num_batches = getattr(train_iter, "num_batches", None)
        if limit is not None:
            num_batches = min(num_batches, limit) if num_batches is not None else limit
        hooks.on_epoch_start(epoch, num_batches)
        rebinds = getattr(module, "rebinds", 0)
        record, position, finished = _train_epoch(
            module,
            train_iter,
            metrics,
            options,
            epoch,
            hooks,
            start,
            run,
            eval_iter,
            limit,
            num_batches,
        )
        rebound = getattr(module, "rebinds", 0) - rebinds
        if rebound:  # the price of fit.bucket_memory, where users look for it
            module.logger.info("epoch %d: %d buckets rebound (fit.bucket_memory)", epoch, rebound)
        if options.coordinator is not None:
            finished = options.coordinator.at_epoch_end(run.seconds) or finished
        result = EpochResult(epoch=epoch, train=record, position=position, finished=finished)
        if eval_iter is not None:
            result.eval, result.eval_seconds = _evaluate(module, eval_iter, options)
            if position.batch == 0:  # not the evaluation of a run stopped inside the epoch,
                # which a resumed run will not repeat
                _plateau_decays(module, options, result.eval)
            if options.plateau is not None:
                position.plateau = options.plateau.get_state()
            stopper = options.early_stopping
            if result.finished is None and _patience_ran_out(stopper, result.eval):
                result.finished = "early_stopping"
            if stopper is not None:
                position.early_stopping = stopper.get_state()
        if result.finished is None and options.finish_requested and options.finish_requested():
            result.finished = "callback"  # asked during the epoch's last batch
        hooks.on_epoch_end(result)
        if result.finished is None and options.finish_requested and options.finish_requested():
            # asked at the epoch's end (on_epoch_end): the hooks saved its checkpoint
            result.finished = "callback"
        results.append(result)
        if result.finished is not None:
            break
        if epoch < options.num_epoch and options.should_stop():
            hooks.on_stop(position)  # the start of the next epoch
            raise PreemptedError(
                f"stopped on request after epoch {epoch}; its checkpoint was saved.",
                hint="Continue with `mxtrain resume RUN_FOLDER`.",
            )


def _evaluate(
    module: BucketingModule, eval_iter: Any, options: FitOptions
) -> tuple[dict[str, float], float]:
    """The evaluation's values: of one iterator by metric name, or of several named ones
    (a dict) as ``set.metric``, the extra (decoding) metrics belonging to the first set."""
    # the training batches still queued finish first: their backward and update must not
    # share the devices' buffers with an inference forward (on a loaded machine they did, and
    # training's numbers depended on timing)
    mx.nd.waitall()
    started = time.perf_counter()
    sets = eval_iter if isinstance(eval_iter, dict) else {"": eval_iter}
    values: dict[str, float] = {}
    for name, iterator in sets.items():
        metrics = (options.eval_metric_factory or options.metric_factory)()
        if metrics.metrics:  # eval_metrics may list only metrics of decoded output
            scored = score(
                module if options.eval_module is None else options.eval_module,
                iterator,
                metrics,
                max_batches=options.eval_max_batches,
                prefetch=options.prefetch,
            )
            values.update({f"{name}.{k}" if name else k: v for k, v in scored.items()})
    if options.extra_evaluation is not None:
        first = next(iter(sets))
        extra = options.extra_evaluation(module)
        values.update({f"{first}.{k}" if first else k: v for k, v in extra.items()})
    return values, time.perf_counter() - started


class _RunCounters:
    """Updates and training seconds since the run began, across resumes."""

    def __init__(self, resume: Position | None) -> None:
        self.updates = resume.updates if resume is not None else 0
        self.batches_here = 0  # batches trained by this process (resumes start again at 0)
        self._seconds_before = resume.seconds if resume is not None else 0.0
        self._started = time.perf_counter()

    @property
    def seconds(self) -> float:
        return self._seconds_before + time.perf_counter() - self._started

    def limit_reached(self, options: FitOptions) -> str | None:
        if options.max_updates is not None and self.updates >= options.max_updates:
            return "max_updates"
        if options.max_time is not None and self.seconds >= options.max_time:
            return "max_time"
        return None


@dataclass
class EpochProgress:
    """Where one epoch's training stands: batches done, the counts of the whole epoch and of
    the current log interval, the time it has trained and, once known, why it ends early."""

    epoch: int  # 1-based
    batch: int  # batches done in this epoch
    totals: list[int]  # [samples, tokens, batches] of the whole epoch
    seconds_before: float  # trained in this epoch before it was resumed
    started: float = field(default_factory=time.perf_counter)
    interval_started: float = field(default_factory=time.perf_counter)
    window: list[int] = field(default_factory=lambda: [0, 0, 0])  # since the last interval
    has_tokens: bool = True
    pending: int = 0  # batches whose gradients are summed but not yet applied
    finished: str | None = None  # max_updates, max_time, early_stopping, or a peer's stop

    @classmethod
    def starting(cls, epoch: int, start: Position | None) -> EpochProgress:
        """A fresh epoch, or the rest of one resumed from ``start``. Its record's rates are
        whole-epoch counts over the seconds that trained them: those before an interruption
        come back from the checkpoint (time stopped is not counted); a checkpoint without
        them leaves the counts of this part only."""
        if start is None:
            return cls(epoch, 0, [0, 0, 0], 0.0)
        if start.epoch_seconds is None:
            return cls(epoch, start.batch, [0, 0, 0], 0.0)
        return cls(epoch, start.batch, list(start.totals), start.epoch_seconds)

    def count(self, batch: Any) -> None:
        """One more batch trained."""
        samples, tokens = _count(batch)
        self.has_tokens = self.has_tokens and tokens is not None
        for acc in (self.totals, self.window):
            acc[0] += samples
            acc[1] += tokens or 0
            acc[2] += 1
        self.batch += 1

    def seconds(self) -> float:
        return self.seconds_before + time.perf_counter() - self.started

    def interval_record(self, metrics: dict[str, float], lr: float | None) -> IntervalRecord:
        """The log interval that ends here; the next one starts counting."""
        window = self.window
        record = IntervalRecord(
            epoch=self.epoch,
            batch=self.batch,
            batches=window[2],
            samples=window[0],
            tokens=window[1] if self.has_tokens else None,
            seconds=time.perf_counter() - self.interval_started,
            metrics=metrics,
            lr=lr,
        )
        self.window = [0, 0, 0]
        return record

    def epoch_record(self, metrics: dict[str, float], lr: float | None) -> IntervalRecord:
        totals = self.totals
        return IntervalRecord(
            epoch=self.epoch,
            batch=self.batch,
            batches=totals[2],
            samples=totals[0],
            tokens=totals[1] if self.has_tokens else None,
            seconds=self.seconds(),
            metrics=metrics,
            lr=lr,
        )

    def position(
        self, run: _RunCounters, options: FitOptions, epoch_state: dict[str, Any]
    ) -> Position:
        """Where training stands now, for a mid-epoch checkpoint."""
        stopper = options.early_stopping
        return Position(
            self.epoch - 1,
            self.batch,
            epoch_state,
            list(self.totals),
            run.updates,
            run.seconds,
            stopper.get_state() if stopper is not None else None,
            self.seconds(),
            options.plateau.get_state() if options.plateau is not None else None,
        )


#: how many trained batches Python may have queued beyond the one the devices are computing
MAX_BATCHES_AHEAD = 2


class BatchesInFlight:
    """Bounds how far the training loop runs ahead of the devices.

    MXNet queues work and returns at once, and mxtrain's metrics stay on the device, so
    without a bound the loop would queue batches up to the next log interval: a SIGTERM then
    waits for all of them before the checkpoint (105 s for 2 x 650 LSTM batches on 2 cores,
    measured). ``add`` takes each batch's progress marker (``progress_marker()``) and waits
    for the oldest one once more than ``limit`` are pending, which leaves the devices work
    queued all along.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._markers: deque[Any] = deque()

    def add(self, marker: Any) -> None:
        """Record one more queued batch (None: nothing to wait for)."""
        if marker is None:
            return
        self._markers.append(marker)
        while len(self._markers) > self.limit:
            self._markers.popleft().wait_to_read()


def _train_epoch(
    module: BucketingModule,
    train_iter: Any,
    metrics: MetricSet,
    options: FitOptions,
    epoch: int,
    hooks: FitHooks,
    start: Position | None,
    run: _RunCounters,
    eval_iter: Any,
    limit: int | None,
    num_batches: int | None,
) -> tuple[IntervalRecord, Position, str | None]:
    """One epoch of ``num_batches`` batches (None: unknown), at most ``limit``."""
    batches, release = _batches(train_iter, options.prefetch)
    progress = EpochProgress.starting(epoch, start)
    work = _EpochWork(module, metrics, options, run, hooks, eval_iter, num_batches)

    def next_batch(done: int) -> Any:
        return next(batches, None) if limit is None or done < limit else None

    try:
        batch = next_batch(progress.batch)
        if batch is not None:
            module.prepare(batch)
            if options.grad_accumulation > 1:
                module.zero_grads()
        in_flight = BatchesInFlight(MAX_BATCHES_AHEAD)
        while batch is not None:
            _train_batch(work, batch, progress)
            in_flight.add(module.progress_marker())
            upcoming = next_batch(progress.batch + 1)  # (this batch is not counted yet)
            if upcoming is not None:
                module.prepare(upcoming)  # bind its bucket while this batch computes
            module.update_metric(metrics, batch.label)
            progress.count(batch)
            run.batches_here += 1
            hooks.on_batch_end(epoch, progress.batch)
            if options.profiler is not None:
                options.profiler.after_batch(run.batches_here)
            batch = upcoming
            crash_point("train.batch", epoch=epoch, batch=progress.batch)
            if options.log_interval > 0 and progress.batch % options.log_interval == 0:
                _log_interval(work, progress, last=batch is None)
            if batch is None:
                break  # the epoch is complete: limits and evaluation are handled after it
            if progress.pending:
                continue  # between two updates of an accumulation: nothing may stop here
            if _stops_here(work, progress):
                break
    finally:
        release()
    if progress.pending:  # the epoch ended inside an accumulation: apply what was summed
        module.update()
        run.updates += 1
        module.zero_grads()
    values = metrics.get()
    _check_finite(values, epoch, progress.batch)
    record = progress.epoch_record(values, _current_lr(module))
    if progress.finished is not None:  # stopped inside the epoch: continue from here later
        return record, progress.position(run, options, metrics.get_state()), progress.finished
    finished = run.limit_reached(options)
    stopper = options.early_stopping
    early = stopper.get_state() if stopper is not None else None
    plateau = options.plateau.get_state() if options.plateau is not None else None
    end = Position(epoch, 0, {}, [0, 0, 0], run.updates, run.seconds, early, 0.0, plateau)
    return record, end, finished


@dataclass
class _EpochWork:
    """What one epoch's steps work with (the epoch's progress aside)."""

    module: BucketingModule
    metrics: MetricSet
    options: FitOptions
    run: _RunCounters
    hooks: FitHooks
    eval_iter: Any
    epoch_batches: int | None = None  # batches this epoch will train, when known


def _train_batch(work: _EpochWork, batch: Any, progress: EpochProgress) -> None:
    """Forward, backward and (every ``grad_accumulation`` batches) the update of one batch."""
    module, options, run = work.module, work.options, work.run
    if options.profiler is not None:
        options.profiler.before_batch(run.batches_here)
    mx.random.seed(batch_seed(options.seed, progress.epoch - 1, progress.batch))
    set_position = getattr(
        getattr(module.optimizer, "lr_scheduler", None), "set_training_position", None
    )
    if set_position is not None:  # lr_scheduler.unit: epochs
        set_position(progress.epoch - 1, progress.batch, work.epoch_batches)
    module.forward_backward(batch)
    if options.monitor is not None and options.monitor.due(run.batches_here):
        # gradients before the update
        options.monitor.record(module, progress.epoch, progress.batch + 1)
    progress.pending += 1
    if progress.pending == options.grad_accumulation:
        module.update()
        run.updates += 1
        progress.pending = 0
        if options.grad_accumulation > 1:
            module.zero_grads()


def _log_interval(work: _EpochWork, progress: EpochProgress, *, last: bool) -> None:
    """Report the log interval that ends at this batch (the one sync point per interval)."""
    module, metrics, options, hooks = work.module, work.metrics, work.options, work.hooks
    values = metrics.get_interval()
    take_norm = getattr(module, "take_grad_norm", None)
    norm = take_norm() if callable(take_norm) else None
    if norm is not None:  # optimizer.clip_global_norm: the mean norm before clipping
        values = {**values, "grad_norm": norm}
    _check_finite(values, progress.epoch, progress.batch)
    hooks.on_interval(progress.interval_record(values, _current_lr(module)))
    metrics.reset_interval()
    if options.coordinator is not None and not last:
        # (all workers end the epoch at the same batch: the epoch end decides)
        progress.finished = options.coordinator.at_interval(work.run.seconds) or progress.finished
    progress.interval_started = time.perf_counter()


def _stops_here(work: _EpochWork, progress: EpochProgress) -> bool:
    """Evaluate if due, then whether training ends after this batch (a limit, early
    stopping, a peer's stop); a stop request saves a checkpoint and raises PreemptedError."""
    options, batch = work.options, progress.batch
    due = options.eval_interval and batch % options.eval_interval == 0
    if work.eval_iter is not None and due:
        values, seconds = _evaluate(work.module, work.eval_iter, options)
        _plateau_decays(work.module, options, values)
        work.hooks.on_eval(progress.epoch, batch, values, seconds)
        if _patience_ran_out(options.early_stopping, values):
            progress.finished = "early_stopping"
    progress.finished = progress.finished or work.run.limit_reached(options)
    if progress.finished is None and options.finish_requested and options.finish_requested():
        progress.finished = "callback"
    if progress.finished is not None:
        return True
    if options.should_stop():
        work.hooks.on_stop(progress.position(work.run, options, work.metrics.get_state()))
        raise PreemptedError(
            f"stopped on request in epoch {progress.epoch} after batch {batch}; a "
            "checkpoint of this exact point was saved.",
            hint="Continue with `mxtrain resume RUN_FOLDER`.",
        )
    return False
