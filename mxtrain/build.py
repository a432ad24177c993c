"""Builds the pieces of an experiment from a Config: iterators, the symbol generator, metrics,
the optimizer, its learning-rate schedule and the initializer. Fit and inference both use it."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import logging
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mxtrain.data.base import DataContext, DataInfo
from mxtrain.errors import ConfigError, DataError, InvalidValue, MxtrainError
from mxtrain.registry import (
    ITERATORS,
    METRIC_HINT,
    METRICS,
    MODELS,
    Entry,
    is_plugin_reference,
    metric_object_problem,
)


def _call_factory(
    entry: Entry,
    options: Any,
    first: Any,
    where: str,
    locate: Callable[[str], str] | None = None,
) -> Any:
    """Call a component factory the way its kind of options requires.

    Built-ins and plugins with an options dataclass are called as ``factory(options, first)``;
    plugins whose options are plain keywords as ``factory(first, **options)``. ``locate``
    gives the ``file:line`` of a key of the section, for an ``InvalidValue`` the factory raises
    once it sees the data (a size that the vocabulary rules out).
    """
    factory = entry.load()
    try:
        if dataclasses.is_dataclass(options):
            return factory(options, first)
        return factory(first, **dict(options or {}))
    except (ConfigError, DataError):
        raise
    except InvalidValue as exc:
        if locate is None:
            raise ConfigError(f"{where}: {exc}") from exc
        raise ConfigError(f"{locate(exc.key)}: {where}.{exc.key} {exc.problem}.") from exc
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def build_data_iter(section: Any, context: DataContext, base_dir: Path, where: str) -> Any:
    """The DataIter for one ``data.train``/``data.eval`` section."""
    entry = ITERATORS.get(section.name, base_dir=base_dir, where=where)
    data_iter = _call_factory(entry, section.options, context, where)
    if getattr(data_iter, "default_bucket_key", None) is None:
        raise ConfigError(
            f"{where}: the iterator {section.name!r} has no default_bucket_key.",
            hint="A bucketing iterator must say which bucket is the largest.",
        )
    return data_iter


def build_sym_gen(
    section: Any,
    data_info: DataInfo,
    base_dir: Path,
    locate: Callable[[str], str] | None = None,
) -> Callable[..., Any]:
    """The model's ``sym_gen(bucket_key) -> (symbol, data_names, label_names)``; ``locate``:
    ``file:line`` of a ``model`` key (``Config.where``), for errors that name one."""
    entry = MODELS.get(section.name, base_dir=base_dir, where="model.name")
    sym_gen = _call_factory(entry, section.options, data_info, "model", locate)
    if not callable(sym_gen):
        raise ConfigError(
            f"model {section.name!r} returned {type(sym_gen).__name__}, not a sym_gen.",
            hint="A model factory must return a function bucket_key -> "
            "(symbol, data_names, label_names).",
        )
    return sym_gen


def _model_label(model_section: Any, base_dir: Path) -> str:
    """``model 'lenet'`` or ``model 'x.py:f' (plugin file /abs/x.py)``."""
    name = model_section.name
    module_part = name.rpartition(":")[0]
    if module_part.endswith(".py"):
        path = Path(module_part).expanduser()
        return f"model {name!r} (plugin file {path if path.is_absolute() else base_dir / path})"
    if is_plugin_reference(name):
        return f"model {name!r} (plugin module {module_part})"
    return f"model {name!r}"


def _bind_reason(exc: BaseException) -> str:
    """What an MXNet bind error says failed: "operator pool2: kernel size (2) exceeds input".

    simple_bind's message lists every argument shape and then MXNet's check, prefixed with
    a timestamp, the C++ source line and the failed expression; only the operator and the
    check's own words are kept.
    """
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    for line in lines:
        operator = re.search(r"Error in operator (\S+):", line)
        _, failed, check = line.partition("Check failed: ")
        if failed:
            words = check.partition(": ")[2] or check
            return f"operator {operator.group(1)}: {words}" if operator else words
    return lines[0].removeprefix("MXNetError: ") if lines else type(exc).__name__


def _descs(descs: Any) -> str:
    return ", ".join(f"{d.name} {tuple(d.shape)}" for d in descs or []) or "none"


def _model_build_error(
    config: Any, data_iter: Any, data_where: str, exc: BaseException
) -> ConfigError:
    """A ConfigError for a model that cannot be built or bound for ``data_iter``'s batches.

    Names the model section (and plugin file), the data section with its iterator, and the
    data and label names and shapes the iterator provides, so that a plugin whose input names
    differ from the iterator's, or a model whose layers do not fit the data shape, is named
    as such (and not as some unrelated config key).
    """
    model = _model_label(config.model, config.base_dir)
    reason = _bind_reason(exc)
    given = (
        f"{data_where} ({_descs(data_iter.provide_data)}; labels "
        f"{_descs(getattr(data_iter, 'provide_label', None))})"
    )
    if "data names" in reason or "data shapes" in reason or "labels" in reason:
        hint = (
            "The model's sym_gen must return the iterator's data and label names as its "
            "data_names and label_names and use them as its input Variables; rename them in "
            "the model or set data_name / label_name in the data section."
        )
    else:
        hint = (
            "The model's layers do not fit this data shape: change the model section's options "
            "or give data of a shape the model accepts."
        )
    return ConfigError(
        f"{config.source}: model: the {model} cannot be built for the batches of {given}: "
        f"{reason}.",
        hint=hint,
    )


def _plugin_model_error(config: Any, exc: BaseException) -> ConfigError | None:
    """A ConfigError naming the plugin when a plugin model's own code failed while the model
    was built (any exception: a KeyError in its sym_gen is the plugin's to fix), else None
    (a built-in model's failure is a bug of mxtrain's and stays an internal error)."""
    if isinstance(exc, ConfigError) or not is_plugin_reference(config.model.name):
        return None
    model = _model_label(config.model, config.base_dir)
    return ConfigError(
        f"{config.source}: model: the {model} failed while the model was built: "
        f"{type(exc).__name__}: {exc}.",
        hint="This is an error in the plugin's code; `mxtrain --debug ...` shows its traceback.",
    )


@contextmanager
def explained_model_errors(config: Any, data_iter: Any, data_where: str) -> Iterator[None]:
    """Around building and binding the module: a model that does not fit ``data_iter``'s
    batches (ValueError, or MXNet's RuntimeError) and any failure of a plugin model's own
    code become ConfigErrors that name the model; mxtrain's own errors pass unchanged."""
    try:
        yield
    except MxtrainError:
        raise
    except (ValueError, RuntimeError) as exc:
        raise _model_build_error(config, data_iter, data_where, exc) from exc
    except Exception as exc:
        error = _plugin_model_error(config, exc)
        if error is None:
            raise
        raise error from exc


def build_module(
    config: Any,
    data_iter: Any,
    data_where: str,
    contexts: list[Any],
    *,
    for_training: bool,
    logger: logging.Logger,
    for_metrics: bool | None = None,
    shared_params: Any = None,
) -> Any:
    """The model of ``config.model`` as a BucketingModule on ``contexts``, bound to
    ``data_iter``'s largest bucket (so a model that does not fit in memory fails here, and a
    model that does not fit the data is explained). Training binds with ``fit.fixed_params``
    and, with gradient accumulation, gradients that add up. ``for_metrics`` (default: when
    training): the outputs only feed the config's metrics, so a model whose metrics all read
    its loss leaves the probabilities out. ``shared_params``: a module whose parameter arrays
    this one binds (BucketingModule.bind)."""
    from mxtrain.engine.bucketing import BucketingModule, ParamPatternError

    fit_cfg = config.fit
    sym_gen = build_sym_gen(
        config.model,
        data_iter.data_info,
        config.base_dir,
        lambda key: config.where("model", *key.split(".")),
    )
    if for_metrics is None:
        for_metrics = for_training
    variant = for_training and hasattr(sym_gen, "training_variant")
    reads_loss = (for_metrics or variant) and metrics_read_loss(config, data_iter.data_info)
    if for_metrics and reads_loss:
        # training and its evaluations then never compute the probabilities they don't read
        sym_gen = getattr(sym_gen, "without_probabilities", lambda: sym_gen)()
    if variant:
        sym_gen = _training_variant(config, sym_gen, reads_loss)
    work_load = config.context.work_load
    with explained_model_errors(config, data_iter, data_where):
        try:
            module = BucketingModule(
                sym_gen,
                data_iter.default_bucket_key,
                contexts,
                work_load_list=list(work_load) if work_load else None,
                fixed_param_patterns=tuple(fit_cfg.fixed_params) if for_training else (),
                fixed_param_exclude=tuple(fit_cfg.fixed_params_exclude) if for_training else (),
                logger=logger,
                bucket_memory=fit_cfg.bucket_memory,
                states=getattr(sym_gen, "states", None),
            )
            # Labels are bound for inference too: the loss layers take them.
            module.bind(
                data_iter.provide_data,
                data_iter.provide_label,
                for_training=for_training,
                grad_req="add" if for_training and fit_cfg.grad_accumulation > 1 else "write",
                shared_params=shared_params,
            )
        except ParamPatternError as exc:  # a config key, not the model
            raise param_pattern_error(config, exc) from exc
    return module


def _training_variant(config: Any, sym_gen: Any, metrics_read_the_loss: bool) -> Any:
    """The graph a model trains on when it differs from the one it is evaluated with
    (``model.sampled_softmax``); its only output is the loss, so every metric must read it."""
    if not metrics_read_the_loss:
        raise ConfigError(
            f"{config.where('model', 'sampled_softmax')}: model.sampled_softmax trains without "
            f"the full softmax's probabilities, and fit.metrics / fit.evaluation_metrics "
            f"({', '.join(dict.fromkeys((*config.fit.metrics, *config.fit.evaluation_metrics)))})"
            f" need them.",
            hint="Use metrics that read the loss (perplexity, cross_entropy), or set "
            "model.sampled_softmax: 0 for the full softmax.",
        )
    return sym_gen.training_variant()


def wants_evaluation_graph(config: Any, data_info: DataInfo) -> bool:
    """Whether evaluations during training need a module of their own: the model trains on
    another graph than it is evaluated with (``model.sampled_softmax``)."""
    return hasattr(build_sym_gen(config.model, data_info, config.base_dir), "training_variant")


def metrics_read_loss(config: Any, data_info: DataInfo) -> bool:
    """Whether every metric training and its evaluations compute can read the model's loss
    output instead of the probabilities (perplexity, cross_entropy)."""
    names = set(config.fit.metrics) | set(config.fit.evaluation_metrics)
    metrics = [build_metric(name, data_info, config.base_dir) for name in names]
    return bool(metrics) and all(getattr(m, "reads_loss", False) for m in metrics)


#: the config key behind each glob argument of the module
_PATTERN_KEYS = {
    "fixed_param_patterns": ("fit", "fixed_params"),
    "fixed_param_exclude": ("fit", "fixed_params_exclude"),
    "lr_mult": ("optimizer", "lr_mult"),
    "wd_mult": ("optimizer", "wd_mult"),
}


def param_pattern_error(config: Any, exc: Any) -> ConfigError:
    """A module's :class:`ParamPatternError` as the config error of the key it came from,
    at that key's line."""
    section, key = _PATTERN_KEYS[exc.option]
    globs = getattr(getattr(config, section), key)
    # the glob's own line: a mapping key (multipliers) or a list item (fixed_params)
    item = exc.pattern if isinstance(globs, Mapping) else list(globs).index(exc.pattern)
    return ConfigError(f"{config.where(section, key, item)}: {section}.{key}: {exc}.")


def build_metric(name: str, data_info: DataInfo, base_dir: Path) -> Any:
    """One metric instance; ``pad_id`` is passed when the metric accepts it."""
    import mxnet as mx

    from mxtrain.metrics import StockMetric

    entry = METRICS.get(name, base_dir=base_dir, where="fit.metrics")
    factory = entry.load()
    if isinstance(factory, mx.metric.EvalMetric):  # a stock metric instance: use a fresh copy
        return StockMetric(copy.deepcopy(factory), name)
    try:
        accepts_pad = "pad_id" in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        accepts_pad = False
    try:
        if accepts_pad and data_info.pad_id is not None:
            metric = factory(pad_id=data_info.pad_id)
        else:
            metric = factory()
    except MxtrainError:
        raise
    except Exception as exc:
        if not is_plugin_reference(name):
            raise  # a built-in's failure is mxtrain's bug
        raise ConfigError(
            f"fit.metrics: the metric {name!r} failed when created with no arguments: "
            f"{type(exc).__name__}: {exc}.",
            hint="Name a metric that needs no arguments, or fix the plugin's code; "
            "`mxtrain --debug ...` shows the traceback.",
        ) from exc
    if isinstance(metric, mx.metric.EvalMetric):  # e.g. mxnet.metric:Accuracy
        return StockMetric(metric, name)
    problem = metric_object_problem(metric)
    if problem is not None:
        raise ConfigError(
            f"fit.metrics: the metric {name!r} made a {type(metric).__name__}, which {problem}.",
            hint=METRIC_HINT.format(builtins=", ".join(METRICS.available())),
        )
    return metric


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

    warmup = {
        "warmup_steps": spec.warmup_steps,
        "warmup_begin_lr": spec.warmup_begin_lr,
        "warmup_mode": spec.warmup_mode,
    }
    if getattr(spec, "unit", "updates") == "epochs":
        from mxtrain.optimizers import EPOCH_SCALE, EpochSchedule

        # MXNet's schedulers count whole updates from 1: the epoch schedule runs them on
        # thousandths of an epoch, so steps such as 0.75 epochs work
        scaled = dataclasses.replace(
            spec,
            step=None if spec.step is None else spec.step * EPOCH_SCALE,
            steps=None if spec.steps is None else tuple(round(s * EPOCH_SCALE) for s in spec.steps),
            max_update=None if spec.max_update is None else spec.max_update * EPOCH_SCALE,
            warmup_steps=spec.warmup_steps * EPOCH_SCALE,
        )
        warmup["warmup_steps"] = scaled.warmup_steps
        return EpochSchedule(_mxnet_scheduler(scaled, base_lr, warmup))
    return _mxnet_scheduler(spec, base_lr, warmup)


def _mxnet_scheduler(spec: Any, base_lr: float, warmup: dict[str, Any]) -> Any:
    import mxtrain.optimizers

    # MXNet's schedules whose rates too small for MXNet's operators are 0
    cls = getattr(mxtrain.optimizers, _SCHEDULER_CLASSES[spec.type])
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
