"""``mxtrain sweep``: many runs of one config, one per point of a grid, in one sweep folder.

Each point is an ordinary run (``mxtrain fit CONFIG --set KEY=VALUE ... --name POINT``, a
child process) whose run folder sits in the sweep folder, so ``mxtrain runs SWEEP`` lists
them and every other command reads them. ``sweep.json`` keeps what the sweep is and how each
point ended; ``summary.md`` and ``summary.csv`` are rewritten after every point. Running the
same command again continues the sweep: finished and failed points are kept, an interrupted
point is resumed from its checkpoint (bit-identically), the rest start. A failing point is
recorded (its exit code and the log's last line) and the sweep goes on. SIGTERM or SIGINT
stops the running points at their next batch (they save a checkpoint) and ends the sweep
with exit code 75.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from mxtrain.config import Config, load_config
from mxtrain.devices import usable_cores
from mxtrain.errors import ConfigError, ExitCode, PreemptedError, RunFolderError
from mxtrain.run.atomic import atomic_write_text
from mxtrain.run.history import summarize_run
from mxtrain.signals import StopRequests
from mxtrain.sweep_plan import Axis, SearchParam, plan_points, point_name

log = logging.getLogger("mxtrain")

SWEEP_FILE = "sweep.json"
LOG_FOLDER = "logs"
#: how often the sweep looks at its running points, seconds
POLL_SECONDS = 0.2


@dataclass
class SweepPoint:
    name: str
    overrides: list[tuple[str, str]]
    status: str = "pending"  # pending, running, finished, failed, interrupted, pruned
    exit_code: int | None = None
    error: str | None = None
    trial: int | None = None  # the Optuna trial's number (search sweeps)
    reported: int = 0  # epochs whose eval value the search has been told
    pruning: bool = False  # the search asked this point to stop


class Driver(Protocol):
    """What decides a sweep's points: the grid's list, or a search that samples them."""

    def next_point(self) -> SweepPoint | None: ...
    def observe(self, point: SweepPoint) -> bool: ...  # True: stop (prune) the point
    def finished(self, point: SweepPoint) -> None: ...


@dataclass
class Sweep:
    """A sweep's definition and its points' states, as ``sweep.json`` keeps them."""

    folder: Path
    config: str
    overrides: list[str]
    axes: list[Axis]
    sample: int | None
    seed: int
    points: list[SweepPoint] = field(default_factory=list)
    search: list[SearchParam] = field(default_factory=list)
    trials: int | None = None
    metric: str | None = None  # what a search optimizes

    def identity(self) -> dict[str, Any]:
        """What makes two sweeps the same sweep."""
        return {
            "config": self.config,
            "overrides": list(self.overrides),
            "axes": [{"key": a.key, "values": list(a.values)} for a in self.axes],
            "sample": self.sample,
            "seed": self.seed,
            "search": [f"{p.key}={p.describe()}" for p in self.search],
            "trials": self.trials,
            "metric": self.metric,
        }

    def save(self) -> None:
        state = {
            **self.identity(),
            "points": [
                {"name": p.name, "overrides": [list(o) for o in p.overrides], "status": p.status,
                 "exit_code": p.exit_code, "error": p.error, "trial": p.trial,
                 "reported": p.reported}
                for p in self.points
            ],
        }  # fmt: skip
        atomic_write_text(self.folder / SWEEP_FILE, json.dumps(state, indent=1) + "\n")


def sweep_folder(base: Config, name: str | None, runs_dir: Path | None) -> Path:
    """The sweep folder: ``--runs-dir`` (else experiment.runs_dir) / ``--name`` (else
    ``EXPERIMENT-sweep``)."""
    return (runs_dir or Path(base.experiment.runs_dir)) / (name or f"{base.experiment.name}-sweep")


def is_continued(folder: Path) -> bool:
    """True when ``folder`` holds a sweep (the same command continues it); a folder with
    something else in it is refused, nothing changed."""
    if (folder / SWEEP_FILE).exists():
        return True
    if folder.exists() and any(folder.iterdir()):
        raise RunFolderError(
            f"{folder} exists and is not a sweep folder (it has no {SWEEP_FILE}); nothing was "
            "changed.",
            hint="Choose another --name or --runs-dir.",
        )
    return False


def prepare_sweep(
    config_file: str,
    overrides: Sequence[str],
    axes: Sequence[Axis],
    *,
    sample: int | None,
    seed: int,
    name: str | None,
    runs_dir: Path | None,
) -> Sweep:
    """The sweep to run: a new one, checked point by point before anything starts, or the
    one already in the sweep folder when the arguments are the same."""
    base = load_config(config_file, overrides)
    folder = sweep_folder(base, name, runs_dir)
    sweep = Sweep(
        folder, str(Path(config_file).absolute()), list(overrides), list(axes), sample, seed
    )
    plan = plan_points(axes, sample=sample, seed=seed)
    if is_continued(folder):
        return continued_sweep(sweep)
    for index, point in enumerate(plan, start=1):
        sets = [f"{key}={value}" for key, value in point]
        load_config(config_file, [*overrides, *sets])  # a bad value stops here, at its --set
        sweep.points.append(SweepPoint(point_name(index, point), list(point)))
    folder.mkdir(parents=True, exist_ok=True)
    sweep.save()
    return sweep


def continued_sweep(sweep: Sweep) -> Sweep:
    """``sweep`` with the points' states of the same sweep already in its folder, or an
    error when that folder holds another sweep."""
    path = sweep.folder / SWEEP_FILE
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
        points = [
            SweepPoint(p["name"], [tuple(o) for o in p["overrides"]], p["status"],
                       p.get("exit_code"), p.get("error"), p.get("trial"), p.get("reported", 0))
            for p in saved["points"]
        ]  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RunFolderError(
            f"{path} cannot be read ({exc}); the sweep cannot continue.",
            hint="Start the sweep under another --name.",
        ) from None
    mine = sweep.identity()
    differs = [k for k in mine if saved.get(k) != mine[k]]
    if differs:
        raise ConfigError(
            f"{sweep.folder} holds another sweep: its {', '.join(differs)} differ from this "
            "command's; nothing was changed.",
            hint="Run the same command to continue it, or choose another --name.",
        )
    sweep.points = points
    log.info("continuing the sweep in %s", sweep.folder)
    return sweep


class GridDriver:
    """The grid's points in order, those not yet finished or failed."""

    def __init__(self, sweep: Sweep) -> None:
        self.waiting = [p for p in sweep.points if p.status not in ("finished", "failed")]

    def next_point(self) -> SweepPoint | None:
        return self.waiting.pop(0) if self.waiting else None

    def observe(self, point: SweepPoint) -> bool:
        return False

    def finished(self, point: SweepPoint) -> None:
        pass


