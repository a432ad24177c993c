"""A run's hooks: one ordered list of :class:`RunHook` members, which the fit loop calls as one.

Built-in members, one job each: :class:`ReporterHook` feeds the terminal and ``--json``
events, :class:`MetricsLogHook` writes ``metrics.jsonl``, :class:`TensorBoardHook` the event
files, :class:`CheckpointHook` saves checkpoints and tracks the best one,
:class:`EpochRecords` keeps the epoch records for the run's summary. The user callbacks of
``fit.callbacks`` (:class:`mxtrain.fit.callbacks.CallbackRunner`) and the extra hooks a
library caller passes to ``fit_experiment(..., hooks=[...])`` are members like them.

:class:`RunHooks` is what the loop calls (``engine.loop.FitHooks``). It passes every event to
the members in list order; an epoch's end is three events in turn (:meth:`RunHook.on_epoch_end`,
:meth:`RunHook.on_epoch_record`, :meth:`RunHook.on_epoch_done`), and the list puts the
metrics log before the checkpoints: the epoch record is written before its checkpoint, so a
kill between the two never loses or repeats an epoch record.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from mxtrain.config.schema import CheckpointSection, FitSection
from mxtrain.metric_tracker import MetricTracker
from mxtrain.reporting import Reporter
from mxtrain.run import checkpoint
from mxtrain.run.checkpoint import Checkpoint
from mxtrain.run.folder import MetricsLog, RunFolder
from mxtrain.run.layout import checkpoint_tag

if TYPE_CHECKING:  # annotations only: MXNet must load after the run's thread settings
    from mxtrain.engine.bucketing import BucketingModule
    from mxtrain.engine.loop import EpochResult, IntervalRecord, Position
    from mxtrain.tensorboard import ScalarLog

log = logging.getLogger("mxtrain")

#: why training ended before fit.num_epoch, as the end-of-run line says it
STOP_REASONS = {
    "max_updates": "fit.max_updates ({max_updates}) reached",
    "max_time": "fit.max_time ({max_time}s) reached",
    "early_stopping": "no improvement for fit.early_stopping.patience evaluations",
    "callback": "a callback asked to stop (fit.callbacks; the log says which and why)",
}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


@dataclass
class EpochEnd:
    """One epoch's end as it passes through the hooks: its result, its ``metrics.jsonl``
    record (the checkpoint hook adds the planned checkpoint to it), and the checkpoint saved
    (None: none)."""

    result: EpochResult
    entry: dict[str, Any]
    planned: str | None = None  # the tag of the checkpoint this epoch's end saves
    best: bool = False  # a new best value of checkpoint.best_metric
    saved: Checkpoint | None = None

    @property
    def saved_tag(self) -> str | None:
        return self.saved.tag if self.saved is not None else None


class RunHook:
    """A member of a run's hooks; every event does nothing until a member overrides it."""

    def on_epoch_start(self, epoch: int, num_batches: int | None) -> None:
        """Before the first batch of ``epoch`` (1-based)."""

    def on_batch_end(self, epoch: int, batch: int) -> None:
        """After every batch (``batch`` batches of ``epoch`` done)."""

    def on_interval(self, record: IntervalRecord) -> None:
        """Every ``fit.log_interval`` batches, with the interval's statistics."""

    def on_eval(self, epoch: int, batch: int, values: dict[str, float], seconds: float) -> None:
        """After an evaluation inside an epoch (``fit.eval_interval``)."""

    def on_epoch_end(self, end: EpochEnd) -> None:
        """After the epoch and its evaluation, before its record is written."""

    def on_epoch_record(self, end: EpochEnd) -> None:
        """The epoch's record is complete (``end.entry``): write it, save its checkpoint."""

    def on_epoch_done(self, end: EpochEnd) -> None:
        """After the epoch's record and checkpoint (``end.saved``)."""

    def on_checkpoint(self, saved: Checkpoint, position: Position) -> None:
        """After a checkpoint saved outside an epoch's record: on a stop or finish request."""

    def finish_requested(self) -> bool:
        """True to end training at the next point where it may stop (a callback's request)."""
        return False

    def close(self) -> None:
        """After training, whatever happened."""


