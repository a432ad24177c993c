"""Checkpoints in the run folder: complete (parameters, optimizer state, training state),
atomic, verified on load, and free of pickle.

Layout::

    <prefix>-symbol.json            the default bucket's symbol (save_symbol)
    <prefix>-0003.params            epoch-end parameters, MXNet's naming: mx.mod.Module.load works
    checkpoints/
        e0003-b000000/              after 3 epochs (epoch end)
        e0003-b000120/              3 epochs and 120 batches of the 4th (mid-epoch)
            params.nd               arg:/aux: NDArrays (same bytes as <prefix>-0003.params)
            optimizer.nd            optimizer state arrays (mx.nd.save)
            optimizer.json          optimizer counters and state layout (engine/optimizer_state.py)
            state.json              the caller's training state, bucket keys, versions
            manifest.json           written last: size and sha256 of every file above
        damaged-e0003-b000000-1/    a damaged checkpoint, set aside (resume, a save, retention)

A checkpoint is built in ``checkpoints/.tmp-<tag>-<pid>/`` (every file fsynced), then renamed
into place. A folder without a manifest whose own checksum and file checksums all match is
never used, so a crash at any point leaves the previous checkpoints intact and nothing
half-written that looks usable. A damaged checkpoint is never deleted: resume sets aside the
ones it skipped (:func:`keep_damaged_aside`), a save over a damaged tag sets that one aside
first, and retention sets aside instead of deleting one that does not verify. Optimizer
state is NDArrays plus JSON because MXNet's own ``.states`` file is a pickle: loading one
from elsewhere could run arbitrary code.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mxtrain import __version__
from mxtrain.crashpoints import crash_point
from mxtrain.errors import ExitCode, MxtrainError, RunFolderError
from mxtrain.mxnet_errors import mxnet_reason
from mxtrain.run import environment
from mxtrain.run.atomic import (
    abandoned,
    atomic_write_text,
    fsync_dir,
    fsync_file,
    save_atomically,
    temporary_name,
    write_durably,
)
from mxtrain.run.checkpoint_state import CheckpointSource, ModuleCheckpoint
from mxtrain.run.folder import RunFolder
from mxtrain.run.layout import (
    BEST_FILE,
    CONFIG_FILE,
    DATA_FILES,
    MANIFEST_FILE,
    OPTIMIZER_ARRAYS_FILE,
    OPTIMIZER_META_FILE,
    PARAMS_FILE,
    STATE_FILE,
    WORK_FOLDER,
    checkpoint_tag,
    damaged_folder_name,
    parse_tag,
    work_folder_name,
)
from mxtrain.run.params import (
    ParamsFileError,
    load_named_arrays,
    param_problems,
    params_file_entries,
    params_mismatch_error,
    read_params,
)
from mxtrain.user_files import MISSING, UnusableFile, open_regular, read_regular

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "LoadedCheckpoint",
    "best_tag",
    "checkpoint_tag",
    "discard_checkpoint",
    "find_checkpoint",
    "keep_damaged_aside",
    "list_checkpoints",
    "load_checkpoint",
    "parse_tag",
    "prune_checkpoints",
    "record_best",
    "remove_checkpoint",
    "restore_module",
    "save_checkpoint",
    "save_params",
    "save_symbol",
    "tidy_checkpoints",
    "verify_checkpoint",
    "write_params_file",
]

FORMAT_VERSION = 1
LATEST = "latest"  # selectors of find_checkpoint besides a tag
BEST = "best"
_CHUNK = 1 << 20

log = logging.getLogger(__name__)


class CheckpointError(MxtrainError):
    """A checkpoint that is missing, incomplete, corrupted or does not fit the model."""

    exit_code = ExitCode.DATA

    def __init__(self, message: str, *, hint: str | None = None, reason: str | None = None):
        super().__init__(message, hint=hint)
        self.reason = reason or self.message  # short form, for "skipped X (reason)" lists


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint folder: ``epoch`` epochs done plus ``batch`` batches of the next."""

    tag: str
    epoch: int
    batch: int
    path: Path
    created: float | None = field(default=None, compare=False)  # from the manifest, if readable

    @property
    def epoch_end(self) -> bool:
        return self.batch == 0


@dataclass
class LoadedCheckpoint:
    """Everything a verified checkpoint holds, ready for :func:`restore_module`."""

    checkpoint: Checkpoint
    arg_params: dict[str, Any]
    aux_params: dict[str, Any]
    optimizer_arrays: dict[str, Any]
    optimizer_meta: dict[str, Any] | None  # None: saved before the optimizer existed
    state: dict[str, Any]  # what the caller passed to save_checkpoint
    bucket_keys: list[Any] | None  # tuple keys come back as tuples
    versions: dict[str, str]
    #: recurrent state carried across batches (``BucketingModule.get_states``), empty if none
    recurrent_states: dict[str, Any] = field(default_factory=dict)


