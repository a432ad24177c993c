"""``mxtrain fit`` and ``mxtrain resume``: from a Config to a finished run folder.

These are the library calls behind the commands (tests call them directly). A new run
creates the run folder, writes the resolved config and vocabulary, builds the iterators,
model and BucketingModule, trains, evaluates and checkpoints. A resumed run rebuilds the
same pieces from the run folder alone, restores parameters, optimizer state and the exact
position in the data, and continues as if it had never stopped.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mxtrain.config import Config, config_to_dict, dump_config, load_config
from mxtrain.config.resume_policy import diff_configs
from mxtrain.data.base import DataContext, model_inputs
from mxtrain.devices import build_contexts, configure_threads
from mxtrain.distributed import is_distributed
from mxtrain.engine.kernels import prepare_allocator
from mxtrain.errors import ConfigError, MxtrainError, PreemptedError, RunFolderError
from mxtrain.hooks import CheckpointHook, MetricsLogHook, ReporterHook, RunHooks, TensorBoardHook
from mxtrain.metric_tracker import MetricTracker, declared_direction, lower_is_better
from mxtrain.reporting import Reporter
from mxtrain.run import environment
from mxtrain.run.atomic import atomic_write_bytes, atomic_write_text, remove_stale_temporaries
from mxtrain.run.bucket_keys import checkpoint_keys
from mxtrain.run.folder import (
    MetricsLog,
    create_run_folder,
    finish_replacement,
    publish_run_folder,
    read_metrics,
    stage_run_folder,
)
from mxtrain.run.layout import RunFolder
from mxtrain.run.params import ParamsMismatchError, params_mismatch_error
from mxtrain.run.plugin_files import keep_plugin_files, uses_kept_plugins
from mxtrain.signals import StopRequests
from mxtrain.user_files import require_usable_path

log = logging.getLogger("mxtrain")


#: Metric names for which a lower value is better (checkpoint.best_mode: auto).
@dataclass
class FitSummary:
    """What a finished ``fit`` or ``resume`` returns."""

    run: RunFolder
    epochs: list[dict[str, Any]] = field(default_factory=list)
    stop_reason: str | None = None  # max_updates, max_time or early_stopping when early

    @property
    def final_eval(self) -> dict[str, float] | None:
        return self.epochs[-1].get("eval") if self.epochs else None


def run_folder_for(config: Config, name: str | None) -> tuple[Path, str]:
    """(runs_dir, run name) for a config; relative runs_dir is taken from the current folder."""
    return Path(config.experiment.runs_dir), name or config.experiment.name


def fit_experiment(
    config: Config,
    *,
    name: str | None = None,
    force: bool = False,
    reporter: Reporter | None = None,
) -> FitSummary:
    """Train the experiment described by ``config`` into a new run folder.

    Data, model and devices are all set up before the run folder is created, so a mistake
    found there leaves nothing behind. The run folder's first files are written under a
    hidden name and renamed into place, so a run folder never lacks its config. SIGTERM and
    SIGINT are stop requests from the start: one before the run folder exists ends the
    command with nothing written, one later stops at the first batch boundary.
    """
    reporter = reporter or Reporter("plain")
    prepare_allocator(config.context.large_buffers)  # before MXNet starts its threads
    threads = configure_threads(config.context, measure=True)  # before MXNet is imported
    config = _with_thread_settings(config)
    runs_dir, run_name = run_folder_for(config, name)
    require_usable_path(
        runs_dir / run_name,
        "run folder",
        error=RunFolderError,
        hint="Choose a shorter experiment.runs_dir or name.",
    )
    with StopRequests() as stops:
        if (runs_dir / run_name).exists() and not force:
            create_run_folder(runs_dir, run_name, force=False)  # raises the explanatory error
        try:
            setup = _prepare(config, threads)
        except BaseException:
            reporter.close()
            raise
        config = setup.config  # auto kernel settings resolved: what the run folder records
        if setup.rank != 0:  # distributed: only rank 0 writes the run folder
            return _supervise_worker(config, setup, reporter, None, runs_dir / run_name, stops)
        staged = stage_run_folder(runs_dir, run_name, force=force)
        try:
            facts = _write_first_files(config, setup, staged, threads)
            if stops.requested():
                raise PreemptedError(
                    "stopped on request before the run folder was created; nothing was written.",
                    hint="Start the run again with the same `mxtrain fit` command.",
                )
            run = publish_run_folder(staged, runs_dir, run_name, force=force)
        except BaseException:
            shutil.rmtree(staged.path, ignore_errors=True)
            reporter.close()
            raise
        reporter.attach_log_file(run.log_file)
        environment.log_facts(facts)
        log.info("run folder %s", run.path)
        reporter.begin_run("fit", run.path, **_report_options(config, setup), environment=facts)
        return _supervise(config, setup, run, reporter, None, stops)


def _with_thread_settings(config: Config) -> Config:
    """``config`` with the OpenMP settings now in force instead of ``auto``: config.yaml
    records them, so a resume runs the same thread count (and float rounding)."""
    import dataclasses

    context = config.context
    changes: dict[str, Any] = {}
    if context.omp_threads == "auto" and os.environ.get("OMP_NUM_THREADS", "").isdigit():
        changes["omp_threads"] = int(os.environ["OMP_NUM_THREADS"])
    wait = os.environ.get("OMP_WAIT_POLICY", "").lower()
    if context.omp_wait_policy == "auto" and wait in ("active", "passive"):
        changes["omp_wait_policy"] = wait
    if not changes:
        return config
    return dataclasses.replace(config, context=dataclasses.replace(context, **changes))


def _write_first_files(
    config: Config, setup: _Setup, run: RunFolder, threads: dict[str, str]
) -> dict[str, Any]:
    """run.json, config.yaml, the vocabulary and other iterator files, and the symbol; returns
    the environment facts recorded in run.json."""
    facts = environment.collect(
        contexts=setup.contexts, seed=config.experiment.seed, threads=threads
    )
    run.write_status(
        status="running",
        started=time.time(),
        mxnet=setup.mxnet_version,
        threads=threads,
        # Relative paths in config.yaml (data files, plugins) are resolved against this.
        config_dir=str(Path(config.base_dir).resolve()),
        **environment.run_json_facts(),
        environment=facts,
        initialized_from=setup.warm_start.to_json() if setup.warm_start else None,
    )
    atomic_write_text(run.config_file, dump_config(config))
    keep_plugin_files(config, run.path)  # resume, score and predict import these copies
    vocab = getattr(setup.train_iter, "vocab", None)
    if vocab is not None:
        vocab.save(run.vocab_file)
    atomic_write_text(
        run.model_inputs_file, json.dumps(model_inputs(setup.train_iter), indent=1) + "\n"
    )
    # Other files an iterator needs again later (a tagger's label vocabulary, ...).
    for filename, save in getattr(setup.train_iter, "artifacts", dict)().items():
        save(run.path / filename)
    from mxtrain.build import build_sym_gen
    from mxtrain.run import checkpoint

    # the model's whole graph (probabilities included), which training may have trimmed
    data_iter = setup.train_iter
    symbol = build_sym_gen(config.model, data_iter.data_info, config.base_dir)(
        data_iter.default_bucket_key
    )[0]
    checkpoint.save_symbol(symbol, run, config.checkpoint.prefix)
    if setup.kernel_choices:
        from mxtrain.kernel_choices import write_run_file

        write_run_file(run.path, setup.kernel_choices, str(setup.contexts[0]))
    return facts


@uses_kept_plugins
def resume_experiment(
    run_path: str | Path,
    *,
    epoch: int | None = None,
    overrides: Sequence[str] = (),
    force: bool = False,
    reporter: Reporter | None = None,
) -> FitSummary:
    """Continue a run from its newest valid checkpoint (or the end of ``epoch``).

    Config changes given as ``overrides`` are checked against the resume policy: keys that
    may change are applied, keys that must match are refused unless ``force``. A run killed
    before its first checkpoint starts again from the beginning (its initial parameters come
    from the seed); one killed after its last checkpoint only gets its records completed.
    """
    reporter = reporter or Reporter("plain")
    with StopRequests() as stops:
        return _resume(Path(run_path), epoch, overrides, force, reporter, stops)


def _resume(
    run_path: Path,
    epoch: int | None,
    overrides: Sequence[str],
    force: bool,
    reporter: Reporter,
    stops: StopRequests,
) -> FitSummary:
    run = _existing_run(run_path)
    # read (and checked) before anything in the folder changes; rewritten from this below
    records = read_metrics(run.metrics_file) if run.metrics_file.exists() else None
    status = run.read_status()
    config_dir = run.config_dir()
    saved = load_config(run.config_file, base_dir=config_dir)
    config = load_config(run.config_file, overrides, base_dir=config_dir)
    changes = diff_configs(config_to_dict(saved), config_to_dict(config))
    for change in changes:
        log.info("config change on resume: %s", change.describe())
    refused = [c for c in changes if not c.allowed]
    if refused and not force:
        raise ConfigError(
            f"resuming {run.path} with changes to keys that must match the saved run: "
            + "; ".join(c.describe() for c in refused)
            + ".",
            hint="Those keys shape the model, the data order or the optimizer state, so the "
            "run would not be a continuation. Start a new run with `mxtrain fit`, or pass "
            "--force to resume anyway.",
        )

    from mxtrain.run import checkpoint

    _check_writable(run)
    from mxtrain.engine.loop import Position

    loaded = found = None
    later: list[Any] = []
    skipped: list[tuple[Any, str]] = []  # damaged checkpoints the choice passed over
    position: Position | None = None
    listed = checkpoint.list_checkpoints(run)
    if listed or epoch is not None:
        # loading is part of the choice: a checkpoint MXNet cannot read, or whose position is
        # impossible, is skipped like a damaged one
        loaded, skipped = checkpoint.find_and_load(
            run, epoch, accept=lambda loaded: Position.from_json(loaded.state.get("position"))
        )
        found = loaded.checkpoint
        checkpoint_keys(loaded, run)  # edited keys are refused before the model is bound for them
        for bad, reason in skipped:
            log.warning(
                "checkpoint %s is not usable (%s); falling back to an older one", bad.tag, reason
            )
        later = [c for c in listed if (c.epoch, c.batch) > (found.epoch, found.batch)]
        later = [c for c in later if c not in [s for s, _ in skipped]]
        if later and not force:
            raise RunFolderError(
                f"resuming {run.path} from {found.tag} would overwrite the newer checkpoints "
                f"{', '.join(c.tag for c in later)}.",
                hint="Resume from the newest checkpoint (omit --epoch), or pass --force to "
                "discard the newer ones.",
            )
        position = Position.from_json(loaded.state["position"])
        finished = _limit_reached(config, position)
        if finished is not None:
            if status.get("status") == "finished":
                raise _nothing_to_resume(run, config, position, finished)
            # killed after saving its last checkpoint: only the records are incomplete
            return _complete_records(config, run, reporter, loaded, skipped, finished)
    else:
        # killed (or stopped) before its first checkpoint: nothing was trained that could
        # be lost, and the initial parameters come from the seed, so start from the top
        log.warning("%s has no checkpoint yet: training starts from the beginning", run.path)

    prepare_allocator(config.context.large_buffers)
    threads = configure_threads(config.context)
    try:
        # absolute: iterators resolve relative paths against the config's folder
        setup = _prepare(config, threads, vocab_file=run.vocab_file.resolve(), restore=loaded)
        config = setup.config
        if loaded is not None:
            checkpoint.restore_module(setup.module, loaded, parameters=False)
    except ParamsMismatchError as exc:
        reporter.close()
        # a forced --set model.* is why the checkpoint no longer fits: say so
        raise params_mismatch_error(
            exc.params_file, run.config_file, exc.problems, overrides
        ) from None
    except BaseException:
        reporter.close()
        raise
    state = loaded.state if loaded is not None else None
    if setup.rank != 0:  # distributed: every worker read rank 0's checkpoint; it alone writes
        return _supervise_worker(config, setup, reporter, state, run.path, stops)
    reporter.attach_log_file(run.log_file)
    _tidy_run_folder(run, config, state, skipped)
    for stale in later:
        if checkpoint.discard_checkpoint(
            run, stale, prefix=config.checkpoint.prefix, why="resume --force"
        ):
            log.warning("removed checkpoint %s (newer than the resume point; --force)", stale.tag)
    if changes:
        previous = run.config_before_resume(int(time.time()))
        # a copy first, then the new file over the old: config.yaml is never missing
        atomic_write_bytes(previous, run.config_file.read_bytes())
        atomic_write_text(run.config_file, dump_config(config))
        log.info("saved config updated; the previous one is kept as %s", previous.name)
    _truncate_metrics(run, position, records)
    facts = environment.collect(
        contexts=setup.contexts, seed=config.experiment.seed, threads=threads
    )
    environment.log_facts(facts)
    # run.json, metrics.jsonl and `mxtrain show` name where a resume started
    tag = found.tag if found is not None else "beginning"
    resumes = list(status.get("resumes", []))
    resumes.append(
        {
            "time": time.time(),
            "from": tag,
            "overrides": list(overrides),
            "environment": facts,  # the machine may differ from the first run's
        }
    )
    run.write_status(status="running", resumes=resumes, threads=threads)
    start = position or Position(0, 0, {}, [0, 0, 0])
    log.info(
        "resuming %s from %s (epoch %d, batch %d)",
        run.path,
        f"checkpoint {tag}" if found is not None else "the beginning",
        start.epoch + (1 if start.batch else 0),
        start.batch,
    )
    with MetricsLog(run.metrics_file) as metrics_log:
        metrics_log.write(
            {"event": "resume", "from": tag, "epoch": start.epoch, "batch": start.batch}
        )
    reporter.begin_run(
        "resume",
        run.path,
        **_report_options(config, setup),
        best_so_far=state.get("best") if state else None,
        resumed_from={"tag": tag, "epoch": start.epoch, "batch": start.batch},
        environment=facts,
    )
    return _supervise(config, setup, run, reporter, state, stops)


def _report_options(config: Config, setup: _Setup) -> dict[str, Any]:
    """What the reporter needs to know of the config: epochs and the metric whose best is marked.

    The watched metric is checkpoint.best_metric, else early_stopping's, else the first of
    the evaluations' metrics (of fit.metrics without evaluation data).
    """
    ckpt, early = config.checkpoint, config.fit.early_stopping
    metric: str | None
    if ckpt.best_metric:
        metric, mode = ckpt.best_metric, ckpt.best_mode
    elif early is not None:
        metric, mode = early.metric, early.mode
    else:
        names = config.fit.evaluation_metrics if config.data.eval else config.fit.metrics
        metric, mode = (names[0] if names else None), "auto"
    return {
        "num_epoch": config.fit.num_epoch,
        "best_metric": metric,
        "lower_is_better": _lower_is_better(setup, config, metric, mode) if metric else True,
    }


def _limit_reached(config: Config, position: Any) -> str | None:
    """Which limit the saved position has already reached (nothing left to train), if any."""
    fit_cfg = config.fit
    if position.epoch >= fit_cfg.num_epoch and position.batch == 0:
        return "num_epoch"
    if fit_cfg.max_updates is not None and position.updates >= fit_cfg.max_updates:
        return "max_updates"
    if fit_cfg.max_time is not None and position.seconds >= fit_cfg.max_time:
        return "max_time"
    return None


def _nothing_to_resume(run: RunFolder, config: Config, position: Any, limit: str) -> ConfigError:
    """The error for a finished run whose limits are already reached, saying which to raise."""
    fit_cfg = config.fit
    if limit == "num_epoch":
        return ConfigError(
            f"{run.path} has already trained {position.epoch} epoch(s), which is "
            f"fit.num_epoch ({fit_cfg.num_epoch}); there is nothing to resume.",
            hint=f"Extend it with --set fit.num_epoch={position.epoch + 1} (or more).",
        )
    if limit == "max_updates":
        return ConfigError(
            f"{run.path} has already made {position.updates} updates, which is "
            f"fit.max_updates ({fit_cfg.max_updates}); there is nothing to resume.",
            hint=f"Raise it, e.g. --set fit.max_updates={2 * (fit_cfg.max_updates or 0)}.",
        )
    return ConfigError(
        f"{run.path} has already trained {position.seconds:.0f}s, which is "
        f"fit.max_time ({fit_cfg.max_time}s); there is nothing to resume.",
        hint="Raise fit.max_time with --set, or set it to null.",
    )


def _complete_records(
    config: Config,
    run: RunFolder,
    reporter: Reporter,
    loaded: Any,
    skipped: Sequence[tuple[Any, str]],
    limit: str,
) -> FitSummary:
    """Finish the bookkeeping of a run that was killed after saving its last checkpoint.

    Its epoch record was written before that checkpoint (see hooks.RunHooks.on_epoch_end), so
    only the retention, checkpoints/best and run.json's status are left to do.
    """
    try:
        reporter.attach_log_file(run.log_file)
        _tidy_run_folder(run, config, loaded.state, skipped)
        log.warning(
            "%s had saved its last checkpoint %s when it was stopped; marked it finished "
            "(nothing left to train)",
            run.path,
            loaded.checkpoint.tag,
        )
        run.write_status(
            status="finished",
            stop_reason=None if limit == "num_epoch" else limit,
            ended=time.time(),
        )
    finally:
        reporter.close()
    epochs = [r for r in read_metrics(run.metrics_file) if r.get("event") == "epoch"]
    return FitSummary(run=run, epochs=epochs, stop_reason=None if limit == "num_epoch" else limit)


def _tidy_run_folder(
    run: RunFolder,
    config: Config,
    state: dict[str, Any] | None,
    skipped: Sequence[tuple[Any, str]],
) -> None:
    """Undo what a killed process left half-done: temporary files, the checkpoint retention
    and checkpoints/best as of the checkpoint resumed from (``state``). First the damaged
    checkpoints the choice ``skipped`` are set aside, out of reach of every later save and
    retention (and before tidying, which may move an interrupted replacement back)."""
    from mxtrain.run import checkpoint

    checkpoint.keep_damaged_aside(run, skipped)
    for folder in (run.path, run.checkpoints_dir):
        for name in remove_stale_temporaries(folder):
            log.info("removed %s (left by an interrupted write)", folder / name)
    checkpoint.tidy_checkpoints(run, config.checkpoint.prefix)
    ckpt_cfg = config.checkpoint
    checkpoint.settle_checkpoints(
        run, prefix=ckpt_cfg.prefix, keep_last=ckpt_cfg.keep_last, best=(state or {}).get("best")
    )


def _check_writable(run: RunFolder) -> None:
    """Refuse to resume, before anything changes, a run folder that cannot be written.

    The probe really creates (and removes) a file in the folder and in ``checkpoints/``:
    permission bits say nothing for root or on a read-only mount.
    """

    for folder in (run.path, run.checkpoints_dir):
        if not folder.is_dir():
            continue
        try:
            fd, name = tempfile.mkstemp(prefix=".write-probe-", dir=folder)
        except OSError as exc:
            raise RunFolderError(
                f"cannot resume {run.path}: the folder {folder} cannot be written "
                f"({exc.strerror or exc}).",
                hint=f"Make it writable (e.g. chmod -R u+w {run.path}, or remount it "
                "read-write), or copy the run folder somewhere writable and resume the copy.",
            ) from exc
        os.close(fd)
        os.unlink(name)


def _existing_run(path: Path) -> RunFolder:
    require_usable_path(path, "run folder", error=RunFolderError)
    run = RunFolder(path)
    if not path.is_dir():
        raise RunFolderError(
            f"{path} is not a run folder (it does not exist).",
            hint="Give the folder `mxtrain fit` created, e.g. runs/ptb_lstm.",
        )
    run.check_entries()
    if not run.config_file.is_file():
        raise RunFolderError(
            f"{path} has no {run.config_file.name}, so it is not a complete mxtrain run folder.",
            hint="Give the folder `mxtrain fit` created, e.g. runs/ptb_lstm.",
        )
    return run


def _truncate_metrics(run: RunFolder, position: Any, records: list[dict[str, Any]] | None) -> None:
    """Drop the metrics ``records`` (None: there is no metrics file) past the resume point
    (``position`` None: the beginning): they will be produced again."""
    if records is None:
        return
    if position is None:
        from mxtrain.engine.loop import Position

        position = Position(0, 0, {}, [0, 0, 0])
    done = position.epoch  # epochs completed before the resume point

    def keep(record: dict[str, Any]) -> bool:
        epoch = record.get("epoch")
        if record.get("event") == "epoch":
            return isinstance(epoch, int) and epoch <= done
        if record.get("event") in ("interval", "eval"):
            if not isinstance(epoch, int):
                return False
            return epoch <= done or (epoch == done + 1 and record.get("batch", 0) <= position.batch)
        return True

    import json

    kept = [r for r in records if keep(r)]
    atomic_write_text(run.metrics_file, "".join(json.dumps(r) + "\n" for r in kept))


def _supervise(
    config: Config,
    setup: _Setup,
    run: RunFolder,
    reporter: Reporter,
    resume_state: dict[str, Any] | None,
    stops: StopRequests,
) -> FitSummary:
    """Train, keeping run.json's status true whatever happens."""
    started = time.time()
    status = "failed"
    try:
        summary = _train(config, setup, run, reporter, resume_state, stops)
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
        kept = finish_replacement(run, succeeded=status == "finished")
        if kept:
            log.warning(kept)
        reporter.close()
        run.write_status(status=status, ended=time.time(), duration_s=time.time() - started)


