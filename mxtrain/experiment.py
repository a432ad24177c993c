"""Builds the pieces of an experiment (iterators, symbol generator, metrics) from a Config."""

from __future__ import annotations

import copy
import dataclasses
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mxtrain.data.base import DataContext, DataInfo
from mxtrain.errors import ConfigError, DataError
from mxtrain.registry import ITERATORS, METRICS, MODELS, Entry


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
