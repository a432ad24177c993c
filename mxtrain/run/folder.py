"""A run folder: its paths and run.json (:class:`RunFolder`), its creation (staged under a
hidden name, then published), run names, and the metrics log (``metrics.jsonl``). The names
of the files in it: :mod:`mxtrain.run.layout`.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mxtrain.config.names import run_name_problem
from mxtrain.crashpoints import crash_point
from mxtrain.errors import ConfigError, RunFolderError
from mxtrain.run.atomic import abandoned, atomic_write_text
from mxtrain.run.layout import (
    BEST_FILE,
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    INT8_DIR,
    LOG_FILE,
    METRICS_FILE,
    MODEL_INPUTS_FILE,
    MONITOR_FILE,
    PROFILE_DIR,
    PROFILE_SUMMARY_FILE,
    PROFILE_TRACE_FILE,
    RUN_FILE,
    VOCAB_FILE,
    params_file_name,
    replaced_folder_name,
    staging_folder_name,
    staging_folder_pid,
)
from mxtrain.user_files import UnusableFile, entry_problem, read_file, read_regular


@dataclass(frozen=True)
class RunFolder:
    """Paths inside one run folder."""

    path: Path
    replaced: Path | None = None  # where a run replaced with --force waits until we finish

    @property
    def config_file(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def run_file(self) -> Path:
        return self.path / RUN_FILE

    @property
    def vocab_file(self) -> Path:
        return self.path / VOCAB_FILE

    @property
    def model_inputs_file(self) -> Path:
        return self.path / MODEL_INPUTS_FILE

    @property
    def metrics_file(self) -> Path:
        return self.path / METRICS_FILE

    @property
    def log_file(self) -> Path:
        return self.path / LOG_FILE

    @property
    def checkpoints_dir(self) -> Path:
        return self.path / CHECKPOINTS_DIR

    @property
    def best_file(self) -> Path:
        """``checkpoints/best``: the tag of the best checkpoint, when one is recorded."""
        return self.checkpoints_dir / BEST_FILE

    @property
    def profile_dir(self) -> Path:
        return self.path / PROFILE_DIR

    @property
    def profile_trace_file(self) -> Path:
        return self.profile_dir / PROFILE_TRACE_FILE

    @property
    def monitor_file(self) -> Path:
        return self.path / MONITOR_FILE

    def int8_calibration_file(self, checkpoint: str) -> Path:
        """``int8/<checkpoint>.json``: the value ranges ``--int8`` measured for a checkpoint."""
        return self.path / INT8_DIR / f"{checkpoint}.json"

    def write_profile_summary(self, text: str) -> Path:
        """Write fit.profile's per-operator summary table and return its path."""
        path = self.profile_dir / PROFILE_SUMMARY_FILE
        atomic_write_text(path, text)
        return path

    def append_monitor_records(self, records: list[dict[str, Any]]) -> None:
        """Append fit.monitor's statistics to monitor.jsonl, one JSON object per line."""
        with self.monitor_file.open("a", encoding="utf-8") as handle:
            for record in records:
                handle.write(json.dumps(record, allow_nan=True) + "\n")

    def config_before_resume(self, stamp: int) -> Path:
        """``config.before-resume-<stamp>.yaml``: the config a resume replaced."""
        return self.path / f"config.before-resume-{stamp}.yaml"

    def symbol_file(self, prefix: str) -> Path:
        return self.path / f"{prefix}-symbol.json"

    def params_file(self, prefix: str, epoch: int) -> Path:
        return self.path / params_file_name(prefix, epoch)

    def check_entries(self) -> None:
        """RunFolderError naming the first entry of the layout that exists with the wrong type
        (``checkpoints`` a file, ``train.log`` a folder, ``run.json`` a named pipe, ...), so
        that resume, score, predict and export refuse the folder before they read or change
        anything in it."""
        entries = [(self.checkpoints_dir, True)]
        entries += [
            (path, False)
            for path in (
                self.config_file,
                self.run_file,
                self.vocab_file,
                self.model_inputs_file,
                self.metrics_file,
                self.log_file,
                self.best_file,
            )
        ]
        for path, folder in entries:
            problem = entry_problem(path, folder=folder)
            if problem is not None:
                raise RunFolderError(
                    f"The run folder {self.path} cannot be used: {path} {problem}; mxtrain "
                    f"writes it as a {'folder' if folder else 'regular file'}.",
                    hint=f"Move {path} out of the way if it is not needed, or restore the "
                    "run folder from a copy; nothing in it was changed.",
                )

    def read_status(self) -> dict[str, Any]:
        """The contents of run.json, or an empty dict if it is missing or unreadable."""
        try:
            data = json.loads(read_regular(self.run_file))
        except (UnusableFile, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def config_dir(self) -> Path:
        """The folder of the config the run was started from (``config_dir`` in run.json, the
        run folder's parent when none is recorded): relative paths in config.yaml resolve
        against it."""
        recorded = self.read_status().get("config_dir")
        return Path(recorded) if isinstance(recorded, str) else self.path.absolute().parent

    def write_status(self, **fields: Any) -> None:
        """Merge ``fields`` into run.json (atomically)."""
        status = self.read_status()
        status.update(fields)
        atomic_write_text(self.run_file, json.dumps(status, indent=2, sort_keys=True) + "\n")


def check_name_option(name: str | None) -> None:
    """Refuse an impossible ``--name`` (ConfigError, exit 2) before anything is read or written."""
    problem = run_name_problem(name) if name is not None else None
    if problem is not None:
        raise ConfigError(f"--name {name!r}: the run name {problem}", hint="Pick a plain name.")


def _check_new_run(runs_dir: Path, name: str, *, force: bool) -> Path:
    problem = run_name_problem(name)
    if problem is not None:
        raise RunFolderError(
            f"the run name {name!r} cannot be used as a run folder name: it {problem}",
            hint="Set experiment.name (or --name) to a plain name such as 'ptb_lstm'.",
        )
    path = runs_dir / name
    if path.exists():
        if not force:
            raise RunFolderError(
                f"the run folder {path} already exists; mxtrain never overwrites a run.",
                hint="Pass --name NEW_NAME to start a separate run, or --force to delete "
                "the existing folder and start again.",
            )
        if not path.is_dir():
            raise RunFolderError(f"{path} exists and is not a folder; remove it or pick --name.")
    return path


def stage_run_folder(runs_dir: Path, name: str, *, force: bool) -> RunFolder:
    """A hidden folder (``.<name>.staging-<pid>``) where a new run's first files are written
    before :func:`publish_run_folder` renames it into place, so that a run folder never
    exists without its config. Staging folders of killed processes are removed here."""
    _check_new_run(runs_dir, name, force=force)
    try:
        runs_dir.mkdir(parents=True, exist_ok=True)
        for entry in list(runs_dir.iterdir()):
            pid = staging_folder_pid(name, entry.name)
            if pid is not None and abandoned(pid):
                shutil.rmtree(entry, ignore_errors=True)
        staging = runs_dir / staging_folder_name(name, os.getpid())
        staging.mkdir()
    except OSError as exc:
        raise RunFolderError(
            f"cannot create the run folder {runs_dir / name}: {exc.strerror}.",
            hint="Check that experiment.runs_dir points at a writable location.",
        ) from exc
    return RunFolder(staging)


def publish_run_folder(staged: RunFolder, runs_dir: Path, name: str, *, force: bool) -> RunFolder:
    """Rename a staged run folder to ``runs_dir/name``.

    An existing folder is an error unless ``force`` is true. Even then it is not deleted
    yet: it is moved aside (``.<name>.replaced-<time>``) and only removed by
    :func:`finish_replacement` once the new run has finished, so a failed new run never
    costs the old one.
    """
    crash_point("run-folder.staged", run=name)
    path = _check_new_run(runs_dir, name, force=force)
    replaced = None
    if path.exists():
        replaced = runs_dir / replaced_folder_name(name, time.strftime("%Y%m%d-%H%M%S"))
        path.rename(replaced)
    try:
        staged.path.rename(path)
    except OSError as exc:
        if replaced is not None:
            replaced.rename(path)  # put the old run back: nothing is lost on failure
        raise RunFolderError(
            f"cannot create the run folder {path}: {exc.strerror}.",
            hint="Check that experiment.runs_dir points at a writable location.",
        ) from exc
    crash_point("run-folder.published", run=name)
    return RunFolder(path, replaced)


def create_run_folder(runs_dir: Path, name: str, *, force: bool) -> RunFolder:
    """Create ``runs_dir/name`` (empty) for a new run; see :func:`publish_run_folder`."""
    return publish_run_folder(
        stage_run_folder(runs_dir, name, force=force), runs_dir, name, force=force
    )


def finish_replacement(run: RunFolder, *, succeeded: bool) -> str | None:
    """Delete the run that ``--force`` replaced if the new one succeeded.

    Returns a message for the log when the old run is kept (the new one failed).
    """
    if run.replaced is None or not run.replaced.exists():
        return None
    if succeeded:
        shutil.rmtree(run.replaced, ignore_errors=True)
        return None
    return f"the run this one was replacing is kept at {run.replaced}"


class MetricsLog:
    """Appends one JSON object per line to metrics.jsonl, flushed after each record."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._handle = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def write(self, record: Mapping[str, Any]) -> None:
        """Append ``record`` with a wall-clock timestamp."""
        line = json.dumps({"time": round(time.time(), 3), **record}, allow_nan=True)
        self._handle.write(line + "\n")
        self._handle.flush()
        crash_point(
            "metrics.appended",
            event=record.get("event"),
            epoch=record.get("epoch"),
            batch=record.get("batch"),
        )

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl file (a torn last line from a crash is skipped).

    A file that cannot be read, or a complete line that is not UTF-8 (mxtrain writes ASCII),
    is a RunFolderError: resume rewrites the file from what is read here, so nothing may be
    skipped silently but a torn last line.
    """
    data = read_file(path, "metrics file", error=RunFolderError)
    records = []
    lines = data.split(b"\n")
    for number, line in enumerate(lines, start=1):
        try:
            records.append(json.loads(line.decode("utf-8")))
        except UnicodeDecodeError as exc:
            if number == len(lines):  # torn by a crash mid-write
                continue
            raise RunFolderError(
                f"{path}:{number}: not UTF-8 text (the byte {line[exc.start : exc.start + 1]!r}); "
                "mxtrain writes its metrics as ASCII JSON lines.",
                hint=f"Restore {path} from a copy, or delete line {number}.",
            ) from None
        except ValueError:
            continue
    return records