#: prefix of the recurrent-state arrays in ``optimizer.nd`` (``BucketingModule.get_states``)
RECURRENT_STATE = "recurrent_state:"

# ----------------------------------------------------------------------------- file primitives
# Every write of save_checkpoint goes through these (and os.replace / os.rename), which is
# what the crash tests interrupt one call at a time.


def _write_bytes(path: Path, data: bytes) -> None:
    write_durably(path, lambda handle: handle.write(data))


def _save_arrays(path: Path, arrays: Mapping[str, Any]) -> None:
    import mxnet as mx  # deferred: importing mxnet costs ~1 s for commands that only read

    mx.nd.save(str(path), dict(arrays))


def _save_nd(path: Path, arrays: Mapping[str, Any]) -> None:
    _save_arrays(path, arrays)
    fsync_file(path)  # MXNet wrote and closed the file itself


def _copy_file(src: Path, dst: Path) -> None:
    with open(src, "rb") as fin:
        write_durably(dst, lambda fout: shutil.copyfileobj(fin, fout, _CHUNK))


def file_digest(path: Path) -> dict[str, Any]:
    """``{"size", "sha256"}`` of a regular file, read in chunks."""
    sha = hashlib.sha256()
    size = 0
    with open_regular(path) as handle:
        while chunk := handle.read(_CHUNK):
            sha.update(chunk)
            size += len(chunk)
    return {"size": size, "sha256": sha.hexdigest()}


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode("utf-8")


def _dump_json(obj: Any, what: str) -> bytes:
    try:
        text = json.dumps(obj, indent=2, allow_nan=True)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} cannot be written as JSON: {exc}") from exc
    return (text + "\n").encode("utf-8")


def _seal(manifest: dict[str, Any]) -> bytes:
    """The manifest with a checksum of itself, so an edited manifest is detected too."""
    sealed = {**manifest, "manifest_sha256": hashlib.sha256(_canonical(manifest)).hexdigest()}
    return _dump_json(sealed, "the manifest")


# ----------------------------------------------------------------------------- bucket keys


def _encode_key(key: Any) -> Any:
    if isinstance(key, tuple | list):
        return [_encode_key(k) for k in key]
    if isinstance(key, bool | int | float | str) or key is None:
        return key
    if hasattr(key, "item"):  # numpy scalars
        return key.item()
    raise ValueError(f"bucket key {key!r} cannot be stored in JSON")


def _decode_key(key: Any) -> Any:
    # JSON has no tuples: every list in a stored key was a tuple (or list) key
    return tuple(_decode_key(k) for k in key) if isinstance(key, list) else key


# ----------------------------------------------------------------------------- saving


def save_checkpoint(
    run: RunFolder,
    module: CheckpointSource,
    *,
    prefix: str,
    epoch: int,
    batch: int,
    state: Mapping[str, Any],
    bucket_keys: Sequence[Any] | None = None,
) -> Checkpoint:
    """Write checkpoint ``e<epoch>-b<batch>`` of what ``module.checkpoint_state()`` hands
    over, atomically; return it.

    ``epoch`` counts finished epochs and ``batch`` the batches trained of the next one, so
    ``batch == 0`` is an epoch-end checkpoint, which also writes ``<prefix>-<epoch>.params``
    at the top of the run folder. An existing checkpoint with the same tag is replaced; until
    the new one is complete the old one stays usable. ``state`` must be JSON-able.
    """
    tag = checkpoint_tag(epoch, batch)
    root = run.checkpoints_dir
    if not root.is_dir():
        root.mkdir()
        fsync_dir(run.path)
    _tidy(root, run, prefix)
    # gather everything first: a state that cannot be saved fails before anything is written
    state_bytes = _dump_json(
        {
            "format": FORMAT_VERSION,
            "state": dict(state),
            "bucket_keys": None if bucket_keys is None else [_encode_key(k) for k in bucket_keys],
            "versions": environment.versions(),
        },
        "the training state",
    )
    files = _checkpoint_files(module.checkpoint_state(), tag, state_bytes)

    pid = os.getpid()
    tmp = root / work_folder_name("tmp", tag, pid)
    final = root / tag
    aside = root / work_folder_name("old", tag, pid)
    top = run.params_file(prefix, epoch) if batch == 0 else None
    top_tmp = temporary_name(top) if top is not None else None
    created = time.time()
    try:
        if os.path.lexists(final):
            _keep_damaged_aside(root, tag)
        _write_folder(tmp, files, tag, epoch, batch, created, top)
        if top is not None and top_tmp is not None:
            # in place before the checkpoint appears: a listed epoch-end checkpoint always has
            # its Module.load-able file
            _copy_file(tmp / PARAMS_FILE, top_tmp)
            crash_point("checkpoint.top-params-copied", tag=tag)
            os.replace(top_tmp, top)
            crash_point("checkpoint.top-params-renamed", tag=tag)
            fsync_dir(run.path)
            crash_point("checkpoint.top-params-synced", tag=tag)
        _move_into_place(root, tmp, final, aside, tag)
    except Exception as exc:
        # a real crash leaves these for _tidy; an error we see is cleaned up now
        shutil.rmtree(tmp, ignore_errors=True)
        if top_tmp is not None:
            top_tmp.unlink(missing_ok=True)
        if aside.exists():
            if final.exists():  # the new checkpoint is in place: the old one can go
                shutil.rmtree(aside, ignore_errors=True)
            else:  # it is not: put the old one back
                os.rename(aside, final)
        if isinstance(exc, OSError):
            raise RunFolderError(
                f"cannot save checkpoint {tag} in {root}: {exc}.",
                hint="The previous checkpoints are intact. Free disk space or fix the "
                "folder's permissions, then resume.",
            ) from exc
        raise
    return Checkpoint(tag, epoch, batch, final, created)


