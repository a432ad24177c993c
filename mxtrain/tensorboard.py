"""TensorBoard event files for people who watch runs in TensorBoard (``logging.tensorboard``).

The writer is tensorboardX, an optional extra (``pip install 'mxtrain[tensorboard]'``). The
x axis is the optimizer's update count, which a resumed run continues, so the curves of a
run and of its resumes join up. Nothing here runs per batch: scalars are written at log
intervals, evaluations and epoch ends, from figures the loop has already read back.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mxtrain.errors import ConfigError

__all__ = ["ScalarLog", "require_writer"]

FOLDER = "tensorboard"


def require_writer() -> None:
    """Raise a ConfigError saying how to install the writer when it is missing."""
    try:
        import tensorboardX  # noqa: F401 (optional dependency: the [tensorboard] extra)
    except ImportError:
        raise ConfigError(
            "logging.tensorboard is true but the TensorBoard writer (tensorboardX) is not "
            "installed.",
            hint="Install it with `pip install 'mxtrain[tensorboard]'`, or set "
            "logging.tensorboard: false.",
        ) from None


class ScalarLog:
    """Scalars of one run folder, under ``RUN/tensorboard/``."""

    def __init__(self, run_path: Path) -> None:
        from tensorboardX import SummaryWriter  # optional dependency: the [tensorboard] extra

        self.folder = run_path / FOLDER
        self._writer = SummaryWriter(logdir=str(self.folder))

    def scalars(self, prefix: str, values: Mapping[str, Any], step: int) -> None:
        """``prefix/name`` for each finite number in ``values``."""
        for name, value in values.items():
            if isinstance(value, int | float) and math.isfinite(value):
                self._writer.add_scalar(f"{prefix}/{name}", float(value), step)

    def close(self) -> None:
        self._writer.close()
