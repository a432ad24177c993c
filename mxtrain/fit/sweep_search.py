"""The search mode of ``mxtrain sweep`` (``--search KEY=SPEC ... --trials N``), through Optuna.

Optuna (the field's well-kept library for it) samples each point with its TPE sampler, seeded
by ``--seed``; its median pruner is told every evaluation of the watched metric as the point's
run logs it, and a point it prunes is stopped at a checkpoint like any stopped run. The study
lives in the sweep folder as ``study.db`` (SQLite), so the same command continues it: a point
that was running resumes from its checkpoint and keeps its trial.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mxtrain.config import Config, load_config
from mxtrain.config.schema import evaluation_metric_names, metric_of_set
from mxtrain.errors import ConfigError, RunFolderError
from mxtrain.fit.sweep import (
    Sweep,
    SweepPoint,
    continued_sweep,
    is_continued,
    sweep_folder,
)
from mxtrain.metric_tracker import lower_is_better
from mxtrain.run.folder import read_metrics
from mxtrain.sweep_plan import SearchParam, format_value, point_name

log = logging.getLogger("mxtrain")

STUDY_FILE = "study.db"


def watched_metric(config: Config, metric: str | None) -> tuple[str, bool]:
    """The metric a search optimizes (``--metric``, else checkpoint.best_metric, else
    early_stopping's, else the first the evaluations compute) and whether lower is better."""
    if config.data.eval is None:
        raise ConfigError(
            f"{config.source}: a search needs evaluations to compare its points, but data.eval "
            "is not set.",
            hint="Add a data.eval section, or sweep a --grid instead.",
        )
    ckpt, early = config.checkpoint, config.fit.early_stopping
    names = evaluation_metric_names(config.data, config.fit)
    if metric is None:
        metric = ckpt.best_metric or (early.metric if early else None) or names[0]
    if metric not in names:
        raise ConfigError(
            f"--metric {metric}: the evaluations compute {', '.join(names)}, not {metric}.",
            hint="Pick one of them, or add it to fit.eval_metrics.",
        )
    mode = ckpt.best_mode if metric == ckpt.best_metric else "auto"
    return metric, lower_is_better(metric_of_set(metric, config.data.eval_set_names)[1], mode)


def prepare_search(
    config_file: str,
    overrides: Sequence[str],
    params: Sequence[SearchParam],
    *,
    trials: int,
    seed: int,
    metric: str | None,
    name: str | None,
    runs_dir: Path | None,
) -> tuple[Sweep, bool]:
    """The search sweep to run (new, or the one in its folder) and whether lower is better.
    Each parameter's bounds or choices are checked against the config before anything
    starts."""
    base = load_config(config_file, overrides)
    watched, lower = watched_metric(base, metric)
    keys = [p.key for p in params]
    if len(set(keys)) != len(keys):
        raise ConfigError("a --search key is given twice; give each key once.")
    for param in params:
        values = param.choices or (format_value(param.low), format_value(param.high))
        if param.kind == "int":
            values = tuple(str(int(v)) for v in (param.low, param.high))
        for value in values:
            load_config(config_file, [*overrides, f"{param.key}={value}"])
    folder = sweep_folder(base, name, runs_dir)
    sweep = Sweep(folder, str(Path(config_file).absolute()), list(overrides), [], None, seed)
    sweep.search, sweep.trials, sweep.metric = list(params), trials, watched
    if is_continued(folder):
        return continued_sweep(sweep), lower
    folder.mkdir(parents=True, exist_ok=True)
    sweep.save()
    return sweep, lower


class SearchDriver:
    """Optuna's points for :func:`mxtrain.fit.sweep.run_sweep`: interrupted points first
    (their trials kept), then new trials until ``sweep.trials`` points exist."""

    def __init__(self, sweep: Sweep, lower_is_better: bool) -> None:
        import optuna  # deferred: the optional search dependency, imported only by searches

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.optuna = optuna
        self.sweep = sweep
        self.lower = lower_is_better
        self.study = optuna.create_study(
            study_name="sweep",
            storage=f"sqlite:///{sweep.folder / STUDY_FILE}",
            load_if_exists=True,
            direction="minimize" if lower_is_better else "maximize",
            sampler=optuna.samplers.TPESampler(seed=sweep.seed),
            pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=1),
        )
        self.waiting = [p for p in sweep.points if p.status in ("running", "interrupted")]
        self.trials: dict[str, Any] = {}

    def next_point(self) -> SweepPoint | None:
        if self.waiting:
            point = self.waiting.pop(0)
            self.trials[point.name] = self._trial(point.trial)
            return point
        if len(self.sweep.points) >= (self.sweep.trials or 0):
            return None
        trial = self.study.ask()
        chosen = [(p.key, format_value(_suggest(trial, p))) for p in self.sweep.search]
        point = SweepPoint(point_name(len(self.sweep.points) + 1, tuple(chosen)), chosen)
        point.trial = trial.number
        self.sweep.points.append(point)
        self.trials[point.name] = trial
        return point

    def _trial(self, number: int | None) -> Any:
        """The live trial of an interrupted point (its number is in sweep.json)."""
        frozen = next(t for t in self.study.get_trials(deepcopy=False) if t.number == number)
        return self.optuna.trial.Trial(self.study, frozen._trial_id)

    def observe(self, point: SweepPoint) -> bool:
        """Tell the trial the point's new evaluations; True when the pruner stops it."""
        trial = self.trials[point.name]
        new = [(e, v) for e, v in self._evaluations(point) if e > point.reported]
        for epoch, value in new:
            trial.report(value, step=epoch)
            point.reported = epoch
        return bool(new) and trial.should_prune()

    def finished(self, point: SweepPoint) -> None:
        trial = self.trials.pop(point.name)
        states = self.optuna.trial.TrialState
        if point.status == "interrupted":
            return  # the trial stays running; the same command resumes the point
        values = [v for _, v in self._evaluations(point)]
        if point.status == "finished" and values:
            best = min(values) if self.lower else max(values)
            self.study.tell(trial, best)
        elif point.status == "pruned":
            self.study.tell(trial, state=states.PRUNED)
        else:
            self.study.tell(trial, state=states.FAIL)

    def _evaluations(self, point: SweepPoint) -> list[tuple[int, float]]:
        """(epoch, value of the watched metric) of each finished epoch the run logged."""
        path = self.sweep.folder / point.name / "metrics.jsonl"
        if not path.exists():
            return []
        try:
            records = read_metrics(path)
        except RunFolderError:
            return []  # read again at the next poll
        metric = self.sweep.metric or ""
        return [
            (int(r["epoch"]), float(r["eval"][metric]))
            for r in records
            if r.get("event") == "epoch"
            and not r.get("partial")
            and metric in (r.get("eval") or {})
        ]


def _suggest(trial: Any, param: SearchParam) -> Any:
    if param.kind == "float":
        return trial.suggest_float(param.key, param.low, param.high, log=param.log)
    if param.kind == "int":
        return trial.suggest_int(param.key, int(param.low), int(param.high), log=param.log)
    return trial.suggest_categorical(param.key, list(param.choices))