@dataclass(frozen=True)
class _CheckpointFiles:
    """The contents of a checkpoint's files, ready to write."""

    params: dict[str, Any]  # arg:/aux: arrays
    optimizer_arrays: dict[str, Any]  # the optimizer's arrays and the recurrent states
    optimizer_meta: bytes
    state: bytes


def _checkpoint_files(handed: ModuleCheckpoint, tag: str, state_bytes: bytes) -> _CheckpointFiles:
    """What the files of checkpoint ``tag`` hold: what the module handed over, and the
    training state (``state.json``'s bytes)."""
    if handed.optimizer_on_servers:
        log.warning(
            "checkpoint %s: the optimizer state lives on the kvstore servers and is not "
            "saved; a resume from it starts the optimizer state afresh",
            tag,
        )
    opt_bytes = _dump_json(handed.optimizer_meta, "the optimizer state")
    # the recurrent state a stream model carries into the next batch (truncated BPTT): part
    # of where training stands, kept beside the optimizer's arrays
    opt_arrays = dict(handed.optimizer_arrays)
    opt_arrays.update({RECURRENT_STATE + k: v for k, v in handed.recurrent_states.items()})
    params = params_file_entries(handed.arg_params, handed.aux_params)
    return _CheckpointFiles(params, opt_arrays, opt_bytes, state_bytes)


def _write_folder(
    tmp: Path,
    files: _CheckpointFiles,
    tag: str,
    epoch: int,
    batch: int,
    created: float,
    top: Path | None,
) -> None:
    """Write every file of the checkpoint into the new folder ``tmp``, the manifest last,
    and sync the folder."""
    tmp.mkdir()
    crash_point("checkpoint.tmp-created", tag=tag)
    _save_nd(tmp / PARAMS_FILE, files.params)
    crash_point("checkpoint.params-written", tag=tag)
    _save_nd(tmp / OPTIMIZER_ARRAYS_FILE, files.optimizer_arrays)
    crash_point("checkpoint.optimizer-arrays-written", tag=tag)
    _write_bytes(tmp / OPTIMIZER_META_FILE, files.optimizer_meta)
    crash_point("checkpoint.optimizer-meta-written", tag=tag)
    _write_bytes(tmp / STATE_FILE, files.state)
    crash_point("checkpoint.state-written", tag=tag)
    digests = {name: file_digest(tmp / name) for name in DATA_FILES}
    manifest: dict[str, Any] = {
        "format": FORMAT_VERSION,
        "tag": tag,
        "epoch": epoch,
        "batch": batch,
        "created": created,
        "mxtrain": __version__,
        "files": digests,
        "top_level_params": None,
    }
    if top is not None:
        manifest["top_level_params"] = {"file": top.name, **digests[PARAMS_FILE]}
    _write_bytes(tmp / MANIFEST_FILE, _seal(manifest))
    crash_point("checkpoint.manifest-written", tag=tag)
    fsync_dir(tmp)
    crash_point("checkpoint.tmp-synced", tag=tag)


def _move_into_place(root: Path, tmp: Path, final: Path, aside: Path, tag: str) -> None:
    """Rename the complete folder ``tmp`` to ``final``, setting an old one aside first and
    removing it after."""
    replacing = final.exists()
    if replacing:
        os.rename(final, aside)  # a crash from here until the next rename: see _tidy
        crash_point("checkpoint.old-moved-aside", tag=tag)
    os.replace(tmp, final)
    crash_point("checkpoint.moved-in", tag=tag)
    fsync_dir(root)
    crash_point("checkpoint.root-synced", tag=tag)
    if replacing:
        shutil.rmtree(aside, ignore_errors=True)
        crash_point("checkpoint.old-removed", tag=tag)


