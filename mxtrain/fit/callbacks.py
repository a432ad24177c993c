"""``fit.callbacks``: user code called while a run trains (the fourth plugin kind).

A callback is a class or factory (``file.py:attr`` / ``package.module:attr``) called with the
entry's options; what it returns may define any of these methods, each taking one
:class:`CallbackContext`:

``on_batch_end``  after every batch (its update done)
``on_interval``   every ``fit.log_interval`` batches: ``ctx.metrics`` holds the interval's
                  training metrics, ``ctx.lr`` the learning rate
``on_eval_end``   after every evaluation (``fit.eval_interval``'s and the epoch's):
                  ``ctx.eval``
``on_checkpoint`` after a checkpoint is saved: ``ctx.checkpoint`` (its tag),
                  ``ctx.checkpoint_path``
``on_epoch_end``  after the epoch, its evaluation and its checkpoint: ``ctx.metrics`` (the
                  epoch's training metrics), ``ctx.eval``, ``ctx.checkpoint``

The context is read-only: the position (``epoch``, ``batch``, ``updates``), the values above
and ``ctx.module``, a view that copies parameters out (:class:`ModuleView`).
``ctx.request_stop(reason)`` ends training like early stopping: after the current batch
(at the next log interval or epoch end on distributed runs, where every worker must stop
together), with a final checkpoint; the run finishes normally and says why.

On distributed runs callbacks run on rank 0 only, unless the object has ``all_ranks =
True``. An exception in a callback stops the run with an error naming the callback and the
method (exit code 2); checkpoints already saved stay.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from mxtrain.config.schema import CallbackSection
from mxtrain.errors import ConfigError
from mxtrain.fit.run_hooks import EpochEnd, RunHook
from mxtrain.registry import CALLBACKS, Entry
from mxtrain.run.checkpoint import Checkpoint

if TYPE_CHECKING:  # annotations only: MXNet must load after the run's thread settings
    from mxtrain.engine.bucketing import BucketingModule
    from mxtrain.engine.loop import IntervalRecord, Position

log = logging.getLogger("mxtrain")

_KEPT = (
    "The checkpoints saved so far stay: after the fix, `mxtrain resume` continues from the "
    "last one."
)

EVENTS = ("on_batch_end", "on_interval", "on_eval_end", "on_checkpoint", "on_epoch_end")


class ModuleView:
    """Read-only access to the module being trained: copies, never the live arrays."""

    def __init__(self, module: BucketingModule | None) -> None:
        self._module: Any = module

    @property
    def param_names(self) -> list[str]:
        return list(self._module.param_names)

    @property
    def output_names(self) -> list[str]:
        return list(self._module.output_names)

    def get_params(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(parameters, auxiliary states) as NumPy copies, by name."""
        arg, aux = self._module.get_params()
        return (
            {k: v.asnumpy() for k, v in arg.items()},
            {k: v.asnumpy() for k, v in aux.items()},
        )


class CallbackContext:
    """What a callback method sees (read-only), and its way to ask for a stop."""

    def __init__(self, runner: CallbackRunner, event: str, **values: Any) -> None:
        self._runner = runner
        self.event = event
        self.epoch: int = values.get("epoch", 0)  # 1-based, the epoch being trained
        self.batch: int = values.get("batch", 0)  # batches of this epoch done
        metrics = values.get("metrics")
        evaluation = values.get("eval")
        self.metrics: Mapping[str, float] = MappingProxyType(dict(metrics or {}))
        self.eval: Mapping[str, float] | None = (
            MappingProxyType(dict(evaluation)) if evaluation is not None else None
        )
        self.lr: float | None = values.get("lr")
        self.checkpoint: str | None = values.get("checkpoint")
        self.checkpoint_path: str | None = values.get("checkpoint_path")
        self.rank: int = runner.rank
        self.module = runner.module_view

    @property
    def updates(self) -> int:
        """Optimizer updates so far (restored on resume)."""
        optimizer = getattr(self._runner.module, "optimizer", None)
        return int(getattr(optimizer, "num_update", 0) or 0)

    def request_stop(self, reason: str = "") -> None:
        """End training at the next point where it may stop, with a final checkpoint."""
        self._runner.request_stop(self._runner.current, str(reason))