def run_sweep(sweep: Sweep, *, parallel: int, driver: Driver | None = None) -> Sweep:
    """Run the sweep's unfinished points, ``parallel`` at a time, each with the OpenMP
    threads :class:`ThreadShare` gives it; ``driver`` chooses them (default: the grid).
    Raises PreemptedError on SIGTERM/SIGINT."""
    driver = driver or GridDriver(sweep)
    threads = ThreadShare(parallel)
    running: dict[str, tuple[SweepPoint, subprocess.Popen[bytes]]] = {}
    stopping = "stopping every running point at a checkpoint"
    with StopRequests(action=stopping) as stop:
        try:
            while not stop.requested():
                while len(running) < parallel and not stop.requested():
                    point = driver.next_point()
                    if point is None:
                        break
                    running[point.name] = (point, _start(sweep, point, threads))
                    point.status = "running"
                    sweep.save()
                if not running:
                    break
                time.sleep(POLL_SECONDS)
                for name, (point, child) in list(running.items()):
                    if not point.pruning and driver.observe(point):
                        point.pruning = True
                        child.send_signal(signal.SIGTERM)  # it saves a checkpoint, exits 75
                    if child.poll() is not None:
                        del running[name]
                        _finished(sweep, point, child.returncode, driver)
        finally:
            for _point, child in running.values():
                if child.poll() is None:
                    child.send_signal(signal.SIGTERM)  # it saves a checkpoint, then exits 75
            for point, child in running.values():
                _finished(sweep, point, child.wait(), driver)
            write_summary(sweep)
    if stop.requested():
        raise PreemptedError(
            f"the sweep stopped on request; {sweep.folder} keeps every point's state.",
            hint="Run the same command again to continue it.",
        )
    return sweep