def _keep_damaged_aside(root: Path, tag: str) -> None:
    """Before ``root/tag`` is written again: if what is there is not a usable checkpoint (the
    one a resume skipped and trains again), set it aside instead of letting the save replace
    it (see :func:`_set_aside`)."""
    position = parse_tag(tag)
    assert position is not None
    try:
        load_checkpoint(Checkpoint(tag, position[0], position[1], root / tag))
        return  # a valid checkpoint: replaced as usual
    except CheckpointError as exc:
        reason = exc.reason
    _set_aside(root, root / tag, tag, reason, f"and a new {tag} is saved in its place")


def keep_damaged_aside(run: RunFolder, skipped: Sequence[tuple[Checkpoint, str]]) -> None:
    """Set aside every checkpoint a choice skipped as unusable (``skipped`` as
    :func:`find_and_load` returns it), so that no later save or retention can delete it.

    Only for commands that write the run folder (resume): score, predict and export only
    read it and leave a skipped checkpoint where it is."""
    for ckpt, reason in skipped:
        if os.path.lexists(ckpt.path):  # gone meanwhile: nothing left to keep
            _set_aside(
                run.checkpoints_dir, ckpt.path, ckpt.tag, reason, "so that nothing deletes it"
            )


def _set_aside(root: Path, path: Path, tag: str, reason: str, outcome: str) -> Path:
    """Rename the damaged checkpoint ``path`` (of ``tag``) ``damaged-<tag>-<n>``, the first
    free number, and log both names. A damaged checkpoint is never deleted, and under that
    name no listing, choice, tidying or retention sees it."""
    number = 1
    while os.path.lexists(root / damaged_folder_name(tag, number)):
        number += 1
    aside = root / damaged_folder_name(tag, number)
    os.rename(path, aside)
    fsync_dir(root)
    log.warning("checkpoint %s is damaged (%s): kept as %s, %s", tag, reason, aside, outcome)
    return aside


def tidy_checkpoints(run: RunFolder, prefix: str) -> None:
    """Finish or undo what a killed save or removal left half-done in the run folder."""
    root = run.checkpoints_dir
    if root.is_dir():
        _tidy(root, run, prefix)


def _tidy(root: Path, run: RunFolder, prefix: str) -> None:
    """Clear what an interrupted save or removal left behind (only this or dead processes')."""
    for entry in list(root.iterdir()):
        match = WORK_FOLDER.fullmatch(entry.name)
        if match is None or not abandoned(int(match[3])):
            continue
        kind, tag = match[1], match[2]
        if kind == "old" and not (root / tag).exists():
            # interrupted between moving the old checkpoint aside and moving the new one in
            os.rename(entry, root / tag)
            continue
        position = parse_tag(tag)
        if kind == "del" and position is not None and position[1] == 0:
            # interrupted removal: its top-level params file was to go with it
            run.params_file(prefix, position[0]).unlink(missing_ok=True)
        shutil.rmtree(entry, ignore_errors=True)
    stale = re.compile(rf"\.{re.escape(prefix)}-\d{{4,}}\.params\.tmp-(\d+)")
    for entry in list(run.path.iterdir()):
        match = stale.fullmatch(entry.name)
        if match is not None and abandoned(int(match[1])):
            entry.unlink(missing_ok=True)


# ----------------------------------------------------------------------------- listing


def _read_created(path: Path) -> float | None:
    try:
        created = json.loads(read_regular(path / MANIFEST_FILE)).get("created")
    except (UnusableFile, OSError, ValueError, AttributeError):
        return None
    return float(created) if isinstance(created, int | float) else None


def list_checkpoints(run: RunFolder) -> list[Checkpoint]:
    """Every checkpoint folder, oldest to newest by (epoch, batch); not verified.

    Work folders (``.tmp-*`` and the like) and other names are ignored, except that a
    checkpoint set aside by a replacement that was interrupted stands in for its tag.
    """
    root = run.checkpoints_dir
    if not root.is_dir():
        return []
    found: dict[str, Path] = {}
    aside: dict[str, Path] = {}
    for entry in sorted(root.iterdir()):
        if not entry.is_dir() or entry.is_symlink():
            continue
        if parse_tag(entry.name) is not None:
            found[entry.name] = entry
        else:
            match = WORK_FOLDER.fullmatch(entry.name)
            if match is not None and match[1] == "old":
                aside.setdefault(match[2], entry)
    for tag, path in aside.items():
        found.setdefault(tag, path)
    out = []
    for tag, path in found.items():
        position = parse_tag(tag)
        assert position is not None
        out.append(Checkpoint(tag, position[0], position[1], path, _read_created(path)))
    return sorted(out, key=lambda c: (c.epoch, c.batch))


# ----------------------------------------------------------------------------- verifying


def _broken(ckpt: Checkpoint, name: str, problem: str) -> CheckpointError:
    return CheckpointError(
        f"checkpoint {ckpt.tag} is not usable: {ckpt.path / name} {problem}.",
        hint="`mxtrain resume` falls back to the newest valid checkpoint on its own; "
        f"delete {ckpt.path} if you no longer need it.",
        reason=f"{name} {problem}",
    )


