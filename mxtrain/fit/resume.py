"""``mxtrain resume``: continue a run from its run folder alone.

A resumed run rebuilds the pieces of :mod:`mxtrain.fit.setup` from the run folder, restores
parameters, optimizer state and the exact position in the data, and continues as if it had
never stopped (:mod:`mxtrain.fit.supervise`).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mxtrain.config import Config, config_to_dict, dump_config, load_config
from mxtrain.config.resume_policy import ConfigChange, diff_configs
from mxtrain.config.schema import CheckpointSection, FitSection
from mxtrain.devices import prepare_process
from mxtrain.errors import ConfigError, RunFolderError
from mxtrain.fit.run_hooks import RunHook
from mxtrain.fit.setup import Restart, TrainingSetup, prepare_training
from mxtrain.fit.supervise import (
    FitSummary,
    TrainingJob,
    report_options,
    supervise,
    supervise_worker,
)
from mxtrain.reporting import Reporter
from mxtrain.run import checkpoint, environment
from mxtrain.run.atomic import atomic_write_bytes, atomic_write_text, remove_stale_temporaries
from mxtrain.run.bucket_keys import BucketKeys
from mxtrain.run.checkpoint import Checkpoint, LoadedCheckpoint
from mxtrain.run.choose import recorded_buckets, recorded_last_batch
from mxtrain.run.folder import MetricsLog, RunFolder, read_metrics
from mxtrain.run.params import ParamsMismatchError, params_mismatch_error
from mxtrain.run.plugin_files import uses_kept_plugins
from mxtrain.signals import StopRequests
from mxtrain.user_files import require_usable_path

if TYPE_CHECKING:  # annotations only: MXNet must load after the run's thread settings
    from mxtrain.engine.loop import Position

log = logging.getLogger("mxtrain")


@dataclass
class ResumePoint:
    """Where a resume starts: the checkpoint chosen (None: the beginning), the damaged ones
    the choice passed over, and the newer ones ``--force`` discards."""

    loaded: LoadedCheckpoint | None = None
    position: Position | None = None
    skipped: list[tuple[Checkpoint, str]] = field(default_factory=list)
    later: list[Checkpoint] = field(default_factory=list)
    buckets: BucketKeys | None = None

    @property
    def tag(self) -> str:
        return self.loaded.checkpoint.tag if self.loaded is not None else "beginning"

    @property
    def state(self) -> dict[str, Any] | None:
        return self.loaded.state if self.loaded is not None else None


@uses_kept_plugins
def resume_experiment(
    run_path: str | Path,
    *,
    epoch: int | None = None,
    overrides: Sequence[str] = (),
    force: bool = False,
    reporter: Reporter | None = None,
    hooks: Sequence[RunHook] = (),
) -> FitSummary:
    """Continue a run from its newest valid checkpoint (or the end of ``epoch``).

    Config changes given as ``overrides`` are checked against the resume policy: keys that
    may change are applied, keys that must match are refused unless ``force``. A run killed
    before its first checkpoint starts again from the beginning (its initial parameters come
    from the seed); one killed after its last checkpoint only gets its records completed.
    ``hooks`` (:class:`mxtrain.fit.run_hooks.RunHook`) are called after the run's own hooks.
    """
    reporter = reporter or Reporter("plain")
    with StopRequests() as stops:
        run = _existing_run(Path(run_path))
        # read (and checked) before anything in the folder changes; rewritten from this below
        records = read_metrics(run.metrics_file) if run.metrics_file.exists() else None
        status = run.read_status()
        config, changes = _resumed_config(run, overrides, force)
        _check_writable(run)
        start = _choose_start(run, config, epoch, force)
        if start.position is not None and start.loaded is not None:
            finished = _limit_reached(config.fit, start.position)
            if finished is not None:
                if status.get("status") == "finished":
                    raise _nothing_to_resume(run, config.fit, start.position, finished)
                # killed after saving its last checkpoint: only the records are incomplete
                return _complete_records(config, run, reporter, start, finished)
        threads, setup = _rebuild_training(config, run, start, overrides, reporter)
        job = TrainingJob(setup, run, reporter, stops, start.state, hooks)
        if setup.rank != 0:  # distributed: every worker read rank 0's checkpoint; it alone writes
            return supervise_worker(job)
        _continue_run_folder(setup, run, reporter, start, changes, records)
        _begin(setup, run, reporter, start, status, overrides, threads)
        return supervise(job)


def _resumed_config(
    run: RunFolder, overrides: Sequence[str], force: bool
) -> tuple[Config, list[ConfigChange]]:
    """The saved config with ``overrides`` applied, and what they change; changes to keys
    that must match are refused unless ``force``."""
    config_dir = run.config_dir()
    saved = load_config(run.config_file, base_dir=config_dir)
    config = load_config(run.config_file, overrides, base_dir=config_dir)
    changes = diff_configs(config_to_dict(saved), config_to_dict(config))
    for change in changes:
        log.info("config change on resume: %s", change.describe())
    for note in config.notes:
        log.warning("%s", note)
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
    return config, changes


def _choose_start(run: RunFolder, config: Config, epoch: int | None, force: bool) -> ResumePoint:
    """The checkpoint to resume from: the newest usable one, or the end of ``epoch``."""
    from mxtrain.engine.loop import Position  # deferred: it imports MXNet

    listed = checkpoint.list_checkpoints(run)
    if not listed and epoch is None:
        # killed (or stopped) before its first checkpoint: nothing was trained that could
        # be lost, and the initial parameters come from the seed, so start from the top
        log.warning("%s has no checkpoint yet: training starts from the beginning", run.path)
        return ResumePoint()
    # loading is part of the choice: a checkpoint MXNet cannot read, or whose position is
    # impossible, is skipped like a damaged one
    loaded, skipped = checkpoint.find_and_load(
        run, epoch, accept=lambda loaded: Position.from_json(loaded.state.get("position"))
    )
    found = loaded.checkpoint
    buckets = recorded_buckets(loaded, run)  # edited keys are refused before the model is bound
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
    return ResumePoint(loaded, position, list(skipped), later, buckets)


def _rebuild_training(
    config: Config,
    run: RunFolder,
    start: ResumePoint,
    overrides: Sequence[str],
    reporter: Reporter,
) -> tuple[dict[str, str], TrainingSetup]:
    """The thread settings and the training set up from the run folder and ``start``."""
    threads, _ = prepare_process(config.context)  # config.yaml recorded the thread settings
    restart = Restart(
        vocab_file=run.vocab_file.resolve(),
        loaded=start.loaded,
        buckets=start.buckets,
        last_batch=recorded_last_batch(start.loaded),
    )
    try:
        setup = prepare_training(config, threads, restart)
        if start.loaded is not None:
            checkpoint.restore_module(setup.module, start.loaded, parameters=False)
    except ParamsMismatchError as exc:
        reporter.close()
        # a forced --set model.* is why the checkpoint no longer fits: say so
        raise params_mismatch_error(
            exc.params_file, run.config_file, exc.problems, overrides
        ) from None
    except BaseException:
        reporter.close()
        raise
    return threads, setup


def _continue_run_folder(
    setup: TrainingSetup,
    run: RunFolder,
    reporter: Reporter,
    start: ResumePoint,
    changes: list[ConfigChange],
    records: list[dict[str, Any]] | None,
) -> None:
    """Bring the run folder to the resume point: tidied, newer checkpoints discarded, the
    changed config saved (the old one kept), metrics past the point dropped."""
    config = setup.config
    reporter.attach_log_file(run.log_file)
    _tidy_run_folder(run, config.checkpoint, start.state, start.skipped)
    for stale in start.later:
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
    _truncate_metrics(run, start.position, records)


def _begin(
    setup: TrainingSetup,
    run: RunFolder,
    reporter: Reporter,
    start: ResumePoint,
    status: dict[str, Any],
    overrides: Sequence[str],
    threads: dict[str, str],
) -> None:
    """Record where the resume starts (run.json, metrics.jsonl, the log) and report it."""
    from mxtrain.engine.loop import Position  # deferred: it imports MXNet

    config = setup.config
    facts = environment.collect(
        contexts=setup.contexts, seed=config.experiment.seed, threads=threads
    )
    environment.log_facts(facts)
    # run.json, metrics.jsonl and `mxtrain show` name where a resume started
    resumes = list(status.get("resumes", []))
    resumes.append(
        {
            "time": time.time(),
            "from": start.tag,
            "overrides": list(overrides),
            "environment": facts,  # the machine may differ from the first run's
        }
    )
    run.write_status(status="running", resumes=resumes, threads=threads)
    position = start.position or Position(0, 0, {}, [0, 0, 0])
    log.info(
        "resuming %s from %s (epoch %d, batch %d)",
        run.path,
        f"checkpoint {start.tag}" if start.loaded is not None else "the beginning",
        position.epoch + (1 if position.batch else 0),
        position.batch,
    )
    with MetricsLog(run.metrics_file) as metrics_log:
        metrics_log.write(
            {"event": "resume", "from": start.tag, "epoch": position.epoch, "batch": position.batch}
        )
    state = start.state
    reporter.begin_run(
        "resume",
        run.path,
        **report_options(setup),
        best_so_far=state.get("best") if state else None,
        resumed_from={"tag": start.tag, "epoch": position.epoch, "batch": position.batch},
        environment=facts,
    )


def _limit_reached(fit_cfg: FitSection, position: Position) -> str | None:
    """Which limit the saved position has already reached (nothing left to train), if any."""
    if position.epoch >= fit_cfg.num_epoch and position.batch == 0:
        return "num_epoch"
    if fit_cfg.max_updates is not None and position.updates >= fit_cfg.max_updates:
        return "max_updates"
    if fit_cfg.max_time is not None and position.seconds >= fit_cfg.max_time:
        return "max_time"
    return None


def _nothing_to_resume(
    run: RunFolder, fit_cfg: FitSection, position: Position, limit: str
) -> ConfigError:
    """The error for a finished run whose limits are already reached, saying which to raise."""
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
    config: Config, run: RunFolder, reporter: Reporter, start: ResumePoint, limit: str
) -> FitSummary:
    """Finish the bookkeeping of a run that was killed after saving its last checkpoint.

    Its epoch record was written before that checkpoint (see run_hooks.RunHooks), so only
    the retention, checkpoints/best and run.json's status are left to do.
    """
    try:
        reporter.attach_log_file(run.log_file)
        _tidy_run_folder(run, config.checkpoint, start.state, start.skipped)
        log.warning(
            "%s had saved its last checkpoint %s when it was stopped; marked it finished "
            "(nothing left to train)",
            run.path,
            start.tag,
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
    ckpt_cfg: CheckpointSection,
    state: dict[str, Any] | None,
    skipped: Sequence[tuple[Checkpoint, str]],
) -> None:
    """Undo what a killed process left half-done: temporary files, the checkpoint retention
    and checkpoints/best as of the checkpoint resumed from (``state``). First the damaged
    checkpoints the choice ``skipped`` are set aside, out of reach of every later save and
    retention (and before tidying, which may move an interrupted replacement back)."""
    checkpoint.keep_damaged_aside(run, skipped)
    for folder in (run.path, run.checkpoints_dir):
        for name in remove_stale_temporaries(folder):
            log.info("removed %s (left by an interrupted write)", folder / name)
    checkpoint.tidy_checkpoints(run, ckpt_cfg.prefix)
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


def _truncate_metrics(
    run: RunFolder, position: Position | None, records: list[dict[str, Any]] | None
) -> None:
    """Drop the metrics ``records`` (None: there is no metrics file) past the resume point
    (``position`` None: the beginning): they will be produced again."""
    if records is None:
        return
    done = position.epoch if position is not None else 0  # epochs done before the point
    batch = position.batch if position is not None else 0

    def keep(record: dict[str, Any]) -> bool:
        epoch = record.get("epoch")
        if record.get("event") == "epoch":
            return isinstance(epoch, int) and epoch <= done
        if record.get("event") in ("interval", "eval"):
            if not isinstance(epoch, int):
                return False
            return epoch <= done or (epoch == done + 1 and record.get("batch", 0) <= batch)
        return True

    kept = [r for r in records if keep(r)]
    atomic_write_text(run.metrics_file, "".join(json.dumps(r) + "\n" for r in kept))