def _supervise_worker(
    config: Config,
    setup: _Setup,
    reporter: Reporter,
    resume_state: dict[str, Any] | None,
    run_path: Path,
    stops: StopRequests,
) -> FitSummary:
    """Train as a distributed worker other than rank 0: nothing is written to the run folder.

    The loop's bookkeeping goes to a private temporary folder (deleted at the end); this
    worker's log is its standard output, which ``mxtrain launch`` keeps per rank.
    """
    scratch = Path(tempfile.mkdtemp(prefix=f"mxtrain-rank{setup.rank}-"))
    log.info("worker rank %d: rank 0 writes the run folder %s", setup.rank, run_path)
    try:
        summary = _supervise(config, setup, RunFolder(scratch), reporter, resume_state, stops)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    summary.run = RunFolder(run_path)
    return summary


def _seed_everything(seed: int) -> None:
    import mxnet as mx
    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    mx.random.seed(seed)


@dataclass
class _Setup:
    """Everything built from the config before training starts."""

    train_iter: Any
    eval_iter: Any
    module: Any
    contexts: list[Any]
    mxnet_version: str
    rank: int = 0  # distributed worker rank (0 alone writes the run folder)
    coordinator: Any = None  # distributed.Coordinator for dist_sync kvstores
    warm_start: Any = None  # warm_start.WarmStartReport: where the starting weights came from
    callbacks: Any = None  # callbacks.CallbackRunner of fit.callbacks (None: none)
    config: Any = None  # the config with its auto kernel settings resolved (kernel_choices)
    kernel_choices: list[Any] = field(default_factory=list)
    eval_module: Any = None  # evaluates with the full graph when training uses another one


