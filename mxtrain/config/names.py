"""Rules for config values that become file and folder names (run names, checkpoint prefixes).

Checked when a config is loaded (``experiment.name``, ``checkpoint.prefix``) and for
``--name`` before a run folder is created, so a name the OS refuses is a config error.
"""

from __future__ import annotations

#: Longest run name in UTF-8 bytes: file systems allow 255 per name, and a run replaced with
#: --force is kept as ``.<name>.replaced-YYYYmmdd-HHMMSS`` (25 more bytes) until the new one ends.
MAX_RUN_NAME_BYTES = 200


def run_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a run folder name (the config's and ``--name``'s one check), or None.

    Names are one plain path component the OS accepts: not empty, not ``.``/``..``, no
    slashes, no control characters, valid UTF-8 (lone surrogates from undecodable
    command-line bytes are refused) and at most :data:`MAX_RUN_NAME_BYTES` bytes.
    """
    if not name.strip():
        return "must not be empty."
    if name in (".", "..") or "/" in name or "\\" in name:
        return f"is used as a folder name and cannot be '.', '..' or contain slashes, got {name!r}."
    bad = [c for c in name if ord(c) < 0x20 or ord(c) == 0x7F]
    if bad:
        return f"cannot contain control characters such as {bad[0]!r}, got {name!r}."
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        return f"must be valid UTF-8 text (it holds undecodable bytes), got {name!r}."
    if size > MAX_RUN_NAME_BYTES:
        return f"is {size} bytes long; run folder names may have at most {MAX_RUN_NAME_BYTES}."
    return None