class ThreadShare:
    """The OpenMP threads of the points a sweep runs ``parallel`` at a time.

    Where the threads are left to ``auto``, each point gets an equal share of the cores this
    process may use (its CPU affinity: ``taskset`` counts). A count the user fixed (the
    config, ``--set``, a grid axis, or an exported OMP_NUM_THREADS, which ``auto`` keeps)
    is kept, as everywhere in mxtrain, with a warning when the points would then run more
    threads than there are cores: OpenMP teams that share cores wait for each other's
    descheduled members, which slows every point far more than the extra threads gain.
    """

    def __init__(self, parallel: int) -> None:
        self.parallel = parallel
        self.cores = usable_cores()
        self.share = max(1, self.cores // parallel)
        self.warned: set[int] = set()

    def set_for(self, config: str, sets: list[str]) -> list[str]:
        """The ``--set`` a point's ``mxtrain fit`` (``config`` with ``sets``) needs for its
        threads (none when fixed)."""
        fixed = load_config(config, sets).context.omp_threads
        where = "context.omp_threads"
        if fixed == "auto":
            exported = os.environ.get("OMP_NUM_THREADS", "").strip()
            if not exported.isdigit():
                return [f"context.omp_threads={self.share}"]
            fixed, where = int(exported), "OMP_NUM_THREADS in the environment"
        if int(fixed) * self.parallel > self.cores and int(fixed) not in self.warned:
            self.warned.add(int(fixed))
            log.warning(
                "sweep: %s is %d, so %d points at a time run %d OpenMP threads on %d usable "
                "cores; teams that share cores wait for each other, which can slow every point "
                "many times over. Leave context.omp_threads at auto (unset OMP_NUM_THREADS) to "
                "give each point %d, or lower --parallel.",
                where, int(fixed), self.parallel, int(fixed) * self.parallel, self.cores,
                self.share,
            )  # fmt: skip
        return []


def _start(sweep: Sweep, point: SweepPoint, threads: ThreadShare) -> subprocess.Popen[bytes]:
    run = sweep.folder / point.name
    command = [sys.executable, "-m", "mxtrain"]
    checkpoints = run / "checkpoints"
    resumable = checkpoints.is_dir() and any(checkpoints.iterdir())
    if resumable and point.status in ("interrupted", "running"):
        command += ["resume", str(run), "--progress", "plain"]
        log.info("sweep: resuming %s", point.name)
    else:
        sets = [*sweep.overrides, *(f"{k}={v}" for k, v in point.overrides)]
        sets += [f"experiment.runs_dir={sweep.folder}", *threads.set_for(sweep.config, sets)]
        command += ["fit", sweep.config, "--name", point.name, "--progress", "plain", "--force"]
        for value in sets:
            command += ["--set", value]
        log.info("sweep: starting %s", point.name)
    logs = sweep.folder / LOG_FOLDER
    logs.mkdir(exist_ok=True)
    with (logs / f"{point.name}.log").open("ab") as out:
        # a new process group: a terminal's Ctrl-C reaches the sweep, which stops the points
        return subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip


def _finished(sweep: Sweep, point: SweepPoint, code: int, driver: Driver) -> None:
    point.exit_code = code
    if code == 0:
        point.status, point.error = "finished", None
    elif code == ExitCode.PREEMPTED and point.pruning:
        point.status, point.error = "pruned", None
    elif code == ExitCode.PREEMPTED:
        point.status, point.error = "interrupted", None
    else:
        point.status = "failed"
        point.error = _last_line(sweep.folder / LOG_FOLDER / f"{point.name}.log")
    driver.finished(point)
    log.info("sweep: %s %s (exit code %d)", point.name, point.status, code)
    sweep.save()
    write_summary(sweep)


def _last_line(path: Path) -> str | None:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return None
    return lines[-1][:500] if lines else None


def summary_rows(sweep: Sweep) -> list[dict[str, Any]]:
    """One row per point: its name, status, axis values, best metric, epoch and minutes."""
    rows = []
    for point in sweep.points:
        row: dict[str, Any] = {"point": point.name, "status": point.status}
        row.update({key: value for key, value in point.overrides})
        run = sweep.folder / point.name
        best = summarize_run(run) if (run / "run.json").exists() else None
        value = best.best if best is not None else None
        row["metric"] = value.metric if value else ""
        row["best"] = f"{value.value:.6g}" if value else ""
        row["epoch"] = value.epoch if value else ""
        minutes = best.duration_s / 60 if best is not None and best.duration_s else None
        row["minutes"] = f"{minutes:.1f}" if minutes is not None else ""
        row["error"] = point.error or ""
        rows.append(row)
    return rows


def write_summary(sweep: Sweep) -> None:
    """``summary.md`` and ``summary.csv`` of the sweep folder, from its points' run folders."""
    rows = summary_rows(sweep)
    keys = [a.key for a in sweep.axes] or [p.key for p in sweep.search]
    columns = ["point", "status", *keys, "metric", "best", "epoch"]
    columns += ["minutes", "error"]
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(sweep.folder / "summary.csv", text.getvalue())
    lines = [
        f"# Sweep {sweep.folder.name}",
        "",
        f"`{sweep.config}` with "
        + (" ".join(f"`--set {o}`" for o in sweep.overrides) or "its values"),
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
    ]
    for row in rows:
        cells = [str(row.get(c, "")).replace("|", "\\|") for c in columns]
        lines.append("| " + " | ".join(cells) + " |")
    atomic_write_text(sweep.folder / "summary.md", "\n".join(lines) + "\n")