def _update_on_kvstore(config: Config) -> bool | None:
    """``kvstore.update_on_kvstore`` as the module takes it: ``auto`` becomes false when an
    optimizer key needs the updates on the workers (the config check refused the settings
    that update on the servers)."""
    from mxtrain import distributed
    from mxtrain.config.schema import worker_update_keys

    chosen = distributed.resolve_update_on_kvstore(config.kvstore)
    return False if worker_update_keys(config.optimizer) else chosen


def _recorded_buckets(restore: Any) -> tuple[int, ...] | None:
    """The bucket lengths a resumed run's checkpoint recorded (None: fresh run, or none)."""
    keys = getattr(restore, "bucket_keys", None)
    if not keys or not all(isinstance(k, int) for k in keys):
        return None
    return tuple(keys)


def _recorded_last_batch(restore: Any) -> str | None:
    """A resumed run's last-batch rule: what its checkpoint recorded, or ``pad`` for a
    checkpoint of a version that had no such rule (None: fresh run, or no bucketing)."""
    if restore is None or not getattr(restore, "bucket_keys", None):
        return None
    return (getattr(restore, "state", None) or {}).get("last_batch") or "pad"


def _train_iterator(
    config: Config,
    section: Any,
    min_batch: int,
    vocab_file: Path | None = None,
    restore: Any = None,
) -> Any:
    """The training iterator of ``section`` (data.train, sharded in a distributed run)."""
    from mxtrain.build import build_data_iter

    context = DataContext(
        role="train",
        seed=config.experiment.seed,
        base_dir=config.base_dir,
        vocab_file=vocab_file,
        buckets=_recorded_buckets(restore),
        min_batch=min_batch,
        last_batch=_recorded_last_batch(restore),
    )
    return build_data_iter(section, context, config.base_dir, "data.train")


