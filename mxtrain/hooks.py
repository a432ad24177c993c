"""The fit loop's hooks: one job each, and the run's composition of them.

:class:`ReporterHook` feeds the terminal and ``--json`` events, :class:`MetricsLogHook`
writes ``metrics.jsonl``, :class:`TensorBoardHook` the event files, :class:`CheckpointHook`
saves checkpoints and tracks the best one. :class:`RunHooks` is what the loop calls
(``on_epoch_start``, ``on_interval``, ``on_eval``, ``on_epoch_end``, ``on_stop``); it fixes
the order, which matters at an epoch's end: the epoch record is written before its
checkpoint, so a kill between the two never loses or repeats an epoch record.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from mxtrain.metric_tracker import MetricTracker
from mxtrain.reporting import Reporter
from mxtrain.run import checkpoint
from mxtrain.run.folder import MetricsLog
from mxtrain.run.layout import RunFolder, checkpoint_tag

log = logging.getLogger("mxtrain")

#: why training ended before fit.num_epoch, as the end-of-run line says it
_STOP_REASONS = {
    "max_updates": "fit.max_updates ({max_updates}) reached",
    "max_time": "fit.max_time ({max_time}s) reached",
    "early_stopping": "no improvement for fit.early_stopping.patience evaluations",
    "callback": "a callback asked to stop (fit.callbacks; the log says which and why)",
}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


class ReporterHook:
    """Progress, evaluations, epoch summaries and early stops on the terminal."""

    def __init__(self, reporter: Reporter, fit_cfg: Any) -> None:
        self.reporter = reporter
        self.fit_cfg = fit_cfg

    def on_epoch_start(self, epoch: int, num_batches: int | None) -> None:
        self.reporter.start_epoch(epoch, num_batches)

    def on_interval(self, record: Any) -> None:
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

    def epoch_ended(self) -> None:
        self.reporter.end_epoch()

    def epoch_evaluated(self, result: Any) -> None:
        if result.eval is not None:
            self.reporter.evaluation(
                result.epoch,
                result.train.batch,
                result.eval,
                result.eval_seconds,
                at_epoch_end=True,
            )

    def epoch_done(self, result: Any, checkpoint_tag: str | None) -> None:
        train = result.train
        self.reporter.epoch_summary(
            result.epoch,
            seconds=train.seconds,
            samples_per_s=train.samples_per_s,
            tokens_per_s=train.tokens_per_s,
            train=train.metrics,
            eval=result.eval,
            lr=train.lr,
            checkpoint=checkpoint_tag,
            partial=result.partial,
        )
        if result.finished is not None:
            message = result.finished
            if result.finished in _STOP_REASONS:
                message = _STOP_REASONS[result.finished].format(
                    max_updates=self.fit_cfg.max_updates, max_time=self.fit_cfg.max_time
                )
            self.reporter.early_stop(result.epoch, result.finished, message)


class MetricsLogHook:
    """One ``metrics.jsonl`` record per log interval, evaluation and epoch."""

    def __init__(self) -> None:
        self.log: MetricsLog | None = None  # opened by the caller around the loop

    def _write(self, record: dict[str, Any]) -> None:
        assert self.log is not None
        self.log.write(record)

    def on_interval(self, record: Any) -> None:
        self._write(
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
        self._write(
            {
                "event": "eval",
                "epoch": epoch,
                "batch": batch,
                "eval": values,
                "eval_seconds": round(seconds, 3),
            }
        )

    def epoch_record(self, result: Any) -> dict[str, Any]:
        """The epoch's record, before the checkpoint fields are added."""
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

    def write_epoch(self, entry: dict[str, Any]) -> None:
        self._write(entry)


