"""Where everything in a run folder lives: every file and folder name, in one place.

Layout (``runs/<experiment>/``)::

    config.yaml              the resolved configuration (every default filled in)
    config.before-resume-T.yaml  the previous config, when ``resume`` changed it
    plugins/                 copies of the file.py plugins it uses, and plugins.json
    run.json                 status (running/finished/failed/preempted), times, versions
    vocab.json               the training vocabulary (or an iterator's input facts)
    model_inputs.json        what the model was built from (data_info, input names and shapes)
    <prefix>-symbol.json     the model symbol (default bucket), loadable by mx.mod.Module.load
    <prefix>-0001.params     parameters after epoch 1, MXNet's standard naming
    metrics.jsonl            one JSON object per logged interval and per epoch
    train.log                the full log (debug level)
    checkpoints/
      e0001-b000000/         end of epoch 1 (eEEEE-bBBBBBB: epochs done, batches of the next)
        params.nd optimizer.nd optimizer.json state.json manifest.json
      best                   the tag of the best checkpoint (checkpoint.best_metric)
      damaged-e0002-b000000-1/  a damaged checkpoint, set aside (never deleted by mxtrain)

Files being written carry ``.<name>.tmp-<pid>`` (:mod:`mxtrain.run.atomic`); checkpoint work
folders ``.tmp-``/``.old-``/``.del-<tag>-<pid>`` (:mod:`mxtrain.run.checkpoint`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mxtrain.errors import RunFolderError
from mxtrain.run.atomic import atomic_write_text
from mxtrain.user_files import UnusableFile, entry_problem, read_regular

CONFIG_FILE = "config.yaml"
RUN_FILE = "run.json"
VOCAB_FILE = "vocab.json"
MODEL_INPUTS_FILE = "model_inputs.json"  # data_info and input shapes: export rebuilds from it
METRICS_FILE = "metrics.jsonl"
LOG_FILE = "train.log"
PLUGINS_DIR = "plugins"
PLUGINS_MANIFEST = "plugins.json"
PROFILE_DIR = "profile"  # fit.profile's traces
MONITOR_FILE = "monitor.jsonl"  # fit.monitor's statistics
CHECKPOINTS_DIR = "checkpoints"
PARAMS_FILE = "params.nd"
OPTIMIZER_ARRAYS_FILE = "optimizer.nd"
OPTIMIZER_META_FILE = "optimizer.json"
STATE_FILE = "state.json"
MANIFEST_FILE = "manifest.json"
BEST_FILE = "best"  # checkpoints/best: the tag of the best checkpoint (checkpoint.best_metric)
DATA_FILES = (PARAMS_FILE, OPTIMIZER_ARRAYS_FILE, OPTIMIZER_META_FILE, STATE_FILE)

_TAG = re.compile(r"e(\d{4,})-b(\d{6,})")
#: checkpoint work folders: .tmp-<tag>-<pid> (being written), .old-<tag>-<pid> (being
#: replaced), .del-<tag>-<pid> (being removed); groups: kind, tag, pid
WORK_FOLDER = re.compile(r"\.(tmp|old|del)-(e\d{4,}-b\d{6,})-(\d+)")


def damaged_folder_name(tag: str, number: int) -> str:
    """``damaged-<tag>-<n>``: a damaged checkpoint set aside by resume (which skipped it), by a
    save over its tag or by retention.

    Neither a tag nor a work folder, so nothing lists, chooses, tidies or prunes it."""
    return f"damaged-{tag}-{number}"


def work_folder_name(kind: str, tag: str, pid: int) -> str:
    """``.tmp-<tag>-<pid>`` and its ``old``/``del`` kin (see :data:`WORK_FOLDER`)."""
    return f".{kind}-{tag}-{pid}"


def params_file_name(prefix: str, epoch: int) -> str:
    """``<prefix>-0003.params``: the parameters after epoch 3, as MXNet's Module names them."""
    return f"{prefix}-{epoch:04d}.params"


def params_file_epoch(prefix: str, name: str) -> int | None:
    """The epoch of a ``<prefix>-NNNN.params`` file name, or None when it is not one."""
    match = re.fullmatch(re.escape(prefix) + r"-(\d{4,})\.params", name)
    return int(match.group(1)) if match else None


def staging_folder_name(name: str, pid: int) -> str:
    """``.<name>.staging-<pid>``: where a new run's first files wait, beside ``runs_dir/name``."""
    return f".{name}.staging-{pid}"


def staging_folder_pid(name: str, folder: str) -> int | None:
    """The PID in a staging folder name of run ``name``, or None when it is not one."""
    match = re.fullmatch(rf"\.{re.escape(name)}\.staging-(\d+)", folder)
    return int(match[1]) if match else None


def replaced_folder_name(name: str, stamp: str) -> str:
    """``.<name>.replaced-<stamp>``: a run replaced with --force, kept until the new one ends."""
    return f".{name}.replaced-{stamp}"


def checkpoint_tag(epoch: int, batch: int) -> str:
    """``e0003-b000000`` for the end of epoch 3, ``e0003-b000120`` 120 batches later."""
    if epoch < 0 or batch < 0:
        raise ValueError(f"checkpoint position must not be negative: epoch {epoch}, batch {batch}")
    return f"e{epoch:04d}-b{batch:06d}"


def parse_tag(name: str) -> tuple[int, int] | None:
    """(epoch, batch) of a checkpoint folder name, or None when it is not one."""
    match = _TAG.fullmatch(name)
    if match is None:
        return None
    epoch, batch = int(match[1]), int(match[2])
    # only the canonical spelling: two names for one position would be ambiguous
    return (epoch, batch) if checkpoint_tag(epoch, batch) == name else None


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
    def plugins_dir(self) -> Path:
        return self.path / PLUGINS_DIR

    @property
    def profile_dir(self) -> Path:
        return self.path / PROFILE_DIR

    @property
    def monitor_file(self) -> Path:
        return self.path / MONITOR_FILE

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
