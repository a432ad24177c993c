"""Opening the files that configs, the command line and run folders name (no MXNet import).

Every reader of such a file goes through here, so whatever the path turns out to be, the
outcome is a clear error rather than a hang, an endless read or a traceback:

* only regular files are read: a named pipe (FIFO) would block the open until some writer
  appears, a character device such as ``/dev/zero`` or ``/dev/urandom`` never ends, a folder
  has no bytes; the path is checked with ``stat`` before it is opened (so a FIFO's writer is
  never disturbed) and the opened file again with ``fstat`` (so a path swapped in between
  cannot slip through; the open itself does not wait, as it uses ``O_NONBLOCK``);
* an ``OSError`` is reported as what it is (permission denied, a name longer than the file
  system allows, a file where a folder should be), never as damaged content.

Callers turn :class:`UnusableFile` into their own error class and wording (``DataError`` for
data, ``ConfigError`` for configs, ``RunFolderError`` for run folders); :func:`require_file`
and :func:`read_file` do that for the usual "The <what> <path> <problem>." message.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, BinaryIO

from mxtrain.errors import DataError, MxtrainError

#: the problems of a path that does not exist and of a folder where a file was expected
MISSING = "does not exist"
DIRECTORY = "is a directory, not a file"
#: what an OSError's errno says about the path it names, completing "The file X ..."
_ERRNO_PROBLEMS = {
    errno.ENOENT: MISSING,
    errno.EISDIR: DIRECTORY,
    errno.ENOTDIR: "does not exist (a file stands where its path needs a folder)",
    errno.ENAMETOOLONG: "has a name longer than the file system allows",
    errno.ELOOP: "is a loop of symbolic links",
    errno.EACCES: "cannot be opened: permission denied",
    errno.EPERM: "cannot be opened: operation not permitted",
    errno.EROFS: "is on a read-only file system",
    errno.ENOSPC: "cannot be written: no space left on the device",
}
_ERRNO_HINTS = {
    errno.ENAMETOOLONG: "Use a shorter path (most file systems allow 255 bytes per name).",
    errno.ELOOP: "Point the link at a file.",
    errno.EACCES: "Check its permissions and those of its folders (ls -l), or run as a user "
    "who may use it.",
    errno.EPERM: "Check its permissions and those of its folders (ls -l).",
}
#: the hint for a data file that does not exist
RELATIVE_TO_CONFIG = "Relative paths are resolved against the config file's folder; fix the path."
_NOT_REGULAR_HINT = (
    "mxtrain reads regular files only (a pipe would keep it waiting, a device such as "
    "/dev/zero never ends): save the content to a file and name that file."
)


class UnusableFile(Exception):
    """A path that cannot be read as a regular file; ``problem`` completes "The file X ..."
    and ``hint`` (possibly empty) says what would fix it."""

    def __init__(self, path: str | os.PathLike[str], problem: str, hint: str = "") -> None:
        super().__init__(f"{os.fspath(path)} {problem}")
        self.path = os.fspath(path)
        self.problem = problem
        self.hint = hint

    @classmethod
    def from_os_error(cls, path: str | os.PathLike[str], exc: OSError) -> UnusableFile:
        """What ``exc`` (raised for ``path``) says: not damaged content, but the file."""
        return cls(path, *os_error_problem(exc))


def os_error_problem(exc: OSError) -> tuple[str, str]:
    """(problem, hint) for an OSError about a path: what the error says, not "damaged"."""
    problem = _ERRNO_PROBLEMS.get(exc.errno or 0)
    if problem is None:
        problem = f"cannot be used: {exc.strerror or exc}"
    return problem, _ERRNO_HINTS.get(exc.errno or 0, "")


def _type_problem(mode: int) -> str | None:
    """What is wrong with a file of this ``st_mode`` for reading its bytes (None: regular)."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return DIRECTORY
    if stat.S_ISFIFO(mode):
        return "is a named pipe (FIFO), not a regular file"
    if stat.S_ISCHR(mode):
        return "is a character device, not a regular file"
    if stat.S_ISBLK(mode):
        return "is a block device, not a regular file"
    if stat.S_ISSOCK(mode):
        return "is a socket, not a regular file"
    return "is not a regular file"


