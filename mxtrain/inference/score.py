"""``mxtrain score``: the config's metrics of a checkpoint over its eval data or a file."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mxtrain.build import build_metric
from mxtrain.inference.open import open_run
from mxtrain.inference.output import finite_or_none
from mxtrain.run.plugin_files import uses_kept_plugins

log = logging.getLogger("mxtrain")


@dataclass
class ScoreReport:
    """What ``mxtrain score`` prints."""

    run: Path
    epoch: int
    data: str
    metrics: dict[str, float]
    seconds: float = 0.0
    checkpoint: str | None = None  # the tag loaded, or the params file's name without one
    batch: int = 0  # batches of the next epoch in the checkpoint (mid-epoch)
    max_batches: int | None = None  # only the first N batches were scored (None: all)

    def to_json(self) -> dict[str, Any]:
        """``{"run", "epoch", "batch", "checkpoint", "data", "max_batches", "metrics"}``;
        non-finite values become null."""
        return {
            "run": str(self.run),
            "epoch": self.epoch,
            "batch": self.batch,
            "checkpoint": self.checkpoint,
            "data": self.data,
            "max_batches": self.max_batches,
            "metrics": {k: finite_or_none(v) for k, v in self.metrics.items()},
        }


@uses_kept_plugins
def score_checkpoint(
    ref: str | os.PathLike[str],
    *,
    epoch: int | None = None,
    data: str | os.PathLike[str] | None = None,
    batch_size: int | None = None,
    overrides: Sequence[str] = (),
    max_batches: int | None = None,
    target: str | os.PathLike[str] | None = None,
) -> ScoreReport:
    """Score a run's checkpoint with its evaluation metrics (``fit.eval_metrics``, else
    ``fit.metrics``; see :func:`score_run`), over the first ``max_batches`` batches only
    when given (a quick estimate). ``target``: the target side of a parallel ``data`` file."""
    started = time.perf_counter()
    opened = open_run(
        ref,
        epoch=epoch,
        overrides=overrides,
        batch_size=batch_size,
        data=data,
        role="eval",
        target=target,
    )
    # deferred: MXNet reads its thread settings when it loads (devices.configure_threads first)
    from mxtrain.engine.loop import MetricSet, score

    config = opened.config
    data_info = opened.data_iter.data_info
    names = config.fit.device_evaluation_metrics  # decoding metrics are scored on decoded text
    metrics = MetricSet([build_metric(n, data_info, config.base_dir) for n in names])
    values = score(
        opened.module,
        opened.data_iter,
        metrics,
        max_batches=max_batches,
        prefetch=config.fit.prefetch,
    )
    chosen = opened.checkpoint
    report = ScoreReport(
        opened.run.path,
        opened.epoch,
        opened.data_source,
        values,
        seconds=time.perf_counter() - started,
        checkpoint=chosen.describe() if chosen is not None else None,
        batch=chosen.batch if chosen is not None else 0,
        max_batches=max_batches,
    )
    part = f" (first {max_batches} batches at most)" if max_batches is not None else ""
    log.info("scored %s%s in %.1fs", opened.data_source, part, report.seconds)
    return report


def score_run(
    ref: str | os.PathLike[str],
    *,
    epoch: int | None = None,
    data: str | os.PathLike[str] | None = None,
    batch_size: int | None = None,
    overrides: Sequence[str] = (),
) -> dict[str, float]:
    """The config's evaluation metrics of a checkpoint over ``data.eval`` (or the file
    ``data``).

    Over ``data.eval`` this is the value fit logged for that epoch in metrics.jsonl (all of the
    data is scored: if fit ran with ``fit.eval_max_batches``, fit scored only part of it). The
    batch size and devices do not change the value beyond float rounding.
    """
    return score_checkpoint(
        ref, epoch=epoch, data=data, batch_size=batch_size, overrides=overrides
    ).metrics
