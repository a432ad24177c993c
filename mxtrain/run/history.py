"""Reading finished, failed and running experiments back from their run folders.

The library behind ``mxtrain runs``, ``show``, ``diff`` and ``plot``. Everything here only
reads: a run folder is never changed, and a folder that cannot be read (a corrupt
``run.json``, a missing config) is reported as such instead of stopping the listing.
MXNet is not imported.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mxtrain.config import config_to_dict, load_config
from mxtrain.config.resume_policy import ConfigChange, diff_configs, value_at
from mxtrain.config.saved import read_config_tree
from mxtrain.config.schema import metric_of_set
from mxtrain.errors import ConfigError, RunFolderError
from mxtrain.metric_tracker import MetricTracker, lower_is_better
from mxtrain.run.checkpoint import (
    CheckpointError,
    best_tag,
    find_checkpoint,
    list_checkpoints,
    verify_checkpoint,
)
from mxtrain.run.folder import RunFolder, read_metrics
from mxtrain.run.layout import CONFIG_FILE, METRICS_FILE, RUN_FILE
from mxtrain.user_files import UnusableFile, read_regular, require_usable_path

UNREADABLE = "unreadable"
SPARK_BLOCKS = "▁▂▃▄▅▆▇█"


@dataclass(frozen=True)
class EpochRow:
    """One ``epoch`` record of metrics.jsonl."""

    epoch: int
    train: dict[str, float]
    eval: dict[str, float] | None
    lr: float | None
    seconds: float | None
    checkpoint: str | None
    best: bool
    partial: bool


@dataclass(frozen=True)
class CheckpointInfo:
    """One folder under ``checkpoints/``; ``latest`` and ``problem`` come from verifying."""

    tag: str
    epoch: int
    batch: int
    size_bytes: int
    best: bool
    latest: bool = False  # the newest valid one: what score and predict load by default
    problem: str | None = None  # why it is not usable (None: valid or not checked)


@dataclass(frozen=True)
class BestValue:
    """The best value of a metric over a run's epochs."""

    metric: str
    split: str  # "eval" or "train"
    value: float
    epoch: int
    checkpoint: str | None = None  # the tag saved with that epoch's value, if one was saved


@dataclass
class RunSummary:
    """One row of ``mxtrain runs``."""

    name: str
    path: Path
    status: str  # running/finished/failed/preempted/interrupted, or "unreadable"
    problem: str | None = None  # why the folder could not be read
    epochs_done: int = 0
    num_epoch: int | None = None
    best: BestValue | None = None
    started: float | None = None
    duration_s: float | None = None
    stop_reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": str(self.path),
            "status": self.status,
            "problem": self.problem,
            "epochs_done": self.epochs_done,
            "num_epoch": self.num_epoch,
            "best": None if self.best is None else self.best.__dict__,
            "started": self.started,
            "duration_s": self.duration_s,
            "stop_reason": self.stop_reason,
        }


@dataclass
class RunDetails:
    """Everything ``mxtrain show`` prints about one run."""

    summary: RunSummary
    status: dict[str, Any]  # run.json as saved ({} when unreadable)
    config: dict[str, Any] | None  # config.yaml as plain data (None when unreadable)
    config_problem: str | None
    epochs: list[EpochRow]
    checkpoints: list[CheckpointInfo]
    main_metric: str | None
    main_split: str | None
    records: list[dict[str, Any]] = field(repr=False, default_factory=list)


# ----------------------------------------------------------------------------- finding runs


def is_run_folder(path: Path) -> bool:
    """True for a folder that ``mxtrain fit`` made (it has run.json or config.yaml)."""
    return path.is_dir() and ((path / RUN_FILE).exists() or (path / CONFIG_FILE).exists())


def resolve_run(argument: str, runs_dir: Path = Path("runs")) -> Path:
    """The run folder a command-line RUN names: a path, or a run's name under ``runs_dir``."""
    path = Path(argument)
    require_usable_path(path, "run folder", error=RunFolderError)
    if is_run_folder(path):
        return path
    by_name = runs_dir / argument
    if not path.exists() and is_run_folder(by_name):
        return by_name
    if path.is_dir():
        raise RunFolderError(
            f"{path} is not a run folder: it has no {RUN_FILE} or {CONFIG_FILE}.",
            hint="Give a folder `mxtrain fit` created, e.g. runs/ptb_lstm; "
            "`mxtrain runs DIR` lists the runs in DIR.",
        )
    raise RunFolderError(
        f"run {argument} not found: neither {path} nor {by_name} is a run folder.",
        hint="Give a folder `mxtrain fit` created, e.g. runs/ptb_lstm; "
        "`mxtrain runs` lists the runs in ./runs.",
    )


