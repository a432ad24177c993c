"""Training's peak memory, estimated before the first batch, and ``fit.bucket_memory: auto``
sized to the machine.

The buckets bound at once each keep memory of their own (:mod:`mxtrain.memory_plan`), so
their bound sets the peak on data with many long buckets. ``auto`` is
:data:`~mxtrain.engine.bucket_pool.AUTO_BUCKET_MEMORY` (5 largest buckets' positions) where
that fits comfortably in the memory available at start, and otherwise the largest bound that
does (down to 1, the largest bucket alone). Whatever the setting, a run whose estimate
exceeds the available memory is warned before it starts, with the keys that would shrink it.
The bound never changes the numbers: a rebound bucket computes exactly what it did.
"""

from __future__ import annotations

import logging
from typing import Any

from mxtrain.config import Config
from mxtrain.memory_plan import (
    MemoryPlan,
    available_memory,
    bucket_kept_bytes,
    key_positions,
    resident_memory,
)

log = logging.getLogger("mxtrain")

#: the share of the available memory ``auto`` lets training grow into (the rest: other
#: processes, the page cache, the estimate's error)
AUTO_SHARE = 0.8


def plan_memory(
    config: Config, module: Any, train_iter: Any, contexts: list[Any]
) -> MemoryPlan | None:
    """Estimate the peak of training ``module`` (bound, its optimizer created) on
    ``train_iter``'s buckets, choose ``auto``'s bound from it, log both and warn when the
    estimate exceeds the available memory; None (and nothing done) for GPU contexts, whose
    memory is not the process's."""
    if any(getattr(c, "device_type", "cpu") != "cpu" for c in contexts):
        return None
    # deferred: the engine imports MXNet, which must load after the run's thread settings
    from mxtrain.engine.bucket_pool import AUTO_BUCKET_MEMORY

    plan = memory_plan(module, train_iter, len(contexts))
    setting = config.fit.bucket_memory
    factor: float | None = AUTO_BUCKET_MEMORY if setting == "auto" else setting
    if setting == "auto":
        factor = _auto_factor(plan, module, AUTO_BUCKET_MEMORY)
    _report(config, plan, factor, setting == "auto")
    return plan


def memory_plan(module: Any, train_iter: Any, devices: int) -> MemoryPlan:
    """The :class:`MemoryPlan` of ``module`` bound for ``train_iter``'s largest batch."""
    descs = [*train_iter.provide_data, *(getattr(train_iter, "provide_label", None) or [])]
    shapes = {d.name: tuple(d.shape) for d in descs}
    workspace, weights = bucket_kept_bytes(module.pool.default_symbol, shapes)
    workspace += module.output_gradient_bytes()
    default = key_positions(train_iter.default_bucket_key)
    keys = list(getattr(train_iter, "buckets", None) or [train_iter.default_bucket_key])
    return MemoryPlan(
        resident=resident_memory() or 0,
        shared=module.pending_bytes(),
        kept_largest=workspace,
        kept_each=weights * devices,
        all_buckets=sum(key_positions(k) for k in keys) / max(1, default),
        buckets=len(keys),
        available=available_memory(),
    )


def _auto_factor(plan: MemoryPlan, module: Any, auto: float) -> float:
    """``auto``'s bound: ``auto`` (5 largest buckets) where it fits within
    :data:`AUTO_SHARE` of the available memory, else the largest that does (at least 1);
    a bound below it returns freed memory at once."""
    if plan.available is None or plan.growth(auto) <= AUTO_SHARE * plan.available:
        return auto
    fitted = plan.largest_factor_within(AUTO_SHARE, auto)
    factor = 1.0 if fitted is None else max(1.0, round(fitted, 1))
    if factor >= plan.buckets_bound(auto):
        return auto  # every bucket fits either way
    module.set_bucket_memory(factor, strict=True)
    log.info(
        "fit.bucket_memory auto: %g x the largest bucket's positions (%g would keep "
        "%s more bound than the %s available can take)",
        factor,
        auto,
        _size(plan.growth(auto) - plan.growth(factor)),
        _size(plan.available),
    )
    return factor


def _report(config: Config, plan: MemoryPlan, factor: float | None, auto: bool) -> None:
    """Log the estimate; warn when it exceeds the available memory. Data in one bucket
    (not bucketed) has nothing for fit.bucket_memory to bound, which is then not named."""
    bucketed = plan.buckets > 1
    bound = "no bound" if factor is None else f"bucket_memory {factor:g}"
    kept = plan.growth(factor) - plan.shared
    parts = [
        f"process now {_size(plan.resident)}",
        f"executors' shared memory, gradients and optimizer state {_size(plan.shared)}",
        f"buckets' own memory {_size(kept)} under {bound}, {plan.buckets} buckets"
        if bucketed
        else f"the operators' own memory {_size(kept)}",
    ]
    log.info(
        "memory estimate: peak %s (%s)%s",
        _size(plan.peak(factor)),
        "; ".join(parts),
        f"; {_size(plan.available)} available" if plan.available is not None else "",
    )
    if plan.available is None or plan.growth(factor) <= plan.available:
        return
    smaller = (
        "Lower data.train.batch_size or the longest bucket (data.train.buckets, or the "
        "data's longest sequence) or the model's size"
        if bucketed
        else "Lower data.train.batch_size or the model's size"
    )
    tight = plan.growth(1.0)
    remedy = (
        f"Set fit.bucket_memory: 1.0 (the largest bucket alone: {_size(tight)} more than now)"
        if bucketed and tight <= plan.available and (factor is None or factor > 1)
        else smaller
    )
    if not bucketed:
        where, share = config.where("data", "train", "batch_size"), ""
    else:
        if auto:
            setting = f"auto ({factor:g} x the largest bucket)"
        else:
            setting = "null (no bound)" if factor is None else f"{factor:g}"
        where = config.where("fit", "bucket_memory")
        share = (
            f" ({_size(kept)} of it the memory of the buckets kept bound, under "
            f"fit.bucket_memory {setting})"
        )
    log.warning(
        "%s: training is estimated to grow by %s from here%s, but this machine has %s "
        "available: the run may be killed for lack of memory. %s. (The estimate counts the "
        "fused RNN operators' workspaces, the executors' planned memory, gradients and "
        "optimizer state.)",
        where,
        _size(plan.growth(factor)),
        share,
        _size(plan.available),
        remedy,
    )


def _size(nbytes: float | None) -> str:
    """``nbytes`` for the log: GiB from 1 GiB up, else MiB."""
    if nbytes is None:
        return "?"
    return f"{nbytes / 2**30:,.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:,.1f} MiB"
