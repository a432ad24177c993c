"""Choosing a run's checkpoint: ``RUN[:selector]`` to a verified checkpoint.

Training (resume, warm start) and inference (score, predict, export) all choose checkpoints
here: :func:`parse_checkpoint_ref` splits a reference, :func:`open_run_folder` checks the
folder, :func:`resolve_checkpoint` picks, reads and verifies the checkpoint
(:func:`choose_checkpoint` does all three for a reference alone), and
:func:`recorded_buckets` / :func:`recorded_last_batch` say what a checkpoint recorded of its
training data.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mxtrain.config import load_config
from mxtrain.errors import ConfigError, DataError, RunFolderError
from mxtrain.run import checkpoint
from mxtrain.run.bucket_keys import BucketKeys, checkpoint_keys
from mxtrain.run.checkpoint import BEST, LATEST, LoadedCheckpoint
from mxtrain.run.folder import RunFolder
from mxtrain.run.history import logged_best
from mxtrain.run.layout import (
    CONFIG_FILE,
    PARAMS_FILE,
    checkpoint_tag,
    params_file_epoch,
    parse_tag,
)
from mxtrain.run.params import ParamsFileError, read_params
from mxtrain.run.plugin_files import kept_plugins
from mxtrain.user_files import require_usable_path

log = logging.getLogger("mxtrain")

EXAMPLE_RUN = "runs/ptb_lstm"  # the run folder messages give as an example


def parse_checkpoint_ref(ref: str | os.PathLike[str]) -> tuple[Path, int | str | None]:
    """Split ``RUN[:EPOCH|:best|:latest|:TAG]`` into the run folder and what to load.

    ``"runs/x"`` -> ``(Path("runs/x"), None)`` (the newest valid checkpoint);
    ``"runs/x:3"`` -> ``(Path("runs/x"), 3)`` (the end of epoch 3); ``"runs/x:best"``,
    ``"runs/x:latest"`` and ``"runs/x:e0002-b000020"`` keep the text after the colon. A path
    that exists as written is taken whole, even with a colon.
    """
    text = os.fspath(ref)
    if not text.strip():
        raise ConfigError(
            "The checkpoint reference is empty.",
            hint=f"Give a run folder such as {EXAMPLE_RUN}, or {EXAMPLE_RUN}:3 for epoch 3.",
        )
    require_usable_path(Path(text), "run folder", error=RunFolderError)
    head, sep, tail = text.rpartition(":")
    if not sep or not head or Path(text).exists():
        return Path(text), None
    if tail.isascii() and tail.isdigit():
        return Path(head), int(tail)
    if tail in (BEST, LATEST) or parse_tag(tail) is not None:
        return Path(head), tail
    raise ConfigError(
        f"The checkpoint reference {text!r} ends in {':' + tail!r}, which is not an epoch "
        "number, 'best', 'latest' or a checkpoint tag.",
        hint=f"Write RUN:EPOCH (e.g. {EXAMPLE_RUN}:3), RUN:best, RUN:latest or RUN:TAG (e.g. "
        f"{EXAMPLE_RUN}:e0002-b000020; `mxtrain show RUN` lists the tags), or leave it out for "
        "the newest valid checkpoint.",
    )


def checkpoint_epochs(run: RunFolder, prefix: str) -> list[int]:
    """Epochs that have a ``<prefix>-NNNN.params`` file in ``run``, ascending."""
    epochs = []
    for path in run.path.iterdir():
        epoch = params_file_epoch(prefix, path.name)
        if epoch is not None and path.is_file():
            epochs.append(epoch)
    return sorted(epochs)


def open_run_folder(path: Path) -> RunFolder:
    """The run folder at ``path``, or a RunFolderError saying what is missing."""
    if not path.exists():
        hint = "Pass the folder `mxtrain fit` created (runs/<experiment> by default)."
        parent = path.parent if str(path.parent) else Path(".")
        if parent.is_dir():
            runs = sorted(
                p.name for p in parent.iterdir() if p.is_dir() and (p / CONFIG_FILE).is_file()
            )
            if runs:
                shown = ", ".join(runs[:10]) + (", ..." if len(runs) > 10 else "")
                hint += f" Run folders in {parent}: {shown}."
        raise RunFolderError(f"The run folder {path} does not exist.", hint=hint)
    if not path.is_dir():
        raise RunFolderError(
            f"{path} is a file, not a run folder.",
            hint="Pass the folder `mxtrain fit` created (runs/<experiment> by default), "
            f"optionally with :EPOCH, e.g. {EXAMPLE_RUN}:3.",
        )
    run = RunFolder(path)
    run.check_entries()
    if not run.config_file.is_file():
        raise RunFolderError(
            f"The run folder {path} is incomplete: it has no {CONFIG_FILE}.",
            hint="Only folders written by `mxtrain fit` can be scored or used for predictions; "
            "a run that failed before it started training may have left a partial folder.",
        )
    return run


@dataclass(frozen=True)
class ChosenCheckpoint:
    """What :func:`resolve_checkpoint` picked: a verified checkpoint folder, or (run folders
    without ``checkpoints/``, or an epoch that has only its top-level file) an unverified
    ``<prefix>-NNNN.params``."""

    epoch: int  # epochs completed
    batch: int  # batches of the next epoch trained (0: an epoch end)
    tag: str | None  # None: a top-level params file
    params_file: Path
    loaded: LoadedCheckpoint | None = None  # parameters and bucket keys (verified ones)

    def describe(self) -> str:
        return self.tag if self.tag is not None else self.params_file.name

    def arrays(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(arg_params, aux_params): the verified ones already read, else the params file's
        (a DataError explains a file that cannot be read)."""
        if self.loaded is not None:
            return self.loaded.arg_params, self.loaded.aux_params
        return read_checkpoint_params(self.params_file)


