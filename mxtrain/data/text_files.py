"""Reading a UTF-8 data file with errors that say what to fix (no MXNet import)."""

from __future__ import annotations

from pathlib import Path

from mxtrain.errors import DataError
from mxtrain.user_files import (
    DIRECTORY,
    MISSING,
    RELATIVE_TO_CONFIG,
    UnusableFile,
    read_regular,
)


def read_data_text(path: Path, source: str, *, expected: str, fix_path: str = "") -> str:
    """The UTF-8 text of the data file ``path`` (a BOM is dropped), configured as ``source``.

    A missing, unreadable or non-UTF-8 file raises :class:`DataError` naming the file (and
    ``source`` when it differs), and for bad bytes the line, as ``path:line``. ``expected`` says
    what the file should be ("a CoNLL file"); ``fix_path`` adds another way out when the file
    does not exist ("or use treebank:train|valid|test").
    """
    named = f" (source {source!r})" if str(path) != source else ""
    try:
        raw = read_regular(path)
    except UnusableFile as exc:
        if exc.problem == MISSING:
            hint = f"{RELATIVE_TO_CONFIG[:-1]} {fix_path}." if fix_path else RELATIVE_TO_CONFIG
        elif exc.problem == DIRECTORY:
            hint = f"Point source at {expected}."
        else:
            hint = exc.hint
        raise DataError(f"The data file {path}{named} {exc.problem}.", hint=hint or None) from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        suffix = path.suffix or ".txt"
        raise DataError(
            f"{path}:{line}: not UTF-8 text (line {line} has the invalid byte "
            f"{raw[exc.start : exc.start + 1]!r}){named}.",
            hint=f"Convert it, e.g. 'iconv -f latin1 -t utf-8 in{suffix} > out{suffix}'.",
        ) from None