def _read_manifest(ckpt: Checkpoint) -> dict[str, Any]:
    path = ckpt.path / MANIFEST_FILE
    if not ckpt.path.is_dir():
        raise _broken(ckpt, "", "is missing")
    try:
        raw = read_regular(path)
    except UnusableFile as exc:
        if exc.problem == MISSING:
            raise _broken(
                ckpt, MANIFEST_FILE, "is missing (the checkpoint was never completely written)"
            ) from None
        raise _broken(ckpt, MANIFEST_FILE, exc.problem) from None
    try:
        manifest = json.loads(raw)
    except ValueError as exc:
        raise _broken(ckpt, MANIFEST_FILE, f"is not valid JSON ({exc})") from exc
    if not isinstance(manifest, dict) or not isinstance(manifest.get("manifest_sha256"), str):
        raise _broken(ckpt, MANIFEST_FILE, "is not a checkpoint manifest")
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    if hashlib.sha256(_canonical(body)).hexdigest() != manifest["manifest_sha256"]:
        raise _broken(
            ckpt, MANIFEST_FILE, "was modified after it was written (its checksum differs)"
        )
    if body.get("format") != FORMAT_VERSION:
        raise _broken(
            ckpt,
            MANIFEST_FILE,
            f"has format {body.get('format')!r}; this mxtrain reads format {FORMAT_VERSION}",
        )
    if (body.get("tag"), body.get("epoch"), body.get("batch")) != (
        ckpt.tag,
        ckpt.epoch,
        ckpt.batch,
    ):
        raise _broken(
            ckpt, MANIFEST_FILE, f"describes checkpoint {body.get('tag')!r}, not {ckpt.tag!r}"
        )
    files = body.get("files")
    if not isinstance(files, dict) or sorted(files) != sorted(DATA_FILES):
        raise _broken(ckpt, MANIFEST_FILE, f"does not list the files {list(DATA_FILES)}")
    return body


def verify_checkpoint(ckpt: Checkpoint) -> None:
    """Raise :class:`CheckpointError` naming the file unless the checkpoint is complete and
    every file has the size and sha256 its manifest records."""
    files = _read_manifest(ckpt)["files"]
    for name in DATA_FILES:
        path = ckpt.path / name
        expected = files[name]
        try:
            actual = file_digest(path)
        except UnusableFile as exc:
            raise _broken(
                ckpt, name, "is missing" if exc.problem == MISSING else exc.problem
            ) from None
        except OSError as exc:
            raise _broken(ckpt, name, f"cannot be read ({exc.strerror})") from exc
        if actual["size"] != expected.get("size"):
            kind = "truncated" if actual["size"] < (expected.get("size") or 0) else "the wrong size"
            raise _broken(
                ckpt,
                name,
                f"is {kind}: {actual['size']} bytes, the manifest records {expected.get('size')}",
            )
        if actual["sha256"] != expected.get("sha256"):
            raise _broken(ckpt, name, "is corrupted: its sha256 differs from the manifest's")
    for name in (OPTIMIZER_META_FILE, STATE_FILE):
        try:
            data = json.loads(read_regular(ckpt.path / name))
        except UnusableFile as exc:
            raise _broken(ckpt, name, exc.problem) from None
        except ValueError as exc:
            raise _broken(ckpt, name, f"is not valid JSON ({exc})") from exc
        if name == STATE_FILE and not (
            isinstance(data, dict) and isinstance(data.get("state"), dict)
        ):
            raise _broken(ckpt, name, "does not hold a training state")
        if name == STATE_FILE and "position" in data["state"]:
            _check_position(ckpt, data["state"]["position"])
        if name == OPTIMIZER_META_FILE and not (data is None or isinstance(data, dict)):
            raise _broken(ckpt, name, "does not hold an optimizer description")


def _check_position(ckpt: Checkpoint, position: Any) -> None:
    """A saved training position must be the checkpoint's own, in non-negative integers: a
    state that verifies but says epoch -1 or "abc" is as unusable as a corrupted one."""
    if not isinstance(position, dict):
        raise _broken(ckpt, STATE_FILE, "holds a training position that is not a mapping")
    for key in ("epoch", "batch"):
        value = position.get(key)
        if type(value) is not int or value < 0:
            raise _broken(
                ckpt,
                STATE_FILE,
                f"holds an impossible training position ({key} {value!r}, not a non-negative "
                "integer)",
            )
    if (position["epoch"], position["batch"]) != (ckpt.epoch, ckpt.batch):
        raise _broken(
            ckpt,
            STATE_FILE,
            f"holds the training position epoch {position['epoch']}, batch "
            f"{position['batch']}, which is not the checkpoint's own ({ckpt.tag})",
        )