class ReporterHook(RunHook):
    """Progress, evaluations, epoch summaries and early stops on the terminal."""

    def __init__(self, reporter: Reporter, fit_cfg: FitSection) -> None:
        self.reporter = reporter
        self.fit_cfg = fit_cfg

    def on_epoch_start(self, epoch: int, num_batches: int | None) -> None:
        self.reporter.start_epoch(epoch, num_batches)

    def on_interval(self, record: IntervalRecord) -> None:
        self.reporter.interval(
            record.epoch,
            record.batch,
            record.samples_per_s,
            record.tokens_per_s,
            record.metrics,
            lr=record.lr,
            seconds=record.seconds,
            batches=record.batches,
        )

    def on_eval(self, epoch: int, batch: int, values: dict[str, float], seconds: float) -> None:
        self.reporter.evaluation(epoch, batch, values, seconds)

    def on_epoch_end(self, end: EpochEnd) -> None:
        self.reporter.end_epoch()
        result = end.result
        if result.eval is not None:
            self.reporter.evaluation(
                result.epoch, result.train.batch, result.eval, cast(float, result.eval_seconds),
                at_epoch_end=True,
            )  # fmt: skip

    def on_epoch_done(self, end: EpochEnd) -> None:
        result, train = end.result, end.result.train
        self.reporter.epoch_summary(
            result.epoch, seconds=train.seconds, samples_per_s=train.samples_per_s,
            tokens_per_s=train.tokens_per_s, train=train.metrics, eval=result.eval,
            lr=train.lr, checkpoint=end.saved_tag, partial=result.partial,
        )  # fmt: skip
        if result.finished is not None:
            message = result.finished
            if result.finished in STOP_REASONS:
                message = STOP_REASONS[result.finished].format(
                    max_updates=self.fit_cfg.max_updates, max_time=self.fit_cfg.max_time
                )
            self.reporter.early_stop(result.epoch, result.finished, message)

    def close(self) -> None:
        self.reporter.end_epoch()


def epoch_record(result: EpochResult) -> dict[str, Any]:
    """An epoch's ``metrics.jsonl`` record, before the checkpoint fields are added."""
    train = result.train
    entry: dict[str, Any] = {
        "event": "epoch",
        "epoch": result.epoch,
        "batch": train.batch,
        "samples": train.samples,
        "tokens": train.tokens,
        "seconds": round(train.seconds, 3),
        "samples_per_s": round(train.samples_per_s, 2),
        "tokens_per_s": _round(train.tokens_per_s),
        "train": train.metrics,
        "eval": result.eval,
        "eval_seconds": _round(result.eval_seconds),
        "lr": train.lr,
    }
    if result.partial:
        entry["partial"] = True
    if result.finished:
        entry["finished"] = result.finished
    return entry


class MetricsLogHook(RunHook):
    """One ``metrics.jsonl`` record per log interval, evaluation and epoch."""

    def __init__(self, run: RunFolder) -> None:
        self.log = MetricsLog(run.metrics_file)

    def on_interval(self, record: IntervalRecord) -> None:
        self.log.write(
            {
                "event": "interval",
                "epoch": record.epoch,
                "batch": record.batch,
                "samples_per_s": round(record.samples_per_s, 2),
                "tokens_per_s": _round(record.tokens_per_s),
                "train": record.metrics,
                "lr": record.lr,
            }
        )

    def on_eval(self, epoch: int, batch: int, values: dict[str, float], seconds: float) -> None:
        self.log.write(
            {
                "event": "eval",
                "epoch": epoch,
                "batch": batch,
                "eval": values,
                "eval_seconds": round(seconds, 3),
            }
        )

    def on_epoch_record(self, end: EpochEnd) -> None:
        self.log.write(end.entry)

    def close(self) -> None:
        self.log.close()


class TensorBoardHook(RunHook):
    """Train, speed and eval scalars for TensorBoard, against the optimizer's update count."""

    def __init__(self, scalar_log: ScalarLog, module: BucketingModule) -> None:
        self.scalars = scalar_log
        self.module = module

    def _step(self) -> int:
        """TensorBoard's x axis: the optimizer's update count (restored on resume)."""
        return int(getattr(self.module.optimizer, "num_update", 0) or 0)

    def on_interval(self, record: IntervalRecord) -> None:
        step = self._step()
        self.scalars.scalars("train", {**record.metrics, "lr": record.lr}, step)
        speed = {"samples_per_s": record.samples_per_s, "tokens_per_s": record.tokens_per_s}
        self.scalars.scalars("speed", speed, step)

    def on_eval(self, epoch: int, batch: int, values: dict[str, float], seconds: float) -> None:
        self.scalars.scalars("eval", values, self._step())

    def on_epoch_end(self, end: EpochEnd) -> None:
        step = self._step()
        self.scalars.scalars("epoch_train", end.result.train.metrics, step)
        if end.result.eval is not None:
            self.scalars.scalars("eval", end.result.eval, step)

    def close(self) -> None:
        self.scalars.close()


