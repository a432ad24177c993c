"""Which config keys may change when a run is resumed, and the diff against the saved config.

Everything that shapes the model, the data order or the optimizer state must match the
saved run, or the continuation is not the same experiment. Keys that only steer how long
to train, how to evaluate, log and keep checkpoints, or how fast to run, may change.
A few that alter the trajectory but are legitimate for fine-tuning (learning rate, its
schedule, weight decay, clipping) may change too; the diff makes the change visible.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

#: Dotted-key patterns (fnmatch) that may differ from the saved config on resume.
MAY_CHANGE: tuple[str, ...] = (
    "experiment.name",
    "experiment.runs_dir",
    "fit.num_epoch",
    "fit.log_interval",
    "fit.prefetch",
    "fit.bucket_memory",
    "fit.eval_max_batches",
    "fit.metrics",
    "fit.eval_metrics",
    "fit.decode_eval",  # how evaluations decode: scores only, not the trained numbers
    "fit.decode_eval.*",
    "fit.callbacks",
    "fit.eval_interval",
    "fit.early_stopping",
    "fit.early_stopping.*",
    "fit.max_updates",
    "fit.max_time",
    "fit.profile",
    "fit.monitor",
    "fit.monitor.*",
    "kvstore.watchdog_seconds",
    "logging.*",
    "tracking.*",
    "data.eval",
    "data.eval.*",
    "optimizer.learning_rate",
    "optimizer.lr_scheduler",
    "optimizer.lr_scheduler.*",
    "optimizer.wd",
    "optimizer.clip_gradient",
    "optimizer.lr_mult",  # e.g. un-freezing a pretrained layer later in a fine-tuning run
    "optimizer.lr_mult.*",
    "optimizer.wd_mult",
    "optimizer.wd_mult.*",
    "initializer.*",  # parameters come from the checkpoint, not the initializer
    "context.omp_threads",
    "context.engine_threads",
    "context.large_buffers",  # where freed memory goes: no effect on the numbers
    "context.omp_wait_policy",
    "context.work_load",
    "checkpoint.period",
    "checkpoint.keep_last",
    "checkpoint.best_metric",
    "checkpoint.best_mode",
)


def may_change(key: str) -> bool:
    """True if the dotted ``key`` may differ from the saved config when resuming."""
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in MAY_CHANGE)


@dataclass(frozen=True)
class ConfigChange:
    """One key whose value differs between the saved and the requested config."""

    key: str
    saved: Any
    requested: Any

    @property
    def allowed(self) -> bool:
        return may_change(self.key)

    def describe(self) -> str:
        verdict = "may change" if self.allowed else "must match"
        return f"{self.key}: {self.saved!r} -> {self.requested!r} ({verdict})"


def _flatten(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, Mapping) and value:
        for key, inner in value.items():
            yield from _flatten(inner, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, value


#: keys whose ``auto`` a run resolves by measuring its machine (mxtrain.kernel_choices)
MEASURED_KEYS = frozenset(
    {
        "model.loss",
        "model.cell",
        "context.large_buffers",
        "context.omp_threads",
        "context.omp_wait_policy",
    }
)


def diff_configs(saved: Mapping[str, Any], requested: Mapping[str, Any]) -> list[ConfigChange]:
    """Keys whose values differ, in the order of the requested config.

    Both arguments are plain dicts as produced by ``config_to_dict``. A whole section that
    appears or disappears (``data.eval: null``) is one change under the section's key.
    """
    old = dict(_flatten(saved))
    new = dict(_flatten(requested))
    changes: list[ConfigChange] = []
    for key in list(new) + [k for k in old if k not in new]:
        if key in old and key in new and old[key] == new[key]:
            continue
        if key in MEASURED_KEYS and "auto" in (old.get(key), new.get(key)):
            continue  # a run records what auto chose on its machine: not a change
        key = _covering(key, old, new)
        if not any(c.key == key for c in changes):
            changes.append(ConfigChange(key, value_at(saved, key), value_at(requested, key)))
    return changes


def _covering(key: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """The shortest prefix of ``key`` that is a leaf on one side only (a section set to
    null on one side and filled on the other), else ``key`` itself."""
    parts = key.split(".")
    for i in range(1, len(parts)):
        prefix = ".".join(parts[:i])
        if (prefix in old) != (prefix in new):
            return prefix
    return key


def value_at(tree: Mapping[str, Any] | None, dotted: str) -> Any:
    """The value at a dotted key of a plain config tree, or None when absent."""
    value: Any = tree
    for part in dotted.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value
