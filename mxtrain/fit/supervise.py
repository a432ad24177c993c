"""Training a set-up run to its end, keeping run.json's status true whatever happens.

New and resumed runs both end here: :func:`supervise` runs the fit loop with the run's hooks
(:mod:`mxtrain.fit.run_hooks`) and records how it ended; :func:`supervise_worker` does the
same for a distributed worker other than rank 0, which writes no run folder.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mxtrain.build import build_metric
from mxtrain.config import Config
from mxtrain.config.schema import FitSection, evaluation_metric_names, metric_of_set
from mxtrain.distributed import Watchdog
from mxtrain.errors import MxtrainError, PreemptedError
from mxtrain.fit.run_hooks import (
    CheckpointHook,
    EpochRecords,
    MetricsLogHook,
    ReporterHook,
    RunHook,
    RunHooks,
    TensorBoardHook,
)
from mxtrain.fit.setup import TrainingSetup
from mxtrain.metric_tracker import (
    MetricTracker,
    PlateauWatch,
    declared_direction,
    lower_is_better,
)
from mxtrain.reporting import Reporter
from mxtrain.run.folder import RunFolder, finish_replacement
from mxtrain.signals import StopRequests
from mxtrain.tensorboard import ScalarLog

if TYPE_CHECKING:  # annotations only: MXNet must load after the run's thread settings
    from mxtrain.engine.loop import FitOptions, MetricSet
    from mxtrain.engine.monitoring import BatchProfiler, ParameterMonitor
    from mxtrain.fit.tracking import MlflowTracker

log = logging.getLogger("mxtrain")


@dataclass
class FitSummary:
    """What a finished ``fit`` or ``resume`` returns."""

    run: RunFolder
    epochs: list[dict[str, Any]] = field(default_factory=list)
    stop_reason: str | None = None  # max_updates, max_time or early_stopping when early

    @property
    def final_eval(self) -> dict[str, float] | None:
        return self.epochs[-1].get("eval") if self.epochs else None


@dataclass
class TrainingJob:
    """A set-up run about to train: where it writes, who reports, and what it continues."""

    setup: TrainingSetup
    run: RunFolder
    reporter: Reporter
    stops: StopRequests
    resume_state: dict[str, Any] | None = None  # the checkpoint state a resume continues
    extra_hooks: Sequence[RunHook] = ()  # a library caller's, after the built-in ones

    @property
    def config(self) -> Config:
        return self.setup.config


def supervise(job: TrainingJob) -> FitSummary:
    """Train, keeping run.json's status true whatever happens (and the MLflow run's, with
    ``tracking.mlflow``)."""
    started = time.time()
    status = "failed"
    run = job.run
    tracker = start_tracking(job)
    if tracker is not None:
        job = dataclasses.replace(job, extra_hooks=[*job.extra_hooks, tracker])
    try:
        summary = train(job)
        status = "finished"
        run.write_status(stop_reason=summary.stop_reason)
        return summary
    except PreemptedError:
        status = "preempted"
        raise
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    except MxtrainError as exc:
        log.debug("stopped: %s", exc)
        raise
    finally:
        if tracker is not None:
            tracker.end(status)
        kept = finish_replacement(run, succeeded=status == "finished")
        if kept:
            log.warning(kept)
        job.reporter.close()
        run.write_status(status=status, ended=time.time(), duration_s=time.time() - started)


def start_tracking(job: TrainingJob) -> MlflowTracker | None:
    """The MLflow run of ``tracking.mlflow`` (rank 0 only), or None."""
    if job.config.tracking.mlflow is None or job.setup.rank != 0:
        return None
    from mxtrain.fit.tracking import MlflowTracker  # deferred: the optional MLflow extra
    from mxtrain.run import environment

    facts = environment.collect(contexts=job.setup.contexts, seed=job.config.experiment.seed)
    return MlflowTracker(job.config, job.run, job.setup.module, facts)


def supervise_worker(job: TrainingJob) -> FitSummary:
    """Train as a distributed worker other than rank 0: nothing is written to ``job.run``.

    The loop's bookkeeping goes to a private temporary folder (deleted at the end); this
    worker's log is its standard output, which ``mxtrain launch`` keeps per rank.
    """
    rank = job.setup.rank
    scratch = Path(tempfile.mkdtemp(prefix=f"mxtrain-rank{rank}-"))
    log.info("worker rank %d: rank 0 writes the run folder %s", rank, job.run.path)
    try:
        summary = supervise(dataclasses.replace(job, run=RunFolder(scratch)))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    summary.run = job.run
    return summary


def train(job: TrainingJob) -> FitSummary:
    """The fit loop over the job's data with the run's hooks; the epochs' records and why
    training ended early (if it did)."""
    from mxtrain.engine.loop import fit  # deferred: it imports MXNet

    setup, run, config = job.setup, job.run, job.config
    coordinator, watchdog = setup.coordinator, None
    if coordinator is not None and config.kvstore.watchdog_seconds is not None:
        watchdog = coordinator.watchdog = Watchdog(config.kvstore.watchdog_seconds)
    # the hooks are built (and metrics.jsonl opened) once the options are: `hooks` is bound
    # below, before the loop first asks
    options = fit_options(job, lambda: hooks.finish_requested())
    hooks, records, checkpoints = run_hooks(job)
    summary = FitSummary(run=run, epochs=records.epochs)
    try:
        if watchdog is not None:
            watchdog.start()
        results = fit(
            setup.module,
            setup.train_iter,
            options,
            eval_iter=setup.eval_sets or setup.eval_iter,
            hooks=hooks,
        )
    except PreemptedError as exc:
        if not checkpoints.saves:
            raise
        raise PreemptedError(
            exc.message, hint=f"Continue with `mxtrain resume {run.path}`."
        ) from None
    finally:
        if watchdog is not None:
            watchdog.stop()
        hooks.close()
    if results and results[-1].finished is not None:
        summary.stop_reason = results[-1].finished
    return summary


def run_hooks(job: TrainingJob) -> tuple[RunHooks, EpochRecords, CheckpointHook]:
    """The run's hooks in their order: reporter, metrics log, TensorBoard, checkpoints,
    epoch records, ``fit.callbacks``, then the caller's extra hooks."""
    setup, config, run = job.setup, job.config, job.run
    ckpt_cfg = config.checkpoint
    best_metric = ckpt_cfg.best_metric
    best_lower = (
        metric_lower_is_better(setup, best_metric, ckpt_cfg.best_mode) if best_metric else True
    )
    checkpoints = CheckpointHook(
        ckpt_cfg, config.fit, config.experiment.seed, setup.module, run, job.reporter,
        bucket_keys=getattr(setup.train_iter, "buckets", None),
        last_batch=getattr(setup.train_iter, "last_batch", None),
        saves=setup.rank == 0, best_lower_is_better=best_lower, resume_state=job.resume_state,
    )  # fmt: skip
    members: list[RunHook] = [ReporterHook(job.reporter, config.fit)]
    if config.logging.tensorboard and checkpoints.saves:
        members.append(TensorBoardHook(ScalarLog(run.path), setup.module))
    records = EpochRecords()
    # opened last: everything before it may still fail without a file left open
    members.insert(1, MetricsLogHook(run))
    members += [checkpoints, records]
    if setup.callbacks is not None:
        members.append(setup.callbacks)
    members += job.extra_hooks
    return RunHooks(members, checkpoints), records, checkpoints