def best_tag(run: RunFolder) -> str | None:
    """The tag recorded in ``checkpoints/best`` (written with ``checkpoint.best_metric``)."""
    try:
        tag = read_regular(run.best_file).decode("utf-8").strip()
    except (UnusableFile, UnicodeDecodeError):
        return None
    return tag or None


def record_best(run: RunFolder, tag: str) -> None:
    """Name ``tag`` in ``checkpoints/best`` (atomically; left alone when it already does)."""
    root = run.checkpoints_dir
    if root.is_dir() and best_tag(run) != tag:
        atomic_write_text(root / BEST_FILE, tag + "\n")


def find_checkpoint(
    run: RunFolder,
    epoch: int | None = None,
    *,
    tag: str | None = None,
    load: bool = False,
) -> tuple[Checkpoint, list[tuple[Checkpoint, str]]]:
    """The checkpoint to use, and the ones skipped as unusable with the reason.

    * neither ``epoch`` nor ``tag`` (or ``tag="latest"``): the newest valid checkpoint of any
      kind, epoch end or mid-epoch;
    * ``epoch``: the end-of-epoch checkpoint ``e<epoch>-b000000`` if valid, else the newest
      valid one saved during the following epoch (what resume continues from);
    * ``tag="best"``: the one named in ``checkpoints/best``; any other ``tag``: that
      checkpoint. An explicitly named checkpoint is never replaced by another: if it is not
      valid, the error names the file.

    ``load`` also reads the arrays with MXNet (see :func:`load_checkpoint`), so a file that
    verifies but MXNet cannot read counts as unusable too (use :func:`find_and_load`).
    Raises :class:`CheckpointError` when no candidate is usable.
    """
    found, skipped, _ = _select(run, epoch, tag, load)
    return found, skipped


def find_and_load(
    run: RunFolder,
    epoch: int | None = None,
    *,
    tag: str | None = None,
    optimizer: bool = True,
    accept: Callable[[LoadedCheckpoint], Any] | None = None,
) -> tuple[LoadedCheckpoint, list[tuple[Checkpoint, str]]]:
    """:func:`find_checkpoint`, loading the checkpoint as well (``optimizer=False``: the
    parameters, state and bucket keys only); one MXNet cannot read is skipped like one that
    fails verification, and so is one whose state ``accept`` refuses with a ValueError."""
    _, skipped, loaded = _select(run, epoch, tag, True, optimizer=optimizer, accept=accept)
    assert loaded is not None
    return loaded, skipped


def _select(
    run: RunFolder,
    epoch: int | None,
    tag: str | None,
    load: bool,
    *,
    optimizer: bool = True,
    accept: Callable[[LoadedCheckpoint], Any] | None = None,
) -> tuple[Checkpoint, list[tuple[Checkpoint, str]], LoadedCheckpoint | None]:
    listed = list_checkpoints(run)
    where = run.checkpoints_dir
    if tag == LATEST:
        tag = None
    if epoch is not None and tag is not None:
        raise ValueError("give an epoch or a tag, not both")
    if tag is not None:
        return _select_named(run, listed, tag, load, optimizer, accept)
    if epoch is None:
        candidates = listed[::-1]
    else:
        same = [c for c in listed if c.epoch == epoch]
        candidates = [c for c in same if c.epoch_end] + [c for c in same[::-1] if not c.epoch_end]
    skipped: list[tuple[Checkpoint, str]] = []
    for ckpt in candidates:
        try:
            loaded = _use(ckpt, load, optimizer, accept)
        except CheckpointError as exc:
            skipped.append((ckpt, exc.reason))
            continue
        return ckpt, skipped, loaded
    if epoch is not None and not candidates:
        have = ", ".join(c.tag for c in listed) or "none"
        raise CheckpointError(
            f"{run.path} has no checkpoint for epoch {epoch} in {where} (checkpoints: {have}).",
            hint="Omit --epoch to resume from the newest checkpoint.",
        )
    if not candidates:
        raise CheckpointError(
            f"{run.path} has no checkpoints: {where} is missing or empty.",
            hint="Only runs that saved a checkpoint can be resumed; start again with "
            "`mxtrain fit`.",
        )
    details = "; ".join(f"{c.tag}: {reason}" for c, reason in skipped)
    raise CheckpointError(
        f"{run.path} has no valid checkpoint{'' if epoch is None else f' for epoch {epoch}'}: "
        f"{details}.",
        hint="The files named are damaged or incomplete; restore them from a copy or start "
        "again with `mxtrain fit`.",
    )


def _use(
    ckpt: Checkpoint,
    load: bool,
    optimizer: bool,
    accept: Callable[[LoadedCheckpoint], Any] | None = None,
) -> LoadedCheckpoint | None:
    """Load ``ckpt`` (which verifies it) or only verify it; CheckpointError if unusable."""
    if not load:
        verify_checkpoint(ckpt)
        return None
    loaded = load_checkpoint(ckpt, optimizer=optimizer)
    if accept is not None:
        try:
            accept(loaded)
        except ValueError as exc:
            raise _broken(ckpt, STATE_FILE, f"holds an impossible training state ({exc})") from exc
    return loaded