def measure_kernel_choices(config: Config, *, remeasure: bool = False) -> list[Any]:
    """The kernel and OpenMP choices ``mxtrain fit`` would make for ``config`` on this
    machine (mxtrain.kernel_choices), without training: kept ones are read back, missing ones
    measured and kept; ``remeasure`` measures every one again (``mxtrain kernels --measure``).
    """
    configure_threads(config.context, measure=True, remeasure=remeasure)  # before MXNet loads
    from mxtrain.engine.shapes import fewest_rows

    config = _with_thread_settings(config)
    contexts = build_contexts(config.context)
    min_batch = fewest_rows(len(contexts), config.context.work_load)
    train_iter = _train_iterator(config, config.data.train, min_batch)
    not_measured = ""
    if is_distributed(config.kvstore.type):
        not_measured = DISTRIBUTED_NOT_MEASURED
    return _resolve_kernels(config, train_iter, contexts, not_measured, remeasure=remeasure)[1]


#: why a distributed run measures nothing
DISTRIBUTED_NOT_MEASURED = "distributed run: every worker must build the same graph"


def _resolve_kernels(
    config: Config,
    train_iter: Any,
    contexts: list[Any],
    not_measured: str,
    *,
    fresh: bool = True,
    remeasure: bool = False,
) -> tuple[Config, list[Any]]:
    """``config`` with its ``auto`` kernel settings resolved, and every choice made (the
    OpenMP ones first, for a fresh run: a resumed one keeps what it recorded)."""
    from mxtrain import kernel_choices
    from mxtrain.build import metrics_read_loss
    from mxtrain.devices import thread_choices

    config, choices = kernel_choices.resolve(
        config,
        train_iter,
        contexts,
        probabilities=not metrics_read_loss(config, train_iter.data_info),
        not_measured=not_measured,
        remeasure=remeasure,
    )
    return config, (thread_choices() + choices if fresh else choices)


