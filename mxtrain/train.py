"""``mxtrain fit``: from a validated Config to a finished run folder.

This is the library call behind the command (tests call it directly). It creates the run
folder, writes the resolved config and vocabulary, builds the iterators, model and
BucketingModule, trains, evaluates and checkpoints, and records the run's status.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mxtrain.config import Config, dump_config
from mxtrain.data.base import DataContext
from mxtrain.distributed import build_contexts, configure_threads
from mxtrain.errors import ConfigError, MxtrainError
from mxtrain.reporting import Reporter, format_metrics
from mxtrain.rundir import (
    MetricsLog,
    RunFolder,
    atomic_write_text,
    create_run_folder,
    environment_facts,
    finish_replacement,
)

log = logging.getLogger("mxtrain")


@dataclass
class FitSummary:
    """What a finished ``fit`` returns."""

    run: RunFolder
    epochs: list[dict[str, Any]] = field(default_factory=list)

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
    found there leaves nothing behind.
    """
    reporter = reporter or Reporter("plain")
    threads = configure_threads(config.context)  # before MXNet is imported
    runs_dir, run_name = run_folder_for(config, name)
    if (runs_dir / run_name).exists() and not force:
        create_run_folder(runs_dir, run_name, force=False)  # raises the explanatory error
    try:
        setup = _prepare(config, threads)
    except BaseException:
        reporter.close()
        raise
    run = create_run_folder(runs_dir, run_name, force=force)
    reporter.attach_log_file(run.log_file)
    started = time.time()
    run.write_status(
        status="running",
        started=started,
        mxnet=setup.mxnet_version,
        threads=threads,
        **environment_facts(),
    )
    atomic_write_text(run.config_file, dump_config(config))
    log.info("run folder %s", run.path)
    status = "failed"
    try:
        summary = _train(config, setup, run, reporter)
        status = "finished"
        return summary
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


def _seed_everything(seed: int) -> None:
    import mxnet as mx
    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    mx.random.seed(seed)


@dataclass
class _Setup:
    """Everything built from the config before the run folder exists."""

    train_iter: Any
    eval_iter: Any
    module: Any
    contexts: list[Any]
    mxnet_version: str


def _prepare(config: Config, threads: dict[str, str]) -> _Setup:
    import mxnet as mx

    from mxtrain.engine.bucketing import BucketingModule
    from mxtrain.experiment import build_data_iter, build_sym_gen
    from mxtrain.optim import build_initializer, optimizer_arguments

    seed = config.experiment.seed
    base_dir = config.base_dir
    log.info("mxtrain, MXNet %s, threads %s, seed %d", mx.__version__, threads, seed)
    _seed_everything(seed)

    train_iter = build_data_iter(
        config.data.train,
        DataContext(role="train", seed=seed, base_dir=base_dir),
        base_dir,
        "data.train",
    )
    _describe("train", train_iter)
    eval_iter = None
    if config.data.eval is not None:
        eval_iter = build_data_iter(
            config.data.eval,
            DataContext(role="eval", seed=seed, base_dir=base_dir, train=train_iter),
            base_dir,
            "data.eval",
        )
        _describe("eval", eval_iter)

    sym_gen = build_sym_gen(config.model, train_iter.data_info, base_dir)
    contexts = build_contexts(config.context)
    fit_cfg = config.fit
    try:
        module = BucketingModule(
            sym_gen,
            train_iter.default_bucket_key,
            contexts,
            work_load_list=list(config.context.work_load) if config.context.work_load else None,
            fixed_param_patterns=tuple(fit_cfg.fixed_params),
            fixed_param_exclude=tuple(fit_cfg.fixed_params_exclude),
            logger=log,
        )
        # Binding the largest bucket first fails fast if the model does not fit in memory.
        module.bind(train_iter.provide_data, train_iter.provide_label, for_training=True)
    except ValueError as exc:  # e.g. a fixed_params pattern that matches nothing
        raise ConfigError(f"{config.source}: fit.fixed_params: {exc}") from exc
    module.init_params(build_initializer(config.initializer))
    optimizer_name, optimizer_params = optimizer_arguments(config.optimizer)
    update_on_kvstore = config.kvstore.update_on_kvstore
    module.init_optimizer(
        kvstore=config.kvstore.type,
        optimizer=optimizer_name,
        optimizer_params=optimizer_params,
        update_on_kvstore=None if update_on_kvstore == "auto" else update_on_kvstore,
    )
    if module.fixed_param_names:
        log.info("fixed parameters: %s", ", ".join(module.fixed_param_names))
    log.info(
        "model %s: %s parameters on %s",
        config.model.name,
        f"{_count_parameters(module):,}",
        ", ".join(str(c) for c in contexts),
    )
    return _Setup(train_iter, eval_iter, module, contexts, mx.__version__)


