"""Optimizer, learning-rate scheduler and initializer specs -> MXNet objects."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_SCHEDULER_CLASSES = {
    "factor": "FactorScheduler",
    "multifactor": "MultiFactorScheduler",
    "poly": "PolyScheduler",
    "cosine": "CosineScheduler",
}
_INITIALIZER_CLASSES = {
    "xavier": "Xavier",
    "uniform": "Uniform",
    "normal": "Normal",
    "orthogonal": "Orthogonal",
    "zero": "Zero",
    "one": "One",
}


def build_lr_scheduler(spec: Any, base_lr: float) -> Any:
    """An ``mx.lr_scheduler`` object, or None when ``spec`` is None.

    The scheduler starts from the optimizer's learning rate (``base_lr``), so the config
    never has two competing values for it.
    """
    if spec is None:
        return None
    import mxnet as mx

    warmup = {
        "warmup_steps": spec.warmup_steps,
        "warmup_begin_lr": spec.warmup_begin_lr,
        "warmup_mode": spec.warmup_mode,
    }
    cls = getattr(mx.lr_scheduler, _SCHEDULER_CLASSES[spec.type])
    if spec.type == "factor":
        return cls(
            step=spec.step,
            factor=spec.factor,
            stop_factor_lr=spec.stop_factor_lr,
            base_lr=base_lr,
            **warmup,
        )
    if spec.type == "multifactor":
        return cls(step=list(spec.steps), factor=spec.factor, base_lr=base_lr, **warmup)
    if spec.type == "poly":
        return cls(
            max_update=spec.max_update,
            base_lr=base_lr,
            pwr=spec.pwr,
            final_lr=spec.final_lr,
            **warmup,
        )
    return cls(max_update=spec.max_update, base_lr=base_lr, final_lr=spec.final_lr, **warmup)


def optimizer_arguments(spec: Any) -> tuple[str, dict[str, Any]]:
    """(optimizer name, keyword parameters) for ``BucketingModule.init_optimizer``.

    ``rescale_grad: auto`` is left out so the module sets it to 1/batch size, as MXNet does.
    Importing mxtrain.optimizers registers the optimizers mxtrain adds (adamw).
    """
    import mxtrain.optimizers  # noqa: F401

    params: dict[str, Any] = {"learning_rate": spec.learning_rate, "wd": spec.wd}
    if spec.clip_gradient is not None:
        params["clip_gradient"] = spec.clip_gradient
    if spec.rescale_grad != "auto":
        params["rescale_grad"] = spec.rescale_grad
    scheduler = build_lr_scheduler(spec.lr_scheduler, spec.learning_rate)
    if scheduler is not None:
        params["lr_scheduler"] = scheduler
    extra: Mapping[str, Any] = spec.params or {}
    params.update(extra)
    return spec.name, params


def _one_initializer(name: str, params: Mapping[str, Any]) -> Any:
    import mxnet as mx

    return getattr(mx.init, _INITIALIZER_CLASSES[name])(**dict(params or {}))


def build_initializer(spec: Any) -> Any:
    """An ``mx.init.Initializer`` from the ``initializer:`` section.

    With ``overrides``, an ``mx.init.Mixed`` whose glob patterns are tried in order (the
    first match wins) before the section's own initializer, which covers the rest.
    """
    import fnmatch

    import mxnet as mx

    default = _one_initializer(spec.name, spec.params)
    overrides = getattr(spec, "overrides", ())
    if not overrides:
        return default
    patterns = [fnmatch.translate(o.pattern) for o in overrides] + [".*"]
    initializers = [_one_initializer(o.name, o.params) for o in overrides] + [default]
    return mx.init.Mixed(patterns, initializers)