def resolve_checkpoint(run: RunFolder, prefix: str, wanted: int | str | None) -> ChosenCheckpoint:
    """The checkpoint of ``run`` to load: the newest valid one (None or "latest"), the end of
    epoch N (an int), the recorded best ("best") or a tag, read and verified.

    The choice itself is :func:`mxtrain.run.checkpoint.find_and_load` (the one resume uses): a
    default choice skips unusable checkpoints with a warning; one named explicitly that is
    unusable is a CheckpointError (exit 3) naming the file. A run folder without checkpoints
    (or an epoch whose checkpoint folder was not kept) falls back to ``<prefix>-NNNN.params``,
    which has no checksum: a warning says so.
    """
    listed = {c.tag: c for c in checkpoint.list_checkpoints(run)}
    epochs = checkpoint_epochs(run, prefix)
    tag: str | None = None
    if isinstance(wanted, int):
        tag = checkpoint_tag(wanted, 0)
        if tag not in listed:
            if wanted not in epochs:
                raise _no_epoch(run, prefix, wanted, epochs)
            return _unverified(run, prefix, wanted)
    elif wanted == checkpoint.BEST and checkpoint.best_tag(run) is None:
        tag = _logged_best(run) or wanted
    elif wanted is not None:
        tag = wanted
    if not listed:
        if tag is not None and not isinstance(wanted, int):
            raise RunFolderError(
                f"The run folder {run.path} has no checkpoint folders "
                f"({run.checkpoints_dir} is missing or empty), so it has no "
                f"checkpoint {wanted!r}.",
                hint="Leave the selector out (or give RUN:EPOCH) to use its "
                f"{prefix}-NNNN.params files.",
            )
        if not epochs:
            raise RunFolderError(
                f"The run folder {run.path} has no checkpoint: no checkpoint folder and no "
                f"{prefix}-NNNN.params file in it.",
                hint="The run stopped before its first checkpoint (see run.json and "
                "train.log); train it again, or pick another run folder.",
            )
        return _unverified(run, prefix, epochs[-1])
    loaded, skipped = checkpoint.find_and_load(run, tag=tag, optimizer=False)
    for bad, reason in skipped:
        log.warning("checkpoint %s is not usable (%s); skipped it", bad.tag, reason)
    ckpt = loaded.checkpoint
    return ChosenCheckpoint(ckpt.epoch, ckpt.batch, ckpt.tag, ckpt.path / PARAMS_FILE, loaded)


def _logged_best(run: RunFolder) -> str | None:
    """Without ``checkpoints/best`` (no checkpoint.best_metric): the checkpoint saved with the
    best logged value, the one ``mxtrain runs`` and ``show`` report as best."""
    best = logged_best(run.path)
    if best is None or best.checkpoint is None:
        return None
    log.info(
        "no best checkpoint recorded; using %s, saved with the best %s %s (%g at epoch %d)",
        best.checkpoint,
        best.split,
        best.metric,
        best.value,
        best.epoch,
    )
    return best.checkpoint