class TensorBoardHook:
    """Train, speed and eval scalars for TensorBoard, against the optimizer's update count."""

    def __init__(self, scalar_log: Any, module: Any) -> None:
        self.scalars = scalar_log  # a tensorboard.ScalarLog
        self.module = module

    def _step(self) -> int:
        """TensorBoard's x axis: the optimizer's update count (restored on resume)."""
        return int(getattr(self.module.optimizer, "num_update", 0) or 0)

    def on_interval(self, record: Any) -> None:
        step = self._step()
        self.scalars.scalars("train", {**record.metrics, "lr": record.lr}, step)
        speed = {"samples_per_s": record.samples_per_s, "tokens_per_s": record.tokens_per_s}
        self.scalars.scalars("speed", speed, step)

    def on_eval(self, epoch: int, batch: int, values: dict[str, float], seconds: float) -> None:
        self.scalars.scalars("eval", values, self._step())

    def epoch_done(self, result: Any) -> None:
        step = self._step()
        self.scalars.scalars("epoch_train", result.train.metrics, step)
        if result.eval is not None:
            self.scalars.scalars("eval", result.eval, step)

    def close(self) -> None:
        self.scalars.close()


@dataclass
class EpochCheckpoint:
    """What an epoch's end saves: the tag (None: nothing) and whether it is the best."""

    tag: str | None
    best: bool


class CheckpointHook:
    """Checkpoints (every ``checkpoint.period`` epochs, at a new best, at the end and on a
    stop request) and the best one so far, which every checkpoint's state carries."""

    def __init__(
        self,
        config: Any,
        module: Any,
        run: RunFolder,
        reporter: Reporter,
        *,
        bucket_keys: Any,
        last_batch: str | None = None,
        saves: bool,
        best_lower_is_better: bool,
        resume_state: dict[str, Any] | None,
    ) -> None:
        self.config = config
        self.module = module
        self.run = run
        self.reporter = reporter
        self.bucket_keys = bucket_keys
        self.last_batch = last_batch  # the train iterator's rule: resume keeps it
        self.saves = saves  # distributed: rank 0 alone writes checkpoints
        self.best: dict[str, Any] | None = (resume_state or {}).get("best")
        metric = config.checkpoint.best_metric
        self.tracker = MetricTracker(metric, best_lower_is_better) if metric else None
        if self.tracker is not None and self.best is not None:
            self.tracker.best = self.best["value"]

    def save(self, position: Any, *, best: bool = False) -> Any:
        ckpt_cfg = self.config.checkpoint
        state = {
            "position": position.to_json(),
            "best": self.best,
            "seed": self.config.experiment.seed,
        }
        if self.last_batch is not None:
            state["last_batch"] = self.last_batch
        saved = checkpoint.save_checkpoint(
            self.run,
            self.module,
            prefix=ckpt_cfg.prefix,
            epoch=position.epoch,
            batch=position.batch,
            state=state,
            bucket_keys=self.bucket_keys,
        )
        checkpoint.settle_checkpoints(
            self.run, prefix=ckpt_cfg.prefix, keep_last=ckpt_cfg.keep_last, best=self.best
        )
        self.reporter.checkpoint(
            saved.tag, epoch=position.epoch, batch=position.batch, path=saved.path, best=best
        )
        return saved

    def plan(self, result: Any) -> EpochCheckpoint:
        """Whether the epoch's end is a new best and saves a checkpoint (and which tag)."""
        new_best = False
        tracker = self.tracker
        if tracker is not None and result.eval and tracker.metric in result.eval:
            value = result.eval[tracker.metric]
            if tracker.update(value, result.epoch):
                new_best = True
                self.best = {
                    "metric": tracker.metric,
                    "value": value,
                    "epoch": result.epoch,
                    "tag": None,
                }
        last = result.epoch == self.config.fit.num_epoch or result.finished is not None
        period = self.config.checkpoint.period
        if not self.saves or not (new_best or last or result.epoch % period == 0):
            return EpochCheckpoint(None, new_best)
        tag = checkpoint_tag(result.position.epoch, result.position.batch)
        if new_best and self.best is not None:
            self.best["tag"] = tag
        return EpochCheckpoint(tag, new_best)

    def on_stop(self, position: Any) -> Any:
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