def _prepare(
    config: Config,
    threads: dict[str, str],
    vocab_file: Path | None = None,
    restore: Any = None,
) -> _Setup:
    """Data, module, kvstore and optimizer; ``restore`` (a LoadedCheckpoint) sets the weights
    before the kvstore is initialised from them."""
    import mxnet as mx

    from mxtrain import distributed
    from mxtrain.build import build_data_iter, build_initializer, build_module, optimizer_arguments
    from mxtrain.engine.shapes import fewest_rows

    if config.logging.tensorboard:  # before anything is written: a missing extra says so
        from mxtrain.tensorboard import require_writer

        require_writer()
    seed = config.experiment.seed
    base_dir = config.base_dir
    log.info("mxtrain, MXNet %s, threads %s, seed %d", mx.__version__, threads, seed)
    _seed_everything(seed)
    kv_cfg = config.kvstore
    train_section = config.data.train
    dist_kv = None
    contexts = build_contexts(config.context)
    if is_distributed(kv_cfg.type):
        # Created first and only once (a second dist kvstore hangs): the rank shards the data.
        dist_kv = distributed.create_kvstore(kv_cfg, contexts)
        log.info(
            "distributed worker rank %d of %d (kvstore %s)",
            dist_kv.rank,
            dist_kv.num_workers,
            kv_cfg.type,
        )
        from mxtrain.launch import announce_rank

        announce_rank(dist_kv.rank, dist_kv.num_workers)  # mxtrain launch names logs by rank
        train_section = distributed.shard_data_section(
            train_section, dist_kv.rank, dist_kv.num_workers, "data.train", kv_cfg.type
        )

    min_batch = fewest_rows(len(contexts), config.context.work_load)  # short last batches
    train_iter = _train_iterator(config, train_section, min_batch, vocab_file, restore)
    _describe("train", train_iter)
    eval_iter = None
    if config.data.eval is not None:
        eval_iter = build_data_iter(
            config.data.eval,
            DataContext(
                role="eval", seed=seed, base_dir=base_dir, train=train_iter, min_batch=min_batch
            ),
            base_dir,
            "data.eval",
        )
        _describe("eval", eval_iter)

    from mxtrain import kernel_choices

    fresh = restore is None and vocab_file is None
    not_measured = ""
    if dist_kv is not None:
        not_measured = DISTRIBUTED_NOT_MEASURED
    elif not fresh:
        not_measured = "resumed run: it keeps the graph it was trained with"
    config, choices = _resolve_kernels(config, train_iter, contexts, not_measured, fresh=fresh)
    kernel_choices.apply_process_settings(config)
    kernel_choices.log_choices(choices)
    fit_cfg = config.fit
    module = build_module(config, train_iter, "data.train", contexts, for_training=True, logger=log)
    module.init_params(build_initializer(config.initializer))
    started_from = None
    if restore is None:  # a resumed run's weights come from its checkpoint
        from mxtrain.warm_start import warm_start

        started_from = warm_start(module, config)
    if restore is not None:
        from mxtrain.run import checkpoint

        # Before init_optimizer: with update_on_kvstore (dist_async) the servers keep the
        # weights they are initialised with, so setting them afterwards would be undone by
        # the first pull and a resume would restart from the random initialisation.
        checkpoint.restore_module(module, restore)
    eval_module = _evaluation_module(config, module, train_iter, eval_iter, contexts)
    optimizer_name, optimizer_params = optimizer_arguments(config.optimizer)
    if fit_cfg.grad_accumulation > 1 and config.optimizer.rescale_grad == "auto":
        # gradients are summed over K batches: average over all their samples
        batch_size = train_iter.provide_data[0].shape[0]
        sync = kv_cfg.type in distributed.DIST_SYNC_TYPES
        workers = dist_kv.num_workers if dist_kv is not None and sync else 1
        optimizer_params["rescale_grad"] = 1.0 / (batch_size * fit_cfg.grad_accumulation * workers)
    kvstore = dist_kv if dist_kv is not None else distributed.create_kvstore(kv_cfg, contexts)
    from mxtrain.build import param_pattern_error
    from mxtrain.engine.parameters import ParamPatternError

    try:
        module.init_optimizer(
            kvstore=kvstore,
            optimizer=optimizer_name,
            optimizer_params=optimizer_params,
            update_on_kvstore=_update_on_kvstore(config),
            clip_global_norm=config.optimizer.clip_global_norm,
            lr_mult=config.optimizer.lr_mult,
            wd_mult=config.optimizer.wd_mult,
        )
    except ParamPatternError as exc:
        raise param_pattern_error(config, exc) from exc
    _log_update_multipliers(log, config, module.update_multipliers())
    coordinator = None
    if dist_kv is not None and kv_cfg.type in distributed.DIST_SYNC_TYPES:
        compression = kv_cfg.gradient_compression
        coordinator = distributed.Coordinator(
            dist_kv, unit=compression.threshold if compression is not None else 1.0
        )
    elif dist_kv is not None:
        log.info("dist_async: workers neither wait for each other nor agree on batch counts")
    if module.fixed_param_names:
        log.info("fixed parameters: %s", ", ".join(module.fixed_param_names))
    log.info(
        "model %s: %s parameters on %s",
        config.model.name,
        f"{_count_parameters(module):,}",
        ", ".join(str(c) for c in contexts),
    )
    rank = int(dist_kv.rank) if dist_kv is not None else 0
    callbacks = None
    if config.fit.callbacks:  # built before the run folder exists: a bad one fails first
        from mxtrain.callbacks import CallbackRunner

        callbacks = CallbackRunner(config.fit.callbacks, config.base_dir, module, rank=rank)
    return _Setup(
        train_iter,
        eval_iter,
        module,
        contexts,
        mx.__version__,
        rank,
        coordinator,
        started_from,
        callbacks,
        config,
        choices,
        eval_module,
    )


