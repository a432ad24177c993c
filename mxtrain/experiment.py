"""Builds the pieces of an experiment (iterators, symbol generator, metrics) from a Config."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mxtrain.data.base import DataContext, DataInfo
from mxtrain.errors import ConfigError, DataError, MxtrainError
from mxtrain.registry import ITERATORS, METRICS, MODELS, Entry, is_plugin_reference


def _call_factory(entry: Entry, options: Any, first: Any, where: str) -> Any:
    """Call a component factory the way its kind of options requires.

    Built-ins and plugins with an options dataclass are called as ``factory(options, first)``;
    plugins whose options are plain keywords as ``factory(first, **options)``.
    """
    factory = entry.load()
    try:
        if dataclasses.is_dataclass(options):
            return factory(options, first)
        return factory(first, **dict(options or {}))
    except (ConfigError, DataError):
        raise
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


def build_sym_gen(section: Any, data_info: DataInfo, base_dir: Path) -> Callable[..., Any]:
    """The model's ``sym_gen(bucket_key) -> (symbol, data_names, label_names)``."""
    entry = MODELS.get(section.name, base_dir=base_dir, where="model.name")
    sym_gen = _call_factory(entry, section.options, data_info, "model")
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
    if accepts_pad and data_info.pad_id is not None:
        metric = factory(pad_id=data_info.pad_id)
    else:
        metric = factory()
    if isinstance(metric, mx.metric.EvalMetric):  # e.g. mxnet.metric:Accuracy
        return StockMetric(metric, name)
    return metric