class RunHooks:
    """What the fit loop calls: each event passed to the hooks in the order that keeps the
    run folder consistent at any kill."""

    def __init__(
        self,
        reporter: ReporterHook,
        metrics_log: MetricsLogHook,
        checkpoints: CheckpointHook,
        tensorboard: TensorBoardHook | None,
        epochs: list[dict[str, Any]],
        callbacks: Any = None,
    ) -> None:
        self.reporter = reporter
        self.metrics_log = metrics_log
        self.checkpoints = checkpoints
        self.tensorboard = tensorboard
        self.epochs = epochs  # every epoch record, for the run's summary
        self.callbacks = callbacks  # callbacks.CallbackRunner (fit.callbacks) or None

    def on_epoch_start(self, epoch: int, num_batches: int | None) -> None:
        self.reporter.on_epoch_start(epoch, num_batches)

    def on_batch_end(self, epoch: int, batch: int) -> None:
        if self.callbacks is not None:
            self.callbacks.call("on_batch_end", epoch=epoch, batch=batch)

    def on_interval(self, record: Any) -> None:
        self.reporter.on_interval(record)
        self.metrics_log.on_interval(record)
        if self.tensorboard is not None:
            self.tensorboard.on_interval(record)
        if self.callbacks is not None:
            self.callbacks.call(
                "on_interval",
                epoch=record.epoch,
                batch=record.batch,
                metrics=record.metrics,
                lr=record.lr,
            )

    def on_eval(self, epoch: int, batch: int, values: dict[str, float], seconds: float) -> None:
        self.metrics_log.on_eval(epoch, batch, values, seconds)
        self.reporter.on_eval(epoch, batch, values, seconds)
        if self.tensorboard is not None:
            self.tensorboard.on_eval(epoch, batch, values, seconds)
        if self.callbacks is not None:
            self.callbacks.call("on_eval_end", epoch=epoch, batch=batch, eval=values)

    def _saved(self, saved: Any, position: Any) -> None:
        if self.callbacks is not None and saved is not None:
            self.callbacks.call(
                "on_checkpoint",
                epoch=position.epoch,
                batch=position.batch,
                checkpoint=saved.tag,
                checkpoint_path=str(saved.path),
            )

    def on_epoch_end(self, result: Any) -> None:
        self.reporter.epoch_ended()
        if self.tensorboard is not None:
            self.tensorboard.epoch_done(result)
        self.reporter.epoch_evaluated(result)
        entry = self.metrics_log.epoch_record(result)
        planned = self.checkpoints.plan(result)
        if planned.tag is not None:
            entry["checkpoint"] = planned.tag
            if planned.best:
                entry["best"] = True
        # The record goes out before its checkpoint: a resume from that checkpoint keeps it,
        # a resume from an older one drops it (train._truncate_metrics) and trains the epoch
        # again, so a kill between the two never loses or repeats an epoch record.
        self.metrics_log.write_epoch(entry)
        saved = None
        if planned.tag is not None:
            saved = self.checkpoints.save(result.position, best=planned.best)
        self.epochs.append(entry)
        self.reporter.epoch_done(result, saved.tag if saved is not None else None)
        if self.callbacks is not None:
            values = {"epoch": result.epoch, "batch": result.train.batch}
            if result.eval is not None:
                self.callbacks.call("on_eval_end", eval=result.eval, **values)
            self._saved(saved, result.position)
            self.callbacks.call(
                "on_epoch_end",
                metrics=result.train.metrics,
                eval=result.eval,
                lr=result.train.lr,
                checkpoint=saved.tag if saved is not None else None,
                checkpoint_path=str(saved.path) if saved is not None else None,
                **values,
            )
            if saved is None and self.checkpoints.saves and self.callbacks.finish_requested():
                # a stop asked for at the epoch's end: the run ends here, so it needs this
                # epoch's checkpoint even when checkpoint.period skipped it
                self._saved(self.checkpoints.save(result.position), result.position)

    def on_stop(self, position: Any) -> None:
        self._saved(self.checkpoints.on_stop(position), position)