def fit_options(job: TrainingJob, finish_requested: Callable[[], bool]) -> FitOptions:
    """How the loop runs, from ``fit:``; ``finish_requested`` says whether a hook asked to
    end. A distributed run's stop requests, time limit and hook requests act only once its
    workers agree on them."""
    from mxtrain.engine.loop import FitOptions, MetricSet, Position  # deferred: MXNet

    setup, config, run = job.setup, job.config, job.run
    fit_cfg, data_info, base_dir = config.fit, setup.train_iter.data_info, config.base_dir

    def metric_factory() -> MetricSet:
        return MetricSet([build_metric(n, data_info, base_dir) for n in fit_cfg.metrics])

    def eval_metric_factory() -> MetricSet:
        names = fit_cfg.device_evaluation_metrics  # decoding metrics are scored on decoded text
        return MetricSet([build_metric(n, data_info, base_dir) for n in names])

    early = fit_cfg.early_stopping
    stopper = None
    if early is not None:
        lower = metric_lower_is_better(setup, early.metric, early.mode)
        stopper = MetricTracker(
            early.metric, lower, min_delta=early.min_delta, patience=early.patience
        )
    state = job.resume_state
    should_stop, max_time = job.stops.requested, fit_cfg.max_time
    finish: Callable[[], bool] | None = finish_requested
    coordinator = setup.coordinator
    if coordinator is not None:
        coordinator.attach(should_stop, max_time, finish)
        should_stop, max_time, finish = coordinator.stop_agreed, None, None
    return FitOptions(
        num_epoch=fit_cfg.num_epoch, log_interval=fit_cfg.log_interval,
        prefetch=fit_cfg.prefetch, max_batches_per_epoch=fit_cfg.max_batches_per_epoch,
        eval_max_batches=fit_cfg.eval_max_batches, seed=config.experiment.seed,
        metric_factory=metric_factory, eval_metric_factory=eval_metric_factory,
        resume_from=Position.from_json(state["position"]) if state else None,
        should_stop=should_stop, finish_requested=finish, eval_interval=fit_cfg.eval_interval,
        max_updates=fit_cfg.max_updates, max_time=max_time, early_stopping=stopper,
        plateau=plateau_watch(setup),
        grad_accumulation=fit_cfg.grad_accumulation, profiler=profiler(fit_cfg, run),
        monitor=monitor(fit_cfg, run), coordinator=coordinator, eval_module=setup.eval_module,
        extra_evaluation=setup.decoding_evaluation,
    )  # fmt: skip