def entry_problem(path: str | os.PathLike[str], *, folder: bool = False) -> str | None:
    """What is wrong with ``path`` as a regular file (a folder with ``folder``), completing
    "The file X ..."; None when it is one or does not exist at all."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return None
    except OSError as exc:
        return os_error_problem(exc)[0]
    if not folder:
        return _type_problem(mode)
    if stat.S_ISDIR(mode):
        return None
    return "is a file, not a folder" if stat.S_ISREG(mode) else _type_problem(mode)


def _stat(path: str | os.PathLike[str]) -> os.stat_result:
    try:
        return os.stat(path)
    except ValueError:  # a NUL byte in the path
        raise UnusableFile(path, "has a NUL byte in its name") from None
    except OSError as exc:
        raise UnusableFile.from_os_error(path, exc) from None


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """``path`` opened for reading bytes; :class:`UnusableFile` unless it is a regular file
    this process may read."""
    problem = _type_problem(_stat(path).st_mode)
    if problem is not None:
        raise UnusableFile(path, problem, _NOT_REGULAR_HINT)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise UnusableFile.from_os_error(path, exc) from None
    try:
        problem = _type_problem(os.fstat(fd).st_mode)
        if problem is not None:  # replaced after the stat above
            raise UnusableFile(path, problem, _NOT_REGULAR_HINT)
        os.set_blocking(fd, True)
        return open(fd, "rb")  # the caller closes it
    except BaseException:
        os.close(fd)
        raise


def check_regular(path: str | os.PathLike[str]) -> None:
    """:class:`UnusableFile` unless ``path`` is a regular file this process may read (for
    readers that hand the path to a library: MXNet, RecordIO, NumPy archives)."""
    open_regular(path).close()


def read_regular(path: str | os.PathLike[str], limit: int | None = None) -> bytes:
    """The bytes of the regular file ``path`` (at most ``limit + 1`` when ``limit`` is given,
    so a caller can tell "too large"); :class:`UnusableFile` otherwise."""
    with open_regular(path) as handle:
        try:
            return handle.read() if limit is None else handle.read(limit + 1)
        except OSError as exc:
            raise UnusableFile.from_os_error(path, exc) from None


def as_error(
    exc: UnusableFile, what: str, error: type[MxtrainError] = DataError, missing_hint: str = ""
) -> MxtrainError:
    """``exc`` as "The <what> <path> <problem>." in ``error``'s class; ``missing_hint`` is the
    hint for a path that does not exist."""
    hint = missing_hint if exc.problem == MISSING else exc.hint
    return error(f"The {what} {exc.path} {exc.problem}.", hint=hint or None)


@contextlib.contextmanager
def _reported_as(what: str, error: type[MxtrainError], missing_hint: str) -> Iterator[None]:
    """Turn an :class:`UnusableFile` raised inside into ``error`` (see :func:`as_error`)."""
    try:
        yield
    except UnusableFile as exc:
        raise as_error(exc, what, error, missing_hint) from None


def require_file(
    path: Path, what: str, *, error: type[MxtrainError] = DataError, missing_hint: str = ""
) -> None:
    """``error`` naming ``path`` as "the <what>" unless it is a regular file we may read."""
    with _reported_as(what, error, missing_hint):
        check_regular(path)


def read_file(
    path: Path,
    what: str,
    *,
    error: type[MxtrainError] = DataError,
    missing_hint: str = "",
    limit: int | None = None,
) -> bytes:
    """The bytes of the regular file ``path`` (see :func:`read_regular`), else ``error``
    naming it as "the <what>"."""
    with _reported_as(what, error, missing_hint):
        return read_regular(path, limit)


def open_file(
    path: Path,
    what: str,
    *,
    error: type[MxtrainError] = DataError,
    missing_hint: str = "",
    encoding: str | None = None,
    newline: str | None = None,
) -> IO[Any]:
    """``path`` opened for reading (text when ``encoding`` is given), else ``error`` naming it
    as "the <what>"."""
    with _reported_as(what, error, missing_hint):
        handle = open_regular(path)
    if encoding is None:
        return handle
    return io.TextIOWrapper(handle, encoding=encoding, newline=newline)


def require_usable_path(
    path: Path, what: str, *, error: type[MxtrainError] = DataError, hint: str = ""
) -> None:
    """``error`` naming ``path`` as "the <what>" when it cannot even be looked up (a name
    longer than the file system allows, a loop of links, a folder that may not be searched);
    a path that does not exist passes: the caller says what that means."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return
    except ValueError:  # a NUL byte in the path
        raise error(f"The {what} {os.fspath(path)!r} has a NUL byte in its name.") from None
    except OSError as exc:
        problem = UnusableFile.from_os_error(path, exc)
        raise error(f"The {what} {path} {problem.problem}.", hint=problem.hint or hint) from None


def make_folder(path: Path, what: str, *, error: type[MxtrainError], hint: str) -> None:
    """Create the folder ``path`` and its parents (it may exist), else ``error`` naming it as
    "the <what>" and saying why (a parent that is a file, a read-only or virtual file system,
    no permission, a name too long)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if isinstance(exc, FileExistsError | NotADirectoryError):
            reason = "a file stands where it or one of its parents would be"
        else:  # ENOENT here: a file system that takes no new folders, such as /proc
            reason = exc.strerror or str(exc)
        raise error(f"The {what} {path} cannot be created: {reason}.", hint=hint) from None
