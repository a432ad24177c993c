"""Writing model checkpoints into the run folder in MXNet's standard format.

``<prefix>-symbol.json`` and ``<prefix>-NNNN.params`` load with ``mx.mod.Module.load``.
Every file is written under a temporary name and renamed into place, so a crash while
saving leaves the previous checkpoints intact and no half-written file under a real name.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mxtrain.rundir import RunFolder


def _temporary(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def _commit(tmp: Path, path: Path) -> None:
    with open(tmp, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def save_symbol(module: Any, run: RunFolder, prefix: str) -> Path:
    """Save the default bucket's symbol as ``<prefix>-symbol.json``."""
    path = run.symbol_file(prefix)
    tmp = _temporary(path)
    module.symbol.save(str(tmp))
    _commit(tmp, path)
    return path


def save_params(module: Any, run: RunFolder, prefix: str, epoch: int) -> Path:
    """Save the module's parameters as ``<prefix>-<epoch:04d>.params``."""
    path = run.params_file(prefix, epoch)
    tmp = _temporary(path)
    module.save_params(str(tmp))
    _commit(tmp, path)
    return path