def find_runs(folder: Path) -> list[RunSummary]:
    """A summary of every run folder directly under ``folder``, newest first.

    ``folder`` may also be a run folder itself. Hidden folders (runs set aside by
    ``fit --force``) are skipped; a folder whose files cannot be read is listed as
    ``unreadable`` with the reason.
    """
    require_usable_path(folder, "runs folder", error=RunFolderError)
    if not folder.is_dir():
        raise RunFolderError(
            f"{folder} does not exist or is not a folder, so there are no runs to list.",
            hint="Give the folder that holds your runs (experiment.runs_dir, default ./runs).",
        )
    if is_run_folder(folder) and (folder / RUN_FILE).exists():
        return [summarize_run(folder)]
    runs = [
        summarize_run(entry)
        for entry in sorted(folder.iterdir())
        if not entry.name.startswith(".") and is_run_folder(entry)
    ]

    def newest_first(run: RunSummary) -> tuple[float, str]:
        when = run.started if run.started is not None else _mtime(run.path)
        return (-when, run.name)

    return sorted(runs, key=newest_first)


def summarize_run(path: Path) -> RunSummary:
    """The ``mxtrain runs`` row of one run folder; never raises for a damaged folder."""
    return _read_run(path)[0]


def logged_best(path: Path) -> BestValue | None:
    """The best epoch value of the run folder ``path``'s main metric, as its metrics log
    records it (:func:`best_value`; the ``mxtrain runs`` column); never raises for a damaged
    folder."""
    records = _read_records(path, [])
    config, _ = _read_config(path)
    epochs = epoch_rows(records)
    return best_value(config, epochs)


def load_run(path: Path) -> RunDetails:
    """Config, checkpoints and per-epoch metrics of the run folder ``path``."""
    if not is_run_folder(path):
        raise RunFolderError(
            f"{path} is not a run folder: it has no {RUN_FILE} or {CONFIG_FILE}.",
            hint="Give a folder `mxtrain fit` created, e.g. runs/ptb_lstm.",
        )
    summary, status, config, config_problem, records = _read_run(path)
    epochs = epoch_rows(records)
    metric, split = main_metric(config, epochs)
    return RunDetails(
        summary=summary,
        status=status,
        config=config,
        config_problem=config_problem,
        epochs=epochs,
        checkpoints=list_checkpoint_info(path),
        main_metric=metric,
        main_split=split,
        records=records,
    )


def _read_run(
    path: Path,
) -> tuple[RunSummary, dict[str, Any], dict[str, Any] | None, str | None, list[dict[str, Any]]]:
    problems: list[str] = []
    status = _read_status(path, problems)
    config, config_problem = _read_config(path)
    if config_problem and not (path / RUN_FILE).exists():
        problems.append(config_problem)
    records = _read_records(path, problems)
    epochs = epoch_rows(records)
    summary = RunSummary(
        name=path.name,
        path=path,
        status=UNREADABLE if problems else str(status.get("status") or "unknown"),
        problem="; ".join(problems) or None,
        epochs_done=sum(1 for row in epochs if not row.partial),
        num_epoch=_number(value_at(config, "fit.num_epoch")),
        best=best_value(config, epochs),
        started=_number(status.get("started"), float),
        duration_s=_duration(status),
        stop_reason=status.get("stop_reason")
        if isinstance(status.get("stop_reason"), str)
        else None,
    )
    return summary, status, config, config_problem, records


def _read_status(path: Path, problems: list[str]) -> dict[str, Any]:
    run_file = path / RUN_FILE
    if not run_file.exists():
        problems.append(f"no {RUN_FILE}")
        return {}
    try:
        data = json.loads(read_regular(run_file))
    except UnusableFile as exc:
        problems.append(f"{RUN_FILE} {exc.problem}")
        return {}
    except ValueError as exc:
        problems.append(f"{RUN_FILE} is not valid JSON ({exc})")
        return {}
    if not isinstance(data, dict):
        problems.append(f"{RUN_FILE} does not hold a JSON object")
        return {}
    return data


def _read_records(path: Path, problems: list[str]) -> list[dict[str, Any]]:
    """The records of metrics.jsonl (none when it is missing or unreadable: ``problems``
    says why)."""
    if not (path / METRICS_FILE).exists():
        return []
    try:
        return read_metrics(path / METRICS_FILE)
    except RunFolderError as exc:
        problems.append(exc.message)
        return []


