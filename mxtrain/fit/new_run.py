"""``mxtrain fit``: from a Config to a finished new run folder.

The library call behind the command (tests and scripts call it directly): it sets training
up (:mod:`mxtrain.fit.setup`), creates the run folder with its first files (the resolved
config, the vocabulary and other iterator files, the symbol), then trains, evaluates and
checkpoints (:mod:`mxtrain.fit.supervise`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mxtrain.config import Config, dump_config
from mxtrain.data.base import model_inputs
from mxtrain.devices import prepare_process
from mxtrain.errors import PreemptedError, RunFolderError
from mxtrain.fit.run_hooks import RunHook
from mxtrain.fit.setup import TrainingSetup, prepare_training
from mxtrain.fit.supervise import (
    FitSummary,
    TrainingJob,
    report_options,
    supervise,
    supervise_worker,
)
from mxtrain.kernel_choices import write_run_file
from mxtrain.reporting import Reporter
from mxtrain.run import checkpoint, environment
from mxtrain.run.atomic import atomic_write_text
from mxtrain.run.folder import (
    RunFolder,
    create_run_folder,
    publish_run_folder,
    stage_run_folder,
)
from mxtrain.run.plugin_files import keep_plugin_files
from mxtrain.signals import StopRequests
from mxtrain.user_files import require_usable_path

log = logging.getLogger("mxtrain")


def fit_experiment(
    config: Config,
    *,
    name: str | None = None,
    force: bool = False,
    reporter: Reporter | None = None,
    hooks: Sequence[RunHook] = (),
) -> FitSummary:
    """Train the experiment described by ``config`` into a new run folder.

    Data, model and devices are all set up before the run folder is created, so a mistake
    found there leaves nothing behind. The run folder's first files are written under a
    hidden name and renamed into place, so a run folder never lacks its config. SIGTERM and
    SIGINT are stop requests from the start: one before the run folder exists ends the
    command with nothing written, one later stops at the first batch boundary. ``hooks``
    (:class:`mxtrain.fit.run_hooks.RunHook`) are called after the run's own hooks.
    """
    reporter = reporter or Reporter("plain")
    threads, context = prepare_process(config.context, measure=True)  # before MXNet loads
    if context is not config.context:
        config = dataclasses.replace(config, context=context)
    # a relative runs_dir is taken from the current folder
    runs_dir, run_name = Path(config.experiment.runs_dir), name or config.experiment.name
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
            setup = prepare_training(config, threads)
        except BaseException:
            reporter.close()
            raise
        job = TrainingJob(setup, RunFolder(runs_dir / run_name), reporter, stops, None, hooks)
        if setup.rank != 0:  # distributed: only rank 0 writes the run folder
            return supervise_worker(job)
        job.run = _create_run_folder(setup, runs_dir, run_name, force, threads, reporter, stops)
        return supervise(job)


def _create_run_folder(
    setup: TrainingSetup,
    runs_dir: Path,
    run_name: str,
    force: bool,
    threads: dict[str, str],
    reporter: Reporter,
    stops: StopRequests,
) -> RunFolder:
    """The run folder with its first files, published; the run's start reported."""
    staged = stage_run_folder(runs_dir, run_name, force=force)
    try:
        facts = _write_first_files(setup, staged, threads)
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
    for note in setup.config.notes:
        log.warning("%s", note)
    reporter.begin_run("fit", run.path, **report_options(setup), environment=facts)
    return run


def _write_first_files(
    setup: TrainingSetup, run: RunFolder, threads: dict[str, str]
) -> dict[str, Any]:
    """run.json, config.yaml, the vocabulary and other iterator files, and the symbol; returns
    the environment facts recorded in run.json."""
    config, data_iter = setup.config, setup.train_iter
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
        pretrained_embedding=setup.pretrained,
    )
    atomic_write_text(run.config_file, dump_config(config))
    keep_plugin_files(config, run.path)  # resume, score and predict import these copies
    vocab = getattr(data_iter, "vocab", None)
    if vocab is not None:
        vocab.save(run.vocab_file)
    atomic_write_text(run.model_inputs_file, json.dumps(model_inputs(data_iter), indent=1) + "\n")
    # Other files an iterator needs again later (a tagger's label vocabulary, ...).
    for filename, save in getattr(data_iter, "artifacts", dict)().items():
        save(run.path / filename)
    symbol = setup.full_sym_gen(data_iter.default_bucket_key)[0]
    checkpoint.save_symbol(symbol, run, config.checkpoint.prefix)
    if setup.kernel_choices:
        write_run_file(run.path, setup.kernel_choices, str(setup.contexts[0]))
    return facts