def _select_named(
    run: RunFolder,
    listed: list[Checkpoint],
    tag: str,
    load: bool,
    optimizer: bool,
    accept: Callable[[LoadedCheckpoint], Any] | None,
) -> tuple[Checkpoint, list[tuple[Checkpoint, str]], LoadedCheckpoint | None]:
    """The checkpoint ``tag`` (or the recorded best), verified; never another one."""
    have = ", ".join(c.tag for c in listed) or "none"
    choose = f"Pick another one: RUN:latest is the newest valid checkpoint (checkpoints: {have})."
    requested = tag
    if tag == BEST:
        recorded = best_tag(run)
        if recorded is None:
            raise CheckpointError(
                f"{run.path} records no best checkpoint ({run.best_file} is missing or empty).",
                hint="A run records its best checkpoint when checkpoint.best_metric is set. "
                + choose,
            )
        tag, requested = recorded, f"best ({recorded})"
    matches = [c for c in listed if c.tag == tag]
    if not matches:
        raise CheckpointError(
            f"{run.path} has no checkpoint {requested} in {run.checkpoints_dir}.",
            hint=choose,
        )
    ckpt = matches[0]
    try:
        loaded = _use(ckpt, load, optimizer, accept)
    except CheckpointError as exc:
        raise CheckpointError(
            exc.message,
            hint=f"Restore the file from a copy, or delete {ckpt.path}. " + choose,
            reason=exc.reason,
        ) from exc
    return ckpt, [], loaded


# ----------------------------------------------------------------------------- loading


def _load_nd(ckpt: Checkpoint, name: str) -> dict[str, Any]:
    try:
        return load_named_arrays(ckpt.path / name)
    except ParamsFileError as exc:
        raise _broken(ckpt, name, exc.problem) from exc


def load_checkpoint(ckpt: Checkpoint, *, optimizer: bool = True) -> LoadedCheckpoint:
    """Verify ``ckpt`` and read everything in it (arrays on the CPU); ``optimizer=False``
    leaves the optimizer state out (inference needs only the parameters)."""
    verify_checkpoint(ckpt)
    try:
        arg, aux = read_params(ckpt.path / PARAMS_FILE)
    except ParamsFileError as exc:
        raise _broken(ckpt, PARAMS_FILE, exc.problem) from exc
    opt_arrays = _load_nd(ckpt, OPTIMIZER_ARRAYS_FILE) if optimizer else {}
    states = {
        k[len(RECURRENT_STATE) :]: opt_arrays.pop(k)
        for k in list(opt_arrays)
        if k.startswith(RECURRENT_STATE)
    }
    # verified just now: regular files of valid JSON
    opt_meta = json.loads(read_regular(ckpt.path / OPTIMIZER_META_FILE)) if optimizer else None
    saved = json.loads(read_regular(ckpt.path / STATE_FILE))
    keys = saved.get("bucket_keys")
    return LoadedCheckpoint(
        checkpoint=ckpt,
        arg_params=arg,
        aux_params=aux,
        optimizer_arrays=opt_arrays,
        optimizer_meta=opt_meta,
        state=saved["state"],
        # anything but a list is kept as it is, for the caller's check to name (bucket_keys.py)
        bucket_keys=[_decode_key(k) for k in keys] if isinstance(keys, list) else keys,
        versions=dict(saved.get("versions") or {}),
        recurrent_states=states,
    )


def restore_module(module: Any, loaded: LoadedCheckpoint, *, parameters: bool = True) -> None:
    """Put the checkpoint's parameters and (if the module has one) optimizer state back.

    ``parameters=False`` restores the optimizer state only (the weights were set before
    the optimizer, as a kvstore that updates on its servers requires).
    """
    ckpt = loaded.checkpoint
    if parameters:
        given = (loaded.arg_params, loaded.aux_params)
        problems = param_problems(module.param_shapes(), given, source="the checkpoint")
        if problems:
            config_file = ckpt.path.parent.parent / CONFIG_FILE  # RUN/checkpoints/<tag>
            raise params_mismatch_error(ckpt.path / PARAMS_FILE, config_file, problems, ())
    try:
        if parameters:
            module.set_params(loaded.arg_params, loaded.aux_params)
        if loaded.recurrent_states and getattr(module, "state_names", None):
            module.set_states(loaded.recurrent_states)
        if getattr(module, "optimizer_initialized", False):
            if loaded.optimizer_meta is not None:
                module.set_optimizer_states(loaded.optimizer_arrays, loaded.optimizer_meta)
            else:
                log.warning(
                    "checkpoint %s has no optimizer state: the optimizer starts afresh", ckpt.tag
                )
    except (ValueError, RuntimeError) as exc:
        raise CheckpointError(
            f"checkpoint {ckpt.tag} in {ckpt.path} does not fit the model built from the "
            f"config: {mxnet_reason(exc)}.",
            hint="Resume with the configuration the run was saved with (model and optimizer "
            "settings must match).",
        ) from exc


