"""Durable and atomic file writes: the one place that writes, fsyncs and renames.

A file is written under a temporary name beside its real one (``.<name>.tmp-<pid>``),
fsynced, then renamed over the real name, so a reader (or a run resumed after a power cut)
sees the old file or the whole new one, never a part. The crash points
(:mod:`mxtrain.crashpoints`) sit between those steps. Temporary names carry the writer's
PID so that cleaning up never touches a live writer's file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import IO

from mxtrain.crashpoints import crash_point

#: crash points around the rename of a file mxtrain writes itself, and of one MXNet writes
FILE_POINTS = ("file.written", "file.replaced")
MXNET_FILE_POINTS = ("mxnet-file.written", "mxnet-file.replaced")

_TEMPORARY = re.compile(r"\..+\.tmp-(\d+)")


def temporary_name(path: Path) -> Path:
    """Where ``path`` is written before it is renamed into place (this process's name)."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def write_durably(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    """Create ``path`` with ``write(handle)`` and fsync it (no rename: for files inside a
    folder that is itself renamed into place once complete)."""
    with open(path, "wb") as handle:
        write(handle)
        handle.flush()
        os.fsync(handle.fileno())


def fsync_file(path: Path) -> None:
    """fsync a file another library wrote and closed (a new descriptor, the same inode)."""
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def fsync_dir(path: Path) -> None:
    """Make renames and new entries in the folder ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _rename_into_place(tmp: Path, path: Path, points: tuple[str, str]) -> None:
    crash_point(points[0], file=path.name)
    os.replace(tmp, path)
    crash_point(points[1], file=path.name)


def write_atomically(
    path: Path, write: Callable[[IO[bytes]], object], *, points: tuple[str, str] = FILE_POINTS
) -> None:
    """Call ``write(handle)`` on a temporary file beside ``path``, fsync it, rename it to
    ``path``. An error leaves ``path`` as it was and removes the temporary file."""
    tmp = temporary_name(path)
    try:
        write_durably(tmp, write)
        _rename_into_place(tmp, path, points)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def save_atomically(path: Path, save: Callable[[Path], None]) -> None:
    """Like :func:`write_atomically` for a library that writes a file by name itself
    (``symbol.save``, ``mx.nd.save``): ``save(temporary_path)``."""
    tmp = temporary_name(path)
    try:
        save(tmp)
        fsync_file(tmp)
        _rename_into_place(tmp, path, MXNET_FILE_POINTS)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one."""
    write_atomically(path, lambda handle: handle.write(data))


def atomic_write_text(path: Path, text: str) -> None:
    """Text flavour of :func:`atomic_write_bytes` (UTF-8)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def abandoned(pid: int) -> bool:
    """True for work left by this process or a dead one (never touch a live writer's)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # exists but belongs to someone else
        return False
    return False


def remove_stale_temporaries(folder: Path) -> list[str]:
    """Delete the temporary files (``.<name>.tmp-<pid>``) that killed writers left in
    ``folder``; returns their names. A live process's are left alone."""
    removed = []
    for entry in list(folder.iterdir()) if folder.is_dir() else []:
        match = _TEMPORARY.fullmatch(entry.name)
        if match is not None and entry.is_file() and abandoned(int(match[1])):
            entry.unlink(missing_ok=True)
            removed.append(entry.name)
    return removed