def _train(config: Config, setup: _Setup, run: RunFolder, reporter: Reporter) -> FitSummary:
    from mxtrain import checkpoint
    from mxtrain.engine.loop import FitOptions, MetricSet, fit
    from mxtrain.experiment import build_metric

    vocab = getattr(setup.train_iter, "vocab", None)
    if vocab is not None:
        vocab.save(run.vocab_file)
    prefix = config.checkpoint.prefix
    checkpoint.save_symbol(setup.module, run, prefix)
    data_info = setup.train_iter.data_info
    fit_cfg = config.fit

    def metric_factory() -> MetricSet:
        return MetricSet([build_metric(n, data_info, config.base_dir) for n in fit_cfg.metrics])

    options = FitOptions(
        num_epoch=fit_cfg.num_epoch,
        log_interval=fit_cfg.log_interval,
        prefetch=fit_cfg.prefetch,
        max_batches_per_epoch=fit_cfg.max_batches_per_epoch,
        eval_max_batches=fit_cfg.eval_max_batches,
        seed=config.experiment.seed,
        metric_factory=metric_factory,
    )
    summary = FitSummary(run=run)
    metrics_log = MetricsLog(run.metrics_file)
    hooks = _RunHooks(
        setup.module,
        run,
        prefix,
        config.checkpoint.period,
        options,
        reporter,
        metrics_log,
        summary,
    )
    try:
        fit(setup.module, setup.train_iter, options, eval_iter=setup.eval_iter, hooks=hooks)
    finally:
        reporter.end_epoch()
        metrics_log.close()
    return summary


def _describe(role: str, data_iter: Any) -> None:
    describe = getattr(data_iter, "describe", None)
    if callable(describe):
        log.info("%s data: %s", role, describe())


def _count_parameters(module: Any) -> int:
    arg_params, _ = module.get_params()
    return int(sum(v.size for v in arg_params.values()))


class _RunHooks:
    """Fit-loop callbacks that feed the progress display, metrics.jsonl and checkpoints."""

    def __init__(
        self,
        module: Any,
        run: RunFolder,
        prefix: str,
        period: int,
        options: Any,
        reporter: Reporter,
        metrics_log: MetricsLog,
        summary: FitSummary,
    ) -> None:
        self.module = module
        self.run = run
        self.prefix = prefix
        self.period = period
        self.options = options
        self.reporter = reporter
        self.metrics_log = metrics_log
        self.summary = summary
        self.best: dict[str, float] = {}

    def on_epoch_start(self, epoch: int, num_batches: int | None) -> None:
        self.reporter.start_epoch(epoch, num_batches)

    def on_interval(self, record: Any) -> None:
        self.reporter.advance(record.batches)
        self.reporter.interval(
            record.epoch, record.batch, record.samples_per_s, record.tokens_per_s, record.metrics
        )
        self.metrics_log.write(
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

    def on_epoch_end(self, result: Any) -> None:
        self.reporter.end_epoch()
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
        saved = None
        if result.epoch % self.period == 0 or result.epoch == self.options.num_epoch:
            from mxtrain import checkpoint

            saved = checkpoint.save_params(self.module, self.run, self.prefix, result.epoch)
            entry["checkpoint"] = saved.name
        self.metrics_log.write(entry)
        self.summary.epochs.append(entry)
        speed = f"{train.samples_per_s:,.0f} samples/s"
        if train.tokens_per_s is not None:
            speed += f", {train.tokens_per_s:,.0f} tokens/s"
        line = (
            f"epoch {result.epoch} done in {train.seconds:.1f}s ({speed}) "
            f"train {format_metrics(train.metrics)}"
        )
        if result.eval is not None:
            line += f" | eval {format_metrics(result.eval)}"
        if train.lr is not None:
            line += f" | lr {train.lr:.4g}"
        if saved is not None:
            line += f" | saved {saved.name}"
        log.info(line)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)