class CallbackRunner(RunHook):
    """The run's callbacks (``fit.callbacks``): one member of the run's hooks, which turns
    the hook events into the callback methods above."""

    def __init__(
        self,
        sections: Sequence[CallbackSection],
        base_dir: Path,
        module: BucketingModule | None,
        *,
        rank: int = 0,
    ) -> None:
        self.module = module
        self.module_view = ModuleView(module)
        self.rank = rank
        self.stop_reason: str | None = None
        self.current = ""  # the callback being called, for stop requests and errors
        #: (where, entry, callback): where names the entry (``fit.callbacks[0] (x.py:C)``)
        self.callbacks: list[tuple[str, Entry, Any]] = []
        for i, section in enumerate(sections):
            where = f"fit.callbacks[{i}] ({section.name})"
            entry = CALLBACKS.get(section.name, base_dir=base_dir, where=where)
            factory = entry.load()
            with entry.calling("it was created", f"fit.callbacks[{i}]"):
                # callbacks are plugins: their options are the section's other keys, as written
                options = section.options if isinstance(section.options, Mapping) else {}
                callback = factory(**options)
            if not any(callable(getattr(callback, e, None)) for e in EVENTS):
                raise ConfigError(
                    f"{where} defines none of the callback methods {', '.join(EVENTS)}.",
                    hint="Give it at least one, e.g. def on_epoch_end(self, ctx): ...",
                )
            if rank == 0 or getattr(callback, "all_ranks", False):
                self.callbacks.append((where, entry, callback))
        self.wants = {
            e: any(callable(getattr(c, e, None)) for _, _, c in self.callbacks) for e in EVENTS
        }

    def request_stop(self, who: str, reason: str) -> None:
        if self.stop_reason is None:
            self.stop_reason = f"{who} asked to stop" + (f": {reason}" if reason else "")
            log.info("%s; training ends at the next point where it may stop", self.stop_reason)

    def finish_requested(self) -> bool:
        return self.stop_reason is not None

    def call(self, event: str, **values: Any) -> None:
        if not self.wants[event]:
            return
        for where, entry, callback in self.callbacks:
            method = getattr(callback, event, None)
            if not callable(method):
                continue
            self.current = where
            doing = (
                f"calling {event} (epoch {values.get('epoch', 0)}, batch {values.get('batch', 0)})"
            )
            # a bug in the callback: named, and what was saved is kept
            with entry.calling(doing, where.partition(" ")[0], hint=_KEPT):
                method(CallbackContext(self, event, **values))

    def on_batch_end(self, epoch: int, batch: int) -> None:
        self.call("on_batch_end", epoch=epoch, batch=batch)

    def on_interval(self, record: IntervalRecord) -> None:
        self.call(
            "on_interval",
            epoch=record.epoch,
            batch=record.batch,
            metrics=record.metrics,
            lr=record.lr,
        )

    def on_eval(self, epoch: int, batch: int, values: dict[str, float], seconds: float) -> None:
        self.call("on_eval_end", epoch=epoch, batch=batch, eval=values)

    def on_checkpoint(self, saved: Checkpoint, position: Position) -> None:
        self.call(
            "on_checkpoint",
            epoch=position.epoch,
            batch=position.batch,
            checkpoint=saved.tag,
            checkpoint_path=str(saved.path),
        )

    def on_epoch_done(self, end: EpochEnd) -> None:
        result, saved = end.result, end.saved
        values = {"epoch": result.epoch, "batch": result.train.batch}
        if result.eval is not None:
            self.call("on_eval_end", eval=result.eval, **values)
        if saved is not None:
            self.on_checkpoint(saved, result.position)
        self.call(
            "on_epoch_end",
            metrics=result.train.metrics,
            eval=result.eval,
            lr=result.train.lr,
            checkpoint=saved.tag if saved is not None else None,
            checkpoint_path=str(saved.path) if saved is not None else None,
            **values,
        )
