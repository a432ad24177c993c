"""``mxtrain lr-find``: the learning-rate range test of a config, written to a PNG file.

The config's model, data, devices and optimizer are set up as ``fit`` sets them up (its
initializer and warm start included), minus what only a run needs: no evaluation data, no
schedule (the test sets every rate), no callbacks, TensorBoard or checkpoints, and the updates
on this process. Nothing is written to any run folder.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mxtrain.config import Config, load_config
from mxtrain.errors import ConfigError

log = logging.getLogger("mxtrain")

#: ``--set`` values that turn a config into the test's: what a run needs and the test must not do
TEST_OVERRIDES = (
    "data.eval=null",
    "optimizer.lr_scheduler=null",
    "fit.eval_metrics=null",
    "fit.decode_eval=null",
    "fit.early_stopping=null",
    "fit.eval_interval=null",
    "fit.callbacks=[]",
    "fit.grad_accumulation=1",
    "fit.profile=null",
    "fit.monitor=null",
    "checkpoint.best_metric=null",
    "logging.tensorboard=false",
    "kvstore.update_on_kvstore=false",
)


@dataclass(frozen=True)
class LrFindResult:
    """What the test found: its points, the suggested rate, why it stopped early."""

    points: list[Any]  # engine.lr_range.RangePoint
    suggested: float | None
    stopped: str | None  # "diverged", or None when every update ran
    min_loss_lr: float

    def to_json(self) -> dict[str, Any]:
        return {
            "suggested_lr": self.suggested,
            "min_loss_lr": self.min_loss_lr,
            "updates": len(self.points),
            "stopped": self.stopped,
            "points": [
                {"update": p.update, "lr": p.lr, "loss": p.loss, "smoothed": p.smoothed}
                for p in self.points
            ],
        }


def range_test_config(config_file: str | Path, overrides: Sequence[str]) -> Config:
    """The config of the test: the user's, with :data:`TEST_OVERRIDES` after their own."""
    config = load_config(config_file, [*overrides, *TEST_OVERRIDES])
    if config.kvstore.type.startswith("dist"):
        raise ConfigError(
            f"{config.where('kvstore', 'type')}: lr-find runs in one process, but "
            f"kvstore.type is {config.kvstore.type}.",
            hint="Run it with --set kvstore.type=local (the rate found holds for the same "
            "batch size per update).",
        )
    return config


def find_learning_rate(
    config_file: str | Path,
    overrides: Sequence[str],
    *,
    start: float,
    end: float,
    updates: int,
) -> LrFindResult:
    """Run the range test of ``config_file`` (with ``overrides``) from ``start`` to ``end``
    over ``updates`` updates."""
    from mxtrain.devices import prepare_process

    config = range_test_config(config_file, overrides)
    threads, context = prepare_process(config.context, measure=True)  # before MXNet loads
    config = dataclasses.replace(config, context=context)
    # deferred: MXNet reads its thread settings when it loads (prepare_process first)
    from mxtrain.build import build_metric
    from mxtrain.engine.loop import MetricSet
    from mxtrain.engine.lr_range import lr_range_test, suggest
    from mxtrain.fit.setup import prepare_training

    setup = prepare_training(config, threads)
    data_info = setup.train_iter.data_info

    def perplexity() -> MetricSet:
        return MetricSet([build_metric("perplexity", data_info, config.base_dir)])

    log.info("lr-find: %d updates from lr %g to %g", updates, start, end)
    points, stopped = lr_range_test(
        setup.module,
        setup.train_iter,
        perplexity,
        start=start,
        end=end,
        updates=updates,
        seed=config.experiment.seed,
    )
    lowest = min(points, key=lambda p: p.smoothed)
    return LrFindResult(points, suggest(points), stopped, lowest.lr)