def _evaluation_module(
    config: Config, module: Any, train_iter: Any, eval_iter: Any, contexts: list[Any]
) -> Any:
    """A second module for the evaluations when the model trains on another graph than it is
    evaluated with (``model.sampled_softmax``: the full softmax), else None."""
    from mxtrain.build import build_module, wants_evaluation_graph

    if not wants_evaluation_graph(config, train_iter.data_info):
        return None
    num_sampled = getattr(config.model.options, "sampled_softmax", 0)
    classes = train_iter.data_info.num_classes
    log.info(
        "sampled softmax: training reads a softmax over each position's label and %s words "
        "drawn per batch out of %s (the training perplexity is that softmax's, not the full "
        "one's); evaluations use the full softmax",
        f"{num_sampled:,}",
        f"{classes:,}",
    )
    if eval_iter is None:
        return None
    # bound on the training module's parameter arrays: every update is what it evaluates
    return build_module(
        config,
        eval_iter,
        "data.eval",
        contexts,
        for_training=False,
        for_metrics=True,
        logger=log,
        shared_params=module,
    )


def _log_update_multipliers(
    log: logging.Logger, config: Config, multipliers: dict[str, tuple[float, float]]
) -> None:
    """Say which parameters learn at another rate and which the weight decay reaches (MXNet
    silently leaves out every parameter not named *_weight or *_gamma)."""
    scaled = [f"{name} x{lr:g}" for name, (lr, _) in multipliers.items() if lr != 1.0]
    if scaled:
        log.info("learning-rate multipliers: %s", ", ".join(scaled))
    if config.optimizer.wd == 0:
        return
    decayed = [
        name if wd == 1.0 else f"{name} x{wd:g}" for name, (_, wd) in multipliers.items() if wd
    ]
    spared = [name for name, (_, wd) in multipliers.items() if not wd]
    log.info(
        "weight decay %g on: %s%s",
        config.optimizer.wd,
        ", ".join(decayed) or "no parameter",
        f"; not on: {', '.join(spared)} (optimizer.wd_mult changes this)" if spared else "",
    )