# ----------------------------------------------------------------------------- removing


def remove_checkpoint(run: RunFolder, ckpt: Checkpoint, *, prefix: str) -> None:
    """Delete one checkpoint (and, for an epoch-end one, ``<prefix>-<epoch>.params``)."""
    root = run.checkpoints_dir
    doomed = root / work_folder_name("del", ckpt.tag, os.getpid())
    if ckpt.path.exists():
        # Renamed first so a crash half-way never leaves a half-deleted folder under its
        # tag; the .del- folder is the record that the removal is under way (see _tidy),
        # so it goes last, after the top-level params file.
        if doomed.exists():
            shutil.rmtree(doomed)
        os.rename(ckpt.path, doomed)
        crash_point("checkpoint.delete-renamed", tag=ckpt.tag)
        fsync_dir(root)
        crash_point("checkpoint.delete-synced", tag=ckpt.tag)
    if ckpt.epoch_end:
        run.params_file(prefix, ckpt.epoch).unlink(missing_ok=True)
        crash_point("checkpoint.delete-top-params", tag=ckpt.tag)
    if doomed.exists():
        shutil.rmtree(doomed, ignore_errors=True)
        crash_point("checkpoint.delete-removed", tag=ckpt.tag)


def settle_checkpoints(
    run: RunFolder, *, prefix: str, keep_last: int | None, best: dict[str, Any] | None
) -> None:
    """After a checkpoint is saved (or a resume tidied up): point checkpoints/best at the best
    one (``best["tag"]``), then apply ``keep_last`` (the best one is kept). In this order, a
    kill between the two never leaves checkpoints/best naming a deleted checkpoint."""
    tag = best.get("tag") if best else None
    if tag:
        record_best(run, tag)
    prune_checkpoints(run, prefix=prefix, keep_last=keep_last, protect=[tag] if tag else [])


def prune_checkpoints(
    run: RunFolder, *, prefix: str, keep_last: int | None, protect: Sequence[str] = ()
) -> list[Checkpoint]:
    """Remove all but the newest ``keep_last`` checkpoints and those tagged in ``protect``
    (e.g. the best one); None keeps everything. One that does not verify is set aside as
    ``damaged-<tag>-<n>`` instead, never deleted. Returns what was removed."""
    if keep_last is None:
        return []
    if keep_last < 1:
        raise ValueError(f"keep_last must be at least 1 (or None to keep all), not {keep_last}")
    listed = list_checkpoints(run)
    kept = {c.tag for c in listed[-keep_last:]} | set(protect)
    doomed = [c for c in listed if c.tag not in kept]
    why = "checkpoint.keep_last"
    return [c for c in doomed if discard_checkpoint(run, c, prefix=prefix, why=why)]


def discard_checkpoint(run: RunFolder, ckpt: Checkpoint, *, prefix: str, why: str) -> bool:
    """Delete ``ckpt`` (:func:`remove_checkpoint`) if it verifies; True when it was deleted.

    One that does not verify is set aside as ``damaged-<tag>-<n>`` instead (logged, naming
    ``why`` it was to go), and its top-level params file, perhaps the intact copy, is kept:
    mxtrain deletes only checkpoints whose files verify."""
    try:
        verify_checkpoint(ckpt)
    except CheckpointError as exc:
        _set_aside(run.checkpoints_dir, ckpt.path, ckpt.tag, exc.reason, f"not deleted by {why}")
        return False
    remove_checkpoint(run, ckpt, prefix=prefix)
    return True


# ----------------------------------------------------------------------------- MXNet files


def save_symbol(symbol: Any, run: RunFolder, prefix: str) -> Path:
    """Save ``symbol`` (the default bucket's, with every output) as ``<prefix>-symbol.json``."""
    path = run.symbol_file(prefix)
    save_atomically(path, lambda tmp: symbol.save(str(tmp)))
    return path


def save_params(module: Any, run: RunFolder, prefix: str, epoch: int) -> Path:
    """Save only the parameters as ``<prefix>-<epoch:04d>.params`` (no checkpoint folder)."""
    path = run.params_file(prefix, epoch)
    write_params_file(path, *module.get_params())
    return path


def write_params_file(path: Path, arg: Mapping[str, Any], aux: Mapping[str, Any]) -> None:
    """Write parameters in MXNet's format (``arg:NAME``/``aux:NAME``: ``mx.mod.Module.load``
    reads it), atomically and durably (the old file or the whole new one survives a crash)."""
    entries = params_file_entries(arg, aux)
    save_atomically(path, lambda tmp: _save_arrays(tmp, entries))
