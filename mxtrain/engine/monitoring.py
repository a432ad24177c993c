"""Looking inside a run: MXNet's profiler over a few batches, and weight/gradient statistics.

Both are off by default and cost nothing per batch when off: the training loop only calls them
when ``fit.profile`` or ``fit.monitor`` is set, and the monitor reads arrays back (a sync point)
only on its own interval. Neither writes run files: they hand the summary text and the records
to the writers their caller gives them (MXNet's profiler writes its trace file itself).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mxnet as mx

__all__ = ["BatchProfiler", "ParameterMonitor"]

_LOG = logging.getLogger("mxtrain")


@dataclass
class BatchProfiler:
    """Record ``batches`` training batches with MXNet's profiler.

    The first ``skip`` batches of the process are left out (the first one binds executors and
    allocates memory, which is not what a profile of steady-state training should show). Once
    the last recorded batch has finished, MXNet writes the trace to ``trace_file`` (viewable
    in chrome://tracing or ui.perfetto.dev) and the per-operator summary table goes to
    ``keep_summary``, which writes it and returns where.
    """

    trace_file: Path
    batches: int
    keep_summary: Callable[[str], Path]
    skip: int = 1
    _running: bool = field(default=False, init=False)
    _done: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        if self.batches < 1:
            raise ValueError(f"batches must be at least 1, got {self.batches}")

    def before_batch(self, trained: int) -> None:
        """Called before a batch when ``trained`` batches ran in this process so far."""
        if self._done or self._running or trained != self.skip:
            return
        self.trace_file.parent.mkdir(parents=True, exist_ok=True)  # MXNet does not make it
        mx.nd.waitall()  # earlier batches must not leak into the recorded window
        mx.profiler.set_config(
            profile_symbolic=True,
            profile_imperative=True,
            profile_memory=False,
            profile_api=False,
            aggregate_stats=True,
            filename=str(self.trace_file),
        )
        mx.profiler.set_state("run")
        self._running = True
        _LOG.info(
            "profiling batches %d-%d with MXNet's profiler", trained + 1, trained + self.batches
        )

    def after_batch(self, trained: int) -> None:
        """Called after a batch; ``trained`` now counts it."""
        if self._running and trained >= self.skip + self.batches:
            self.finish()

    def finish(self) -> None:
        """Stop recording and hand over the summary (also when training ends before the last
        batch)."""
        if not self._running:
            return
        mx.nd.waitall()
        mx.profiler.set_state("stop")
        mx.profiler.dump()  # closes the trace; MXNet allows one such profile per process
        summary_file = self.keep_summary(mx.profiler.dumps(reset=True, sort_by="total"))
        self._running = False
        self._done = True
        _LOG.info(
            "profile written to %s (open it in chrome://tracing or https://ui.perfetto.dev); "
            "per-operator totals in %s",
            self.trace_file,
            summary_file,
        )


def _norm(array: Any) -> float:
    return float(mx.nd.norm(array).asscalar())


class ParameterMonitor:
    """Every ``interval`` batches, log norms of the weights and gradients whose names match.

    ``pattern`` is a regular expression searched in each parameter name. Statistics are taken
    after the backward pass and before the update, on the first device's copy: the weight norm,
    the gradient norm, their ratio (how big a step the optimizer sees relative to the weight)
    and the largest absolute gradient. A non-finite gradient is called out by name. Each
    record (one per parameter) also goes to ``keep_records`` when given.
    """

    def __init__(
        self,
        pattern: str,
        interval: int,
        keep_records: Callable[[list[dict[str, Any]]], None] | None = None,
    ) -> None:
        if interval < 1:
            raise ValueError(f"interval must be at least 1, got {interval}")
        self.regex = re.compile(pattern)
        self.interval = interval
        self.keep_records = keep_records

    def due(self, trained: int) -> bool:
        """Whether the batch about to be counted as number ``trained + 1`` is monitored."""
        return (trained + 1) % self.interval == 0

    def record(self, module: Any, epoch: int, batch: int) -> list[dict[str, Any]]:
        """Log and return the statistics of the matching parameters right now."""
        rows = []
        for name in module.param_names:
            if not self.regex.search(name):
                continue
            weight = module.param_array(name)
            grad = module.grad_array(name)
            if grad is not None and grad.stype == "row_sparse":
                grad = grad.data  # the stored rows: the others are 0 (model.sparse_embedding)
            row: dict[str, Any] = {"epoch": epoch, "batch": batch, "param": name}
            row["weight_norm"] = _norm(weight)
            if grad is not None:
                row["grad_norm"] = _norm(grad)
                row["grad_max_abs"] = float(mx.nd.max(mx.nd.abs(grad)).asscalar())
                row["grad_to_weight"] = (
                    row["grad_norm"] / row["weight_norm"] if row["weight_norm"] > 0 else None
                )
            rows.append(row)
        if not rows:
            _LOG.warning("fit.monitor.pattern %r matches no parameter", self.regex.pattern)
        for row in rows:
            text = (
                f"monitor epoch {epoch} batch {batch} {row['param']}: |w|={row['weight_norm']:.4g}"
            )
            if "grad_norm" in row:
                ratio = row["grad_to_weight"]
                text += f" |g|={row['grad_norm']:.4g} max|g|={row['grad_max_abs']:.4g}" + (
                    f" |g|/|w|={ratio:.3g}" if ratio is not None else ""
                )
                if not math.isfinite(row["grad_norm"]):
                    text += "  <- non-finite gradient"
            _LOG.info(text)
        if self.keep_records is not None and rows:
            self.keep_records(rows)
        return rows