def _train(
    config: Config,
    setup: _Setup,
    run: RunFolder,
    reporter: Reporter,
    resume_state: dict[str, Any] | None,
    stops: StopRequests,
) -> FitSummary:
    from mxtrain.build import build_metric
    from mxtrain.engine.loop import FitOptions, MetricSet, Position, fit

    data_info = setup.train_iter.data_info
    fit_cfg = config.fit

    def metric_factory() -> MetricSet:
        return MetricSet([build_metric(n, data_info, config.base_dir) for n in fit_cfg.metrics])

    def eval_metric_factory() -> MetricSet:
        names = fit_cfg.evaluation_metrics
        return MetricSet([build_metric(n, data_info, config.base_dir) for n in names])

    early = fit_cfg.early_stopping
    stopper = None
    if early is not None:
        lower = _lower_is_better(setup, config, early.metric, early.mode)
        stopper = MetricTracker(
            early.metric, lower, min_delta=early.min_delta, patience=early.patience
        )
    position = Position.from_json(resume_state["position"]) if resume_state else None
    should_stop, max_time = stops.requested, fit_cfg.max_time
    finish = setup.callbacks.finish_requested if setup.callbacks is not None else None
    coordinator, watchdog = setup.coordinator, None
    if coordinator is not None:
        # Signals, the time limit and callbacks differ between workers: they act only once
        # agreed.
        coordinator.attach(stops.requested, fit_cfg.max_time, finish)
        should_stop, max_time, finish = coordinator.stop_agreed, None, None
        if config.kvstore.watchdog_seconds is not None:
            from mxtrain.distributed import Watchdog

            watchdog = coordinator.watchdog = Watchdog(config.kvstore.watchdog_seconds)
    options = FitOptions(
        num_epoch=fit_cfg.num_epoch,
        log_interval=fit_cfg.log_interval,
        prefetch=fit_cfg.prefetch,
        max_batches_per_epoch=fit_cfg.max_batches_per_epoch,
        eval_max_batches=fit_cfg.eval_max_batches,
        seed=config.experiment.seed,
        metric_factory=metric_factory,
        eval_metric_factory=eval_metric_factory,
        resume_from=position,
        should_stop=should_stop,
        finish_requested=finish,
        eval_interval=fit_cfg.eval_interval,
        max_updates=fit_cfg.max_updates,
        max_time=max_time,
        early_stopping=stopper,
        grad_accumulation=fit_cfg.grad_accumulation,
        profiler=_profiler(fit_cfg, run),
        monitor=_monitor(fit_cfg, run),
        coordinator=coordinator,
        eval_module=setup.eval_module,
    )
    summary = FitSummary(run=run)
    ckpt_cfg = config.checkpoint
    best_metric = ckpt_cfg.best_metric
    best_lower = (
        _lower_is_better(setup, config, best_metric, ckpt_cfg.best_mode) if best_metric else True
    )
    checkpoints = CheckpointHook(
        config,
        setup.module,
        run,
        reporter,
        bucket_keys=getattr(setup.train_iter, "buckets", None),
        last_batch=getattr(setup.train_iter, "last_batch", None),
        saves=setup.rank == 0,
        best_lower_is_better=best_lower,
        resume_state=resume_state,
    )
    tensorboard = None
    if config.logging.tensorboard and checkpoints.saves:
        from mxtrain.tensorboard import ScalarLog

        tensorboard = TensorBoardHook(ScalarLog(run.path), setup.module)
    metrics_hook = MetricsLogHook()
    hooks = RunHooks(
        ReporterHook(reporter, fit_cfg),
        metrics_hook,
        checkpoints,
        tensorboard,
        summary.epochs,
        setup.callbacks,
    )
    with MetricsLog(run.metrics_file) as metrics_log:
        metrics_hook.log = metrics_log
        if watchdog is not None:
            watchdog.start()
        try:
            results = fit(
                setup.module, setup.train_iter, options, eval_iter=setup.eval_iter, hooks=hooks
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
            if tensorboard is not None:
                tensorboard.close()
            reporter.end_epoch()
    if results and results[-1].finished is not None:
        summary.stop_reason = results[-1].finished
    return summary


def _describe(role: str, data_iter: Any) -> None:
    describe = getattr(data_iter, "describe", None)
    if callable(describe):
        log.info("%s data: %s", role, describe())


def _count_parameters(module: Any) -> int:
    arg_params, _ = module.get_params()
    return int(sum(v.size for v in arg_params.values()))


def _profiler(fit_cfg: Any, run: RunFolder) -> Any:
    """fit.profile -> a BatchProfiler writing into RUN/profile/, or None."""
    if fit_cfg.profile is None:
        return None
    from mxtrain.engine.monitoring import BatchProfiler

    return BatchProfiler(run.profile_dir, fit_cfg.profile)


def _monitor(fit_cfg: Any, run: RunFolder) -> Any:
    """fit.monitor -> a ParameterMonitor appending to RUN/monitor.jsonl, or None."""
    if fit_cfg.monitor is None:
        return None
    from mxtrain.engine.monitoring import ParameterMonitor

    return ParameterMonitor(fit_cfg.monitor.pattern, fit_cfg.monitor.interval, run.monitor_file)


def _lower_is_better(setup: _Setup, config: Config, metric: str, mode: str) -> bool:
    """Which way ``metric`` is better: ``mode`` min/max, else what the metric declares."""
    if mode != "auto":
        return lower_is_better(metric, mode)
    from mxtrain.build import build_metric

    data_info = setup.train_iter.data_info
    names = dict.fromkeys((*config.fit.evaluation_metrics, *config.fit.metrics))
    built = [build_metric(n, data_info, config.base_dir) for n in names]
    return lower_is_better(metric, mode, declared_direction(built, metric))
