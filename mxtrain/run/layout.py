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
folders ``.tmp-``/``.old-``/``.del-<tag>-<pid>`` (:mod:`mxtrain.run.checkpoint`). The paths of
one run folder: :class:`mxtrain.run.folder.RunFolder`.
"""

from __future__ import annotations

import re

CONFIG_FILE = "config.yaml"
RUN_FILE = "run.json"
VOCAB_FILE = "vocab.json"
MODEL_INPUTS_FILE = "model_inputs.json"  # data_info and input shapes: export rebuilds from it
METRICS_FILE = "metrics.jsonl"
LOG_FILE = "train.log"
PLUGINS_DIR = "plugins"
PLUGINS_MANIFEST = "plugins.json"
PROFILE_DIR = "profile"  # fit.profile's traces
PROFILE_TRACE_FILE = "trace.json"  # in profile/: MXNet's trace (chrome://tracing, ui.perfetto.dev)
PROFILE_SUMMARY_FILE = "summary.txt"  # in profile/: MXNet's per-operator totals
MONITOR_FILE = "monitor.jsonl"  # fit.monitor's statistics
INT8_DIR = "int8"  # --int8's calibrated ranges, one file per checkpoint
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