def plateau_watch(setup: TrainingSetup) -> PlateauWatch | None:
    """What decides the decays of ``lr_scheduler.type: plateau``, or None for other schedules."""
    sched = setup.config.optimizer.lr_scheduler
    if sched is None or sched.type != "plateau" or sched.metric is None:
        return None
    return PlateauWatch(
        sched.metric,
        metric_lower_is_better(setup, sched.metric, sched.mode),
        patience=sched.patience,
        cooldown=sched.cooldown,
        min_delta=sched.min_delta,
    )


def profiler(fit_cfg: FitSection, run: RunFolder) -> BatchProfiler | None:
    """fit.profile -> a BatchProfiler writing into RUN/profile/, or None."""
    if fit_cfg.profile is None:
        return None
    from mxtrain.engine.monitoring import BatchProfiler  # deferred: it imports MXNet

    return BatchProfiler(run.profile_trace_file, fit_cfg.profile, run.write_profile_summary)


def monitor(fit_cfg: FitSection, run: RunFolder) -> ParameterMonitor | None:
    """fit.monitor -> a ParameterMonitor appending to RUN/monitor.jsonl, or None."""
    if fit_cfg.monitor is None:
        return None
    from mxtrain.engine.monitoring import ParameterMonitor  # deferred: it imports MXNet

    monitor_cfg = fit_cfg.monitor
    return ParameterMonitor(monitor_cfg.pattern, monitor_cfg.interval, run.append_monitor_records)


def metric_lower_is_better(setup: TrainingSetup, metric: str, mode: str) -> bool:
    """Which way ``metric`` is better: ``mode`` min/max, else what the metric declares (an
    eval set's ``valid.perplexity`` as ``perplexity``)."""
    metric = metric_of_set(metric, setup.config.data.eval_set_names)[1]
    if mode == "auto":
        fit_cfg, base_dir = setup.config.fit, setup.config.base_dir
        data_info = setup.train_iter.data_info
        names = dict.fromkeys((*fit_cfg.device_evaluation_metrics, *fit_cfg.metrics))
        built = [build_metric(n, data_info, base_dir) for n in names]
        return lower_is_better(metric, mode, declared_direction(built, metric))
    return lower_is_better(metric, mode)


def report_options(setup: TrainingSetup) -> dict[str, Any]:
    """What the reporter needs to know of the config: epochs and the metric whose best is
    marked.

    The watched metric is checkpoint.best_metric, else early_stopping's, else the first of
    the evaluations' metrics (of fit.metrics without evaluation data).
    """
    config = setup.config
    ckpt, early = config.checkpoint, config.fit.early_stopping
    metric: str | None
    if ckpt.best_metric:
        metric, mode = ckpt.best_metric, ckpt.best_mode
    elif early is not None:
        metric, mode = early.metric, early.mode
    else:
        evaluated = evaluation_metric_names(config.data, config.fit)
        names = evaluated if config.data.eval else config.fit.metrics
        metric, mode = (names[0] if names else None), "auto"
    return {
        "num_epoch": config.fit.num_epoch,
        "best_metric": metric,
        "lower_is_better": metric_lower_is_better(setup, metric, mode) if metric else True,
    }