def _no_epoch(run: RunFolder, prefix: str, epoch: int, epochs: list[int]) -> RunFolderError:
    listed = ", ".join(str(e) for e in epochs) or "none"
    example = f"{run.path}:{epochs[-1]}" if epochs else f"{run.path}:latest"
    return RunFolderError(
        f"The run folder {run.path} has no checkpoint for epoch {epoch} "
        f"({run.params_file(prefix, epoch).name} is missing).",
        hint=f"It has epoch{'s' if len(epochs) != 1 else ''} {listed}: pass one of them, e.g. "
        f"{example}, RUN:TAG for a mid-epoch checkpoint, or leave the epoch out for the "
        "newest.",
    )


def _unverified(run: RunFolder, prefix: str, epoch: int) -> ChosenCheckpoint:
    path = run.params_file(prefix, epoch)
    log.warning(
        "using %s, which has no checkpoint folder with checksums: it cannot be verified",
        path,
    )
    return ChosenCheckpoint(epoch, 0, None, path)


def choose_checkpoint(ref: str) -> ChosenCheckpoint:
    """The checkpoint ``RUN[:selector]`` names (:func:`resolve_checkpoint`), the run folder
    taken from the current folder; the run's own config, read with the plugins the folder
    keeps, says the checkpoint prefix."""
    folder, wanted = parse_checkpoint_ref(ref)
    run = open_run_folder(folder.absolute())
    with kept_plugins(run.path):  # its config may name plugins kept in the folder
        prefix = load_config(run.config_file, base_dir=run.config_dir()).checkpoint.prefix
    return resolve_checkpoint(run, prefix, wanted)


def merge_selectors(ref_choice: int | str | None, epoch: int | None, ref: str) -> int | str | None:
    """The one checkpoint ``ref``'s selector and ``--epoch`` ask for (they must agree)."""
    if ref_choice is not None and epoch is not None and ref_choice != epoch:
        raise ConfigError(
            f"Two different checkpoints were given: {ref!r} says {ref_choice}, --epoch says "
            f"{epoch}.",
            hint="Give the checkpoint once, as RUN:EPOCH (or RUN:best, RUN:TAG) or with --epoch.",
        )
    chosen = ref_choice if ref_choice is not None else epoch
    if isinstance(chosen, int) and chosen < 0:
        raise ConfigError(f"The epoch must not be negative, got {chosen}.")
    return chosen


def read_checkpoint_params(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(arg_params, aux_params) of a params file; a DataError explains one that cannot be read."""
    hint = (
        "The file may be truncated or not an MXNet parameter file; pick another epoch "
        "(RUN:EPOCH) or train the run again."
    )
    try:
        return read_params(path)
    except ParamsFileError as exc:
        if exc.kind == "unreadable":
            message = f"The checkpoint {path} cannot be read ({exc.detail})."
        elif exc.kind == "entry":
            message = (
                f"The checkpoint {path} has an entry {exc.detail!r}; MXNet parameter files "
                "name every entry 'arg:NAME' or 'aux:NAME'."
            )
        else:
            message = f"The checkpoint {path} has no named parameters."
        raise DataError(message, hint=hint) from None


def recorded_buckets(loaded: LoadedCheckpoint | None, run: RunFolder) -> BucketKeys | None:
    """The buckets ``loaded``'s state.json recorded, ascending (None: no checkpoint, none
    recorded, or keys that are neither all sequence lengths nor all (source, target) pairs).
    Keys that cannot be the training buckets (edited) are a RunFolderError naming the file,
    before anything is unrolled for them."""
    if loaded is None:
        return None
    keys = checkpoint_keys(loaded, run)
    if keys and all(type(k) is int for k in keys):
        return tuple(sorted(keys))
    if keys and all(isinstance(k, tuple) and len(k) == 2 for k in keys):
        return tuple(sorted(keys))
    return None


def recorded_last_batch(loaded: LoadedCheckpoint | None) -> str | None:
    """A checkpoint's last-batch rule: what it recorded, or ``pad`` for a checkpoint of a
    version that had no such rule (None: no checkpoint, or no bucketing)."""
    if loaded is None or not loaded.bucket_keys:
        return None
    return (loaded.state or {}).get("last_batch") or "pad"