def _read_config(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    config_file = path / CONFIG_FILE
    if not config_file.exists():
        return None, f"no {CONFIG_FILE}"
    try:
        return read_config_tree(config_file), None
    except ConfigError as exc:
        return None, exc.message


def _duration(status: dict[str, Any]) -> float | None:
    """Wall-clock seconds from the start to the last stop (to now while running)."""
    started = _number(status.get("started"), float)
    if started is None:
        return None
    if status.get("status") == "running":
        return max(0.0, time.time() - started)
    ended = _number(status.get("ended"), float)
    if ended is None:
        return _number(status.get("duration_s"), float)
    return max(0.0, ended - started)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _number(value: Any, kind: type = int) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return kind(value)


# ----------------------------------------------------------------------------- metrics


def _metric_dict(value: Any) -> dict[str, float]:
    if not isinstance(value, dict):
        return {}
    return {str(k): float(v) for k, v in value.items() if _number(v, float) is not None}


def epoch_rows(records: Iterable[dict[str, Any]]) -> list[EpochRow]:
    """The ``epoch`` records of metrics.jsonl, in order (malformed ones skipped)."""
    rows = []
    for record in records:
        if record.get("event") != "epoch" or _number(record.get("epoch")) is None:
            continue
        evals = record.get("eval")
        checkpoint = record.get("checkpoint")
        rows.append(
            EpochRow(
                epoch=int(record["epoch"]),
                train=_metric_dict(record.get("train")),
                eval=_metric_dict(evals) if isinstance(evals, dict) else None,
                lr=_number(record.get("lr"), float),
                seconds=_number(record.get("seconds"), float),
                checkpoint=checkpoint if isinstance(checkpoint, str) else None,
                best=record.get("best") is True,
                partial=record.get("partial") is True,
            )
        )
    return rows


def main_metric(
    config: dict[str, Any] | None, epochs: Sequence[EpochRow]
) -> tuple[str | None, str | None]:
    """(metric, split) a run is judged by: ``checkpoint.best_metric``, else the first of
    ``fit.metrics``, else the first logged; on the eval data when the run has any."""
    has_eval = any(row.eval for row in epochs)
    split = "eval" if has_eval else "train"
    candidates = [value_at(config, "checkpoint.best_metric")]
    metrics = value_at(config, "fit.metrics")
    if isinstance(metrics, list):
        candidates += metrics
    for row in epochs:
        candidates += list((row.eval if has_eval else row.train) or {})
    for name in candidates:
        if isinstance(name, str) and any(name in _split(row, split) for row in epochs):
            return name, split
    if isinstance(metrics, list) and metrics and isinstance(metrics[0], str):
        return metrics[0], split  # nothing logged yet
    return None, None


def _split(row: EpochRow, split: str) -> dict[str, float]:
    return (row.eval if split == "eval" else row.train) or {}


def eval_set_names(config: dict[str, Any] | None) -> tuple[str, ...]:
    """The names of a saved config's eval sets (``data.eval`` as a mapping of sets), or ()."""
    evaluated = value_at(config, "data.eval")
    if (
        isinstance(evaluated, dict)
        and evaluated
        and all(isinstance(v, dict) for v in evaluated.values())
    ):
        return tuple(evaluated)
    return ()


def best_value(config: dict[str, Any] | None, epochs: Sequence[EpochRow]) -> BestValue | None:
    """The best epoch value of the run's main metric (see :func:`main_metric`)."""
    metric, split = main_metric(config, epochs)
    if metric is None or split is None:
        return None
    mode = value_at(config, "checkpoint.best_mode")
    _set, base = metric_of_set(metric, eval_set_names(config))
    tracker = MetricTracker(
        metric, lower_is_better(base, mode if isinstance(mode, str) else "auto")
    )
    best: BestValue | None = None
    for row in epochs:
        value = _split(row, split).get(metric)
        if value is not None and tracker.update(value, row.epoch):
            best = BestValue(metric, split, value, row.epoch, row.checkpoint)
    return best


def sparkline(values: Sequence[float | None]) -> str:
    """One block character per value, scaled between the smallest and largest; a missing
    or non-finite value is a space."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return " " * len(values)
    low, high = min(finite), max(finite)
    out = []
    for value in values:
        if value is None or not math.isfinite(value):
            out.append(" ")
        elif high == low:
            out.append(SPARK_BLOCKS[len(SPARK_BLOCKS) // 2])
        else:
            step = (value - low) / (high - low) * (len(SPARK_BLOCKS) - 1)
            out.append(SPARK_BLOCKS[round(step)])
    return "".join(out)


@dataclass(frozen=True)
class Curve:
    """One metric over training time: x in epochs (1.5 = half-way through epoch 2)."""

    split: str  # "train" or "eval"
    x: list[float]
    y: list[float]


def metric_curves(records: Sequence[dict[str, Any]], metric: str) -> list[Curve]:
    """Train and eval curves of ``metric`` from metrics.jsonl records.

    The train curve uses the per-interval records when there are any (finer), else the
    per-epoch values; the eval curve uses epoch ends plus mid-epoch ``eval`` records.
    """
    epoch_batches: dict[int, int] = {}
    for row in records:
        if row.get("event") == "epoch" and _number(row.get("batch")):
            epoch_batches[int(row["epoch"])] = int(row["batch"])

    def position(epoch: int, batch: int) -> float:
        batches = epoch_batches.get(epoch) or epoch_batches.get(epoch - 1)
        if not batches:
            seen = [
                int(r["batch"])
                for r in records
                if r.get("epoch") == epoch and _number(r.get("batch")) is not None
            ]
            batches = max(seen, default=0) or 1
        return epoch - 1 + min(batch / batches, 1.0)

    curves = []
    for split, events in (("train", ("interval",)), ("eval", ("eval",))):
        points: list[tuple[float, float]] = []
        for row in records:
            epoch, batch = _number(row.get("epoch")), _number(row.get("batch"))
            value = _metric_dict(row.get(split)).get(metric)
            if value is None or epoch is None:
                continue
            if row.get("event") in events and batch is not None:
                points.append((position(epoch, batch), value))
            elif row.get("event") == "epoch" and (split == "eval" or not _has(records, events)):
                points.append((float(epoch), value))
        if points:
            points.sort(key=lambda p: p[0])
            curves.append(Curve(split, [p[0] for p in points], [p[1] for p in points]))
    return curves


def _has(records: Sequence[dict[str, Any]], events: tuple[str, ...]) -> bool:
    return any(r.get("event") in events for r in records)


def logged_metrics(records: Sequence[dict[str, Any]]) -> list[str]:
    """Every metric name that appears in train or eval values, in first-seen order."""
    names: dict[str, None] = {}
    for row in records:
        for split in ("train", "eval"):
            names.update(dict.fromkeys(_metric_dict(row.get(split))))
    return list(names)


# ----------------------------------------------------------------------------- checkpoints


def list_checkpoint_info(path: Path) -> list[CheckpointInfo]:
    """The checkpoint folders of a run, oldest first, with their size, the best marker, the
    newest valid one (``latest``: chosen by the same function as score and resume) and why
    each newer one is not usable."""
    run = RunFolder(path)
    listed = list_checkpoints(run)
    latest = None
    problems: dict[str, str] = {}
    if listed:
        try:
            found, skipped = find_checkpoint(run)
            latest = found.tag
        except CheckpointError:  # none valid: every one is named with its reason below
            skipped = []
            for ckpt in listed:
                try:
                    verify_checkpoint(ckpt)
                except CheckpointError as exc:
                    skipped.append((ckpt, exc.reason))
        problems = {c.tag: reason for c, reason in skipped}
    best = best_tag(run)
    return [
        CheckpointInfo(
            c.tag,
            c.epoch,
            c.batch,
            _folder_size(c.path),
            c.tag == best,
            c.tag == latest,
            problems.get(c.tag),
        )
        for c in listed
    ]


def _folder_size(path: Path) -> int:
    total = 0
    for entry in path.rglob("*"):
        try:
            if entry.is_file() and not entry.is_symlink():
                total += entry.stat().st_size
        except OSError:
            continue
    return total


# ----------------------------------------------------------------------------- diff


def config_for_diff(
    target: str | Path, runs_dir: Path = Path("runs")
) -> tuple[str, dict[str, Any]]:
    """(label, resolved config as plain data) of a run folder or a config YAML file.

    A run's saved config.yaml is already resolved; a config file is loaded and checked
    so that its defaults are filled in the same way.
    """
    path = Path(target)
    require_usable_path(path, "run folder or config file", error=RunFolderError)
    if path.is_file():
        return str(path), config_to_dict(load_config(path))
    run = resolve_run(str(target), runs_dir)
    if not (run / CONFIG_FILE).is_file():
        raise RunFolderError(
            f"{run} has no {CONFIG_FILE}, so there is no config to compare.",
            hint="Compare complete run folders or config files.",
        )
    return str(run), read_config_tree(run / CONFIG_FILE)


def diff_runs(
    a: str | Path, b: str | Path, runs_dir: Path = Path("runs")
) -> tuple[str, str, list[ConfigChange]]:
    """Config differences between two runs or config files, as dotted keys."""
    label_a, config_a = config_for_diff(a, runs_dir)
    label_b, config_b = config_for_diff(b, runs_dir)
    return label_a, label_b, diff_configs(config_a, config_b)


# ----------------------------------------------------------------------------- formatting
