"""Writing ``mxtrain predict``'s output: a regular file atomically, a device or pipe directly.

* A regular file (new, or existing with ``--force``) is written under a temporary name in its
  folder and renamed over the target when complete, so a failure never leaves half a file
  and never loses the old one.
* A symbolic link is followed: its target is what gets written (atomically when it is a
  regular file or does not exist yet); the link itself stays.
* A character device or FIFO (``/dev/stdout``, ``/dev/null``, a named pipe), and any open
  descriptor named through ``/dev/stdout``, ``/dev/fd/N`` or ``/proc/PID/fd/N``, is a stream:
  it is opened for writing as it is (never created, truncated, renamed or replaced) and
  needs no ``--force``.
* Anything else (a block device, a socket, a folder) is refused.

A failure of the operating system while writing (folder not writable, read-only file
system, disk or device full) is a :class:`DataError` (exit 3) naming the path, and leaves
nothing behind; a misused argument (missing folder, existing file without ``--force``) is a
:class:`ConfigError` (exit 2).
"""

from __future__ import annotations

import errno
import math
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import numpy as np

from mxtrain.errors import ConfigError, DataError
from mxtrain.run.atomic import temporary_name, write_atomically

_SYMLINK_HOPS = 40  # as the kernel's own limit on nested symbolic links


def _resolves_into_fd_folder(path: Path) -> bool:
    """Whether ``path`` (through its symbolic links) is an entry of a ``fd`` folder.

    ``/dev/stdout`` -> ``/proc/self/fd/1`` names whatever descriptor 1 is (a terminal, a pipe
    or the regular file a shell redirected it to); such a file is written in place, never
    replaced, or the descriptor's holder would not see the output.
    """
    current = path
    for _ in range(_SYMLINK_HOPS):
        folder = current.parent
        in_proc = folder.parent.parent == Path("/proc")
        if folder.name == "fd" and (folder.parent == Path("/dev") or in_proc):
            return True
        if not current.is_symlink():
            return False
        target = Path(os.readlink(current))
        current = target if target.is_absolute() else current.parent / target
    return False


def is_stream(path: Path) -> bool:
    """Whether ``path`` is written directly (a device, a FIFO or an open descriptor)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode) or _resolves_into_fd_folder(path)


def resolve_output(path: Path) -> Path:
    """The path to write: ``path`` itself for streams, else with symbolic links followed."""
    return path if is_stream(path) else Path(os.path.realpath(path))


def check_output(output: Path, force: bool) -> None:
    """ConfigError/DataError, before any work is done, if ``output`` cannot be written.

    ``output`` is the result of :func:`resolve_output`. For a regular file the folder is probed
    by creating (and removing) the temporary file that :func:`write_atomically` will use.
    """
    if is_stream(output):
        if not os.access(output, os.W_OK):
            raise DataError(
                f"The output {output} cannot be written (permission denied).",
                hint="Choose another --output.",
            )
        return
    try:
        mode: int | None = os.stat(output).st_mode
    except (FileNotFoundError, NotADirectoryError):
        mode = None
    except OSError as exc:
        raise _write_error(output, exc) from None
    if mode is not None and stat.S_ISDIR(mode):
        raise ConfigError(
            f"The output {output} is a folder.", hint="Give a file name, e.g. predictions.jsonl."
        )
    if mode is not None and not stat.S_ISREG(mode):
        raise ConfigError(
            f"The output {output} is neither a regular file, a character device nor a pipe; "
            "mxtrain predict does not write to it.",
            hint="Choose a file name (or /dev/stdout) for --output.",
        )
    if mode is not None and not force:
        raise ConfigError(
            f"The output file {output} already exists; mxtrain predict does not overwrite files.",
            hint="Pass --force to replace it, or choose another --output.",
        )
    folder = output.parent
    if not folder.is_dir():
        if folder.exists() or any(p.exists() and not p.is_dir() for p in folder.parents):
            raise ConfigError(
                f"The folder {folder} of the output file {output} is not a folder: a file "
                "is in its path.",
                hint="Choose another --output.",
            )
        raise ConfigError(
            f"The folder of the output file {output} does not exist.",
            hint=f"Create it first (mkdir -p {folder}) or choose another --output.",
        )
    probe = temporary_name(output)
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except OSError as exc:
        raise _write_error(output, exc) from None
    probe.unlink(missing_ok=True)


def write_output(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Write ``path`` with ``write(handle)``: streams directly, regular files atomically.

    OS errors (no space, not writable) become a DataError naming ``path``; a broken pipe
    propagates, so the command exits quietly as other commands do when their reader stops.
    """
    try:
        if is_stream(path):
            # No O_CREAT/O_TRUNC: a device or pipe is written as it is; O_APPEND keeps a
            # shell's `>>` redirection of /dev/stdout appending.
            descriptor = os.open(path, os.O_WRONLY | os.O_APPEND)
            with open(descriptor, "wb") as handle:
                write(handle)
        else:
            write_atomically(path, write)
    except BrokenPipeError:
        raise  # the reader closed the pipe (`... --output /dev/stdout | head`): not an error
    except OSError as exc:
        raise _write_error(path, exc) from None


def _write_error(path: Path, exc: OSError) -> DataError:
    reason = exc.strerror or str(exc)
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT, errno.ENOTDIR):
        where = path if is_stream(path) else path.parent
        return DataError(
            f"The output {path} cannot be written: creating files in {where} fails ({reason}).",
            hint="Choose an --output in a folder you can write to.",
        )
    if exc.errno == errno.EPIPE:
        return DataError(
            f"The reader of {path} stopped reading before every record was written (broken pipe).",
            hint="Let the reading command read all of the output, or write it to a file.",
        )
    if is_stream(path):
        outcome = "what reached it is incomplete; the device or pipe itself is left as it was"
    else:
        outcome = "no file was written under that name and none was replaced"
    return DataError(
        f"Writing the output {path} failed ({reason}); {outcome}.",
        hint="Free space on its disk, or choose another --output, then run predict again.",
    )


def shortest_float32(value: Any) -> float:
    """A float32 as the shortest decimal that reads back as the same float32 (what records
    hold: ``0.1`` rather than ``0.10000000149011612``)."""
    return float(str(np.float32(value)))


def finite_or_none(value: float) -> float | None:
    """``value``, or None (JSON null) when it is NaN or infinite."""
    return value if math.isfinite(value) else None