class CheckpointHook(RunHook):
    """Checkpoints (every ``checkpoint.period`` epochs, at a new best, at the end and on a
    stop request) and the best one so far, which every checkpoint's state carries."""

    def __init__(
        self,
        ckpt_cfg: CheckpointSection,
        fit_cfg: FitSection,
        seed: int,
        module: BucketingModule,
        run: RunFolder,
        reporter: Reporter,
        *,
        bucket_keys: Sequence[Any] | None,
        last_batch: str | None = None,
        saves: bool,
        best_lower_is_better: bool,
        resume_state: dict[str, Any] | None,
    ) -> None:
        self.ckpt_cfg = ckpt_cfg
        self.num_epoch = fit_cfg.num_epoch
        self.seed = seed
        self.module = module
        self.run = run
        self.reporter = reporter
        self.bucket_keys = bucket_keys
        self.last_batch = last_batch  # the train iterator's rule: resume keeps it
        self.saves = saves  # distributed: rank 0 alone writes checkpoints
        self.best: dict[str, Any] | None = (resume_state or {}).get("best")
        metric = ckpt_cfg.best_metric
        self.tracker = MetricTracker(metric, best_lower_is_better) if metric else None
        if self.tracker is not None and self.best is not None:
            self.tracker.best = self.best["value"]

    def save(self, position: Position, *, best: bool = False) -> Checkpoint:
        state: dict[str, Any] = {
            "position": position.to_json(),
            "best": self.best,
            "seed": self.seed,
        }
        if self.last_batch is not None:
            state["last_batch"] = self.last_batch
        prefix = self.ckpt_cfg.prefix
        saved = checkpoint.save_checkpoint(
            self.run, self.module, prefix=prefix, epoch=position.epoch, batch=position.batch,
            state=state, bucket_keys=self.bucket_keys,
        )  # fmt: skip
        checkpoint.settle_checkpoints(
            self.run, prefix=prefix, keep_last=self.ckpt_cfg.keep_last, best=self.best
        )
        self.reporter.checkpoint(
            saved.tag, epoch=position.epoch, batch=position.batch, path=saved.path, best=best
        )
        return saved

    def on_epoch_end(self, end: EpochEnd) -> None:
        """Plan the epoch's checkpoint: whether it is a new best and saves one (which tag)."""
        result, tracker = end.result, self.tracker
        if tracker is not None and result.eval and tracker.metric in result.eval:
            value = result.eval[tracker.metric]
            if tracker.update(value, result.epoch):
                end.best = True
                self.best = {"metric": tracker.metric, "value": value, "epoch": result.epoch,
                             "tag": None}  # fmt: skip
        last = result.epoch == self.num_epoch or result.finished is not None
        periodic = result.epoch % self.ckpt_cfg.period == 0
        if not self.saves or not (end.best or last or periodic):
            return
        end.planned = checkpoint_tag(result.position.epoch, result.position.batch)
        if end.best and self.best is not None:
            self.best["tag"] = end.planned
        end.entry["checkpoint"] = end.planned
        if end.best:
            end.entry["best"] = True

    def on_epoch_record(self, end: EpochEnd) -> None:
        if end.planned is not None:
            end.saved = self.save(end.result.position, best=end.best)

    def save_on_stop(self, position: Position) -> Checkpoint | None:
        """Save the checkpoint a stop request needs; returns it (None: this rank saves
        nothing)."""
        if not self.saves:
            return None
        saved = self.save(position)
        log.warning(
            "stop requested: saved checkpoint %s; resume with `mxtrain resume %s`",
            saved.tag,
            self.run.path,
        )
        return saved


@dataclass
class EpochRecords(RunHook):
    """Every epoch record, for the run's summary."""

    epochs: list[dict[str, Any]] = field(default_factory=list)

    def on_epoch_record(self, end: EpochEnd) -> None:
        self.epochs.append(end.entry)


class RunHooks:
    """What the fit loop calls: each event passed to every member in list order.

    ``checkpoints`` is a member too; it is named because a stop request and a finish request
    at an epoch's end each need a checkpoint of their own.
    """

    def __init__(self, members: Sequence[RunHook], checkpoints: CheckpointHook) -> None:
        self.members = list(members)
        self.checkpoints = checkpoints

    def on_epoch_start(self, epoch: int, num_batches: int | None) -> None:
        for hook in self.members:
            hook.on_epoch_start(epoch, num_batches)

    def on_batch_end(self, epoch: int, batch: int) -> None:
        for hook in self.members:
            hook.on_batch_end(epoch, batch)

    def on_interval(self, record: IntervalRecord) -> None:
        for hook in self.members:
            hook.on_interval(record)

    def on_eval(self, epoch: int, batch: int, values: dict[str, float], seconds: float) -> None:
        for hook in self.members:
            hook.on_eval(epoch, batch, values, seconds)

    def on_epoch_end(self, result: EpochResult) -> None:
        end = EpochEnd(result, epoch_record(result))
        for hook in self.members:
            hook.on_epoch_end(end)
        for hook in self.members:
            hook.on_epoch_record(end)
        for hook in self.members:
            hook.on_epoch_done(end)
        if end.saved is None and self.checkpoints.saves and self.finish_requested():
            # a stop asked for at the epoch's end: the run ends here, so it needs this
            # epoch's checkpoint even when checkpoint.period skipped it
            self._saved(self.checkpoints.save(result.position), result.position)

    def on_stop(self, position: Position) -> None:
        saved = self.checkpoints.save_on_stop(position)
        if saved is not None:
            self._saved(saved, position)

    def _saved(self, saved: Checkpoint, position: Position) -> None:
        for hook in self.members:
            hook.on_checkpoint(saved, position)

    def finish_requested(self) -> bool:
        """Whether a member asked training to end (the loop's ``finish_requested``)."""
        return any(hook.finish_requested() for hook in self.members)

    def close(self) -> None:
        for hook in self.members:
            hook.close()
