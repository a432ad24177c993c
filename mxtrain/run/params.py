"""MXNet parameter files: the one reader of ``arg:NAME`` / ``aux:NAME`` array files.

Checkpoints (``params.nd``), the top-level ``<prefix>-NNNN.params`` files and the module's own
``load_params`` all read through :func:`read_params`; each caller words the error for its
reader (a checkpoint falls back to an older one, ``score`` names the epoch to pick instead).
"""

from __future__ import annotations

import os
from typing import Any

from mxtrain.user_files import UnusableFile, check_regular


class ParamsFileError(ValueError):
    """A parameter file that cannot be used; ``problem`` completes "the file ...".

    ``kind`` says which problem: ``unreadable`` (MXNet refused the file; ``detail`` is its
    reason), ``unnamed`` (arrays without names), ``entry`` (a name that is neither ``arg:``
    nor ``aux:``; ``detail`` is the name) or ``empty`` (no arrays at all).
    """

    def __init__(self, kind: str, problem: str, detail: str = "") -> None:
        super().__init__(problem)
        self.kind = kind
        self.problem = problem
        self.detail = detail


def mxnet_reason(exc: BaseException) -> str:
    """The useful last line of an MXNet error ("Check failed: ...: Invalid NDArray file")."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    return lines[-1].removeprefix("MXNetError: ").rstrip(".")


def load_named_arrays(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Every array of an ``mx.nd.save`` file by name (``{}`` for a saved empty dict)."""
    import mxnet as mx

    try:
        check_regular(path)  # MXNet would hang on a FIFO and call unreadable files damaged
    except UnusableFile as exc:
        raise ParamsFileError("unreadable", exc.problem, exc.problem) from None
    try:
        loaded = mx.nd.load(os.fspath(path))
    except (mx.base.MXNetError, OSError) as exc:
        reason = mxnet_reason(exc)
        raise ParamsFileError("unreadable", f"cannot be read by MXNet ({reason})", reason) from exc
    if isinstance(loaded, list):
        if loaded:
            raise ParamsFileError("unnamed", "holds arrays without names")
        return {}  # mx.nd.save of an empty dict loads as []
    return dict(loaded)


def read_params(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(arg_params, aux_params)`` of a parameter file whose every entry is named
    ``arg:NAME`` or ``aux:NAME``; :class:`ParamsFileError` says what is wrong otherwise."""
    args: dict[str, Any] = {}
    auxs: dict[str, Any] = {}
    for key, value in load_named_arrays(path).items():
        kind, _, name = key.partition(":")
        if kind == "arg":
            args[name] = value
        elif kind == "aux":
            auxs[name] = value
        else:
            raise ParamsFileError("entry", f"has the entry {key!r} (expected arg:/aux: names)", key)
    if not args and not auxs:
        raise ParamsFileError("empty", "holds no parameters")
    return args, auxs
