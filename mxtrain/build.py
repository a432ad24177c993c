"""Builds the pieces of an experiment from a Config: iterators, the symbol generator, metrics,
the optimizer, its learning-rate schedule and the initializer. Fit and inference both use it."""

from __future__ import annotations

import copy
import dataclasses
import fnmatch
import inspect
import logging
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mxtrain.config.schema import (
    ComponentOptions,
    Config,
    InitializerSection,
    IteratorSection,
    LrSchedulerSection,
    ModelSection,
    OptimizerSection,
)
from mxtrain.data.base import DataContext, DataInfo
from mxtrain.errors import ConfigError, DataError, InvalidValue, MxtrainError
from mxtrain.graph_sizes import graph_problem, keys_of
from mxtrain.mxnet_errors import mxnet_reason
from mxtrain.registry import (
    BLOCKS,
    GLUON_MODEL,
    ITERATORS,
    METRIC_HINT,
    METRICS,
    MODELS,
    Entry,
    metric_object_problem,
)


def _call_factory(
    entry: Entry,
    options: ComponentOptions,
    first: Any,
    where: str,
    locate: Callable[[str], str] | None = None,
) -> Any:
    """Call a component factory the way its kind of options requires.

    Built-ins and plugins with an options dataclass are called as ``factory(options, first)``;
    plugins whose options are plain keywords as ``factory(first, **options)``. ``locate``
    gives the ``file:line`` of a key of the section, for an ``InvalidValue`` the factory raises
    once it sees the data (a size that the vocabulary rules out). Any other exception from a
    plugin's factory is reported as the plugin's (:meth:`Entry.calling`).
    """
    factory = entry.load()
    with entry.calling(f"creating the {entry.kind}", where):
        try:
            if dataclasses.is_dataclass(options):
                return factory(options, first)
            return factory(first, **(options if isinstance(options, Mapping) else {}))
        except (ConfigError, DataError):
            raise
        except InvalidValue as exc:
            if locate is None:
                raise ConfigError(f"{where}: {exc}") from exc
            raise ConfigError(f"{locate(exc.key)}: {where}.{exc.key} {exc.problem}.") from exc
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from exc


def build_data_iter(
    section: IteratorSection, context: DataContext, base_dir: Path, where: str
) -> Any:
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
    section: ModelSection,
    data_info: DataInfo,
    base_dir: Path,
    locate: Callable[[str], str] | None = None,
) -> Callable[..., Any]:
    """The model's ``sym_gen(bucket_key) -> (symbol, data_names, label_names)``; ``locate``:
    ``file:line`` of a ``model`` key (``Config.where``), for errors that name one."""
    import mxnet as mx  # deferred: MXNet reads its thread settings when it loads

    from mxtrain.models.gluon_blocks import block_sym_gen, is_block

    entry = MODELS.get(section.name, base_dir=base_dir, where="model.name")
    # a fresh name scope: a Gluon block's parameter names are then the same at every build
    with mx.name.NameManager():
        if section.name == GLUON_MODEL:
            sym_gen = _gluon_model(section.options, data_info, base_dir, locate)
        else:
            sym_gen = _call_factory(entry, section.options, data_info, "model", locate)
    if is_block(sym_gen):
        sym_gen = block_sym_gen(sym_gen, data_info, section.name)
    if not callable(sym_gen):
        raise ConfigError(
            f"model {section.name!r} returned {type(sym_gen).__name__}, not a sym_gen.",
            hint="A model factory must return a function bucket_key -> "
            "(symbol, data_names, label_names), or a Gluon HybridBlock.",
        )
    return sym_gen


def _gluon_model(
    options: Any, data_info: DataInfo, base_dir: Path, locate: Callable[[str], str] | None
) -> Callable[..., Any]:
    """The ``gluon`` model: its ``block`` loaded as a plugin (a file one relative to
    ``base_dir``), called with its ``options``, and traced."""
    from mxtrain.models.gluon_blocks import build_gluon

    where = locate("block") if locate is not None else "model.block"
    entry = BLOCKS.get(options.block, base_dir=base_dir, where=where)
    make_block = entry.load()
    with entry.calling("making the block", where):
        return build_gluon(options, data_info, make_block)


def _descs(descs: Any) -> str:
    return ", ".join(f"{d.name} {tuple(d.shape)}" for d in descs or []) or "none"


def _model_build_error(
    config: Config, data_iter: Any, data_where: str, exc: BaseException
) -> ConfigError:
    """A ConfigError for a model that cannot be built or bound for ``data_iter``'s batches.

    Names the model section (and plugin file), the data section with its iterator, and the
    data and label names and shapes the iterator provides, so that a plugin whose input names
    differ from the iterator's, or a model whose layers do not fit the data shape, is named
    as such (and not as some unrelated config key).
    """
    model = MODELS.get(config.model.name, base_dir=config.base_dir).label
    reason = mxnet_reason(exc)
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
    elif "2^31 elements" in reason:  # MXNet 1.9.1 without int64 tensor sizes
        hint = (
            "A batch is too large for one MXNet array (2**31 elements): give a smaller batch "
            "size (--batch-size, or batch_size in the data section)."
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


@contextmanager
def explained_model_errors(config: Config, data_iter: Any, data_where: str) -> Iterator[None]:
    """Around building and binding the module: a model that does not fit ``data_iter``'s
    batches (ValueError, or MXNet's RuntimeError) and any failure of a plugin model's own
    code (a KeyError in its sym_gen is the plugin's to fix) become ConfigErrors that name the
    model; mxtrain's own errors pass unchanged, and so does any other failure of a built-in
    model (a bug of mxtrain's, an internal error)."""
    model = MODELS.get(config.model.name, base_dir=config.base_dir)
    with model.calling("the model was built", f"{config.source}: model"):
        try:
            yield
        except MxtrainError:
            raise
        except (ValueError, RuntimeError) as exc:
            raise _model_build_error(config, data_iter, data_where, exc) from exc


@dataclasses.dataclass(frozen=True)
class TrainingModel:
    """What training builds of ``config.model`` in one go: the module with its initialised
    parameters and the model's ``sym_gen`` (its whole graph, probabilities included, which
    the run folder keeps, and which training may trim)."""

    module: Any
    sym_gen: Callable[..., Any]

    @property
    def trains_on_variant(self) -> bool:
        """Whether the model trains on another graph than it is evaluated with
        (``model.sampled_softmax``): evaluations then need a module of their own."""
        return hasattr(self.sym_gen, "training_variant")


def build_training_model(
    config: Config, data_iter: Any, contexts: list[Any], *, logger: logging.Logger
) -> TrainingModel:
    """The training module of ``config.model`` on ``contexts``, bound to ``data_iter``
    (``data.train``) and initialised by ``config.initializer`` (:func:`build_module`)."""
    initializer = build_initializer(config.initializer)
    sym_gen = _located_sym_gen(config, data_iter.data_info)
    module = build_module(
        config, data_iter, "data.train", contexts, for_training=True, logger=logger,
        model_sym_gen=sym_gen,
    )  # fmt: skip
    module.init_params(initializer)
    return TrainingModel(module, sym_gen)


def _located_sym_gen(config: Config, data_info: DataInfo) -> Callable[..., Any]:
    """``build_sym_gen`` of ``config.model`` whose errors name the model key's line."""
    return build_sym_gen(
        config.model,
        data_info,
        config.base_dir,
        lambda key: config.where("model", *key.split(".")),
    )


def build_module(
    config: Config,
    data_iter: Any,
    data_where: str,
    contexts: list[Any],
    *,
    for_training: bool,
    logger: logging.Logger,
    for_metrics: bool | None = None,
    shared_params: Any = None,
    model_sym_gen: Callable[..., Any] | None = None,
    graphs: Callable[[Any], Any] | None = None,
) -> Any:
    """The model of ``config.model`` as a BucketingModule on ``contexts``, bound to
    ``data_iter``'s largest bucket (so a model that does not fit in memory fails here, and a
    model that does not fit the data is explained). Training binds with ``fit.fixed_params``
    and, with gradient accumulation, gradients that add up. ``for_metrics`` (default: when
    training): the outputs only feed the config's metrics, so a model whose metrics all read
    its loss leaves the probabilities out. ``shared_params``: a module whose parameter arrays
    this one binds (BucketingModule.bind). ``model_sym_gen``: the model's, when already built.
    ``graphs(sym_gen)``: a sym_gen whose graphs replace the model's as bound (int8 inference,
    :mod:`mxtrain.engine.quantization`)."""
    # deferred: MXNet reads its thread settings when it loads (devices.configure_threads first)
    from mxtrain.engine.bucketing import BucketingModule
    from mxtrain.engine.parameters import ParamPatternError

    fit_cfg = config.fit
    sym_gen: Callable[..., Any] = (
        model_sym_gen
        if model_sym_gen is not None
        else _located_sym_gen(config, data_iter.data_info)
    )
    frozen = frozen_embedding(config, sym_gen) if for_training else ()
    if for_metrics is None:
        for_metrics = for_training
    variant = for_training and hasattr(sym_gen, "training_variant")
    reads_loss = (for_metrics or variant) and metrics_read_loss(config, data_iter.data_info)
    if for_metrics and reads_loss:
        # training and its evaluations then never compute the probabilities they don't read
        sym_gen = getattr(sym_gen, "without_probabilities", lambda: sym_gen)()
    if variant:
        sym_gen = _training_variant(config, sym_gen, reads_loss)
    softmax_head = None
    if for_training and hasattr(sym_gen, "softmax_head_variant"):
        # model.loss: one_pass: the graph ends at the logits, the module does the softmax
        from mxtrain.engine.softmax_head import SoftmaxHeadSpec

        sym_gen, head = sym_gen.softmax_head_variant(not reads_loss)
        softmax_head = SoftmaxHeadSpec(**head)
    work_load = config.context.work_load
    with explained_model_errors(config, data_iter, data_where):
        check_graph_sizes(config, sym_gen, data_iter, data_where, for_training=for_training)
        try:
            module = BucketingModule(
                graphs(sym_gen) if graphs is not None else sym_gen,
                data_iter.default_bucket_key,
                contexts,
                work_load_list=list(work_load) if work_load else None,
                fixed_param_patterns=(*fit_cfg.fixed_params, *frozen) if for_training else (),
                fixed_param_exclude=tuple(fit_cfg.fixed_params_exclude) if for_training else (),
                logger=logger,
                bucket_memory=fit_cfg.bucket_memory,
                states=getattr(sym_gen, "states", None),
                softmax_head=softmax_head,
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


def word_embedding(config: Config, sym_gen: Any) -> str:
    """The parameter that embeds the model's input words (``sym_gen.word_embedding``),
    which ``model.pretrained_embedding`` fills; a ConfigError for a model that has none."""
    name = getattr(sym_gen, "word_embedding", None)
    if not isinstance(name, str):
        raise ConfigError(
            f"{config.where('model', 'pretrained_embedding')}: model.pretrained_embedding: "
            f"the model {config.model.name!r} names no word embedding to start from vectors.",
            hint="Remove the key, or give the model's sym_gen a word_embedding attribute "
            "(the name of its embedding parameter).",
        )
    return name


def frozen_embedding(config: Config, sym_gen: Any) -> tuple[str, ...]:
    """The embedding parameter ``model.pretrained_embedding.freeze`` keeps fixed, if any."""
    spec = getattr(config.model.options, "pretrained_embedding", None)
    if spec is None or not spec.freeze:
        return ()
    return (word_embedding(config, sym_gen),)


def _option_sizes(prefix: str, options: ComponentOptions) -> dict[str, Any]:
    """``{"prefix.key": value}`` of a section's options (a dataclass or a mapping)."""
    if dataclasses.is_dataclass(options) and not isinstance(options, type):
        items = {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}
    else:
        items = dict(options) if isinstance(options, Mapping) else {}
    return {f"{prefix}.{key}": value for key, value in items.items()}


def check_graph_sizes(
    config: Config, sym_gen: Any, data_iter: Any, data_where: str, *, for_training: bool
) -> None:
    """Refuse, before binding, a largest-bucket graph with a tensor MXNet's 32-bit shapes
    cannot hold or that the machine's memory cannot (:mod:`mxtrain.graph_sizes`), naming the
    keys whose values are its dimensions."""
    descs = [*data_iter.provide_data, *(getattr(data_iter, "provide_label", None) or [])]
    shapes = {d.name: tuple(d.shape) for d in descs}
    symbol = sym_gen(data_iter.default_bucket_key)[0]
    on_cpu = config.context.devices == "cpu"
    problem = graph_problem(symbol, shapes, activations_in_memory=for_training and on_cpu)
    if problem is None:
        return
    section = config.data.eval if data_where == "data.eval" else config.data.train
    sizes = {
        **_option_sizes("model", config.model.options),
        **_option_sizes(data_where, section.options if section is not None else None),
    }
    batch = int(descs[0].shape[0]) if descs and descs[0].shape else None
    if batch is not None and sizes.get(f"{data_where}.batch_size") not in (None, batch):
        del sizes[f"{data_where}.batch_size"]  # score/predict --batch-size replaced it
        sizes[f"--batch-size {batch}"] = batch
    keys = keys_of(problem.shape, sizes)
    info = data_iter.data_info
    vocab = {getattr(info, "vocab_size", None), getattr(info, "num_classes", None)} - {None}
    if any(n in problem.shape for n in vocab):
        keys.append("the vocabulary (max_vocab or min_count of data.train bound it)")
    where = config.source
    if keys and keys[0].startswith("--"):
        where = keys[0]
    elif keys and "." in keys[0]:
        where = config.where(*keys[0].split("."))
    raise ConfigError(
        f"{where}: {problem.describe()} (model {config.model.name!r} on the largest "
        f"batch of {data_where}, {', '.join(f'{n} {s}' for n, s in shapes.items())}).",
        hint=f"Reduce {', '.join(keys)}." if keys else "Reduce the model's or the batch's sizes.",
    )


def _training_variant(config: Config, sym_gen: Any, metrics_read_the_loss: bool) -> Any:
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


def metrics_read_loss(config: Config, data_info: DataInfo) -> bool:
    """Whether every metric training and its evaluations compute can read the model's loss
    output instead of the probabilities (perplexity, cross_entropy)."""
    names = set(config.fit.metrics) | set(config.fit.device_evaluation_metrics)
    metrics = [build_metric(name, data_info, config.base_dir) for name in names]
    return bool(metrics) and all(getattr(m, "reads_loss", False) for m in metrics)


#: the config key behind each glob argument of the module
_PATTERN_KEYS = {
    "fixed_param_patterns": ("fit", "fixed_params"),
    "fixed_param_exclude": ("fit", "fixed_params_exclude"),
    "lr_mult": ("optimizer", "lr_mult"),
    "wd_mult": ("optimizer", "wd_mult"),
}


def param_pattern_error(config: Config, exc: Any) -> ConfigError:
    """A module's :class:`ParamPatternError` as the config error of the key it came from,
    at that key's line."""
    section, key = _PATTERN_KEYS[exc.option]
    globs = getattr(getattr(config, section), key)
    # the glob's own line: a mapping key (multipliers) or a list item (fixed_params)
    item = exc.pattern if isinstance(globs, Mapping) else list(globs).index(exc.pattern)
    return ConfigError(f"{config.where(section, key, item)}: {section}.{key}: {exc}.")


def build_metric(name: str, data_info: DataInfo, base_dir: Path) -> Any:
    """One metric instance; ``pad_id`` is passed when the metric accepts it."""
    # deferred: MXNet reads its thread settings when it loads (devices.configure_threads first)
    import mxnet as mx

    # deferred: MXNet reads its thread settings when it loads (devices.configure_threads first)
    from mxtrain.metrics import StockMetric

    entry = METRICS.get(name, base_dir=base_dir, where="fit.metrics")
    factory = entry.load()
    if isinstance(factory, mx.metric.EvalMetric):  # a stock metric instance: use a fresh copy
        return StockMetric(copy.deepcopy(factory), name)
    try:
        accepts_pad = "pad_id" in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        accepts_pad = False
    with entry.calling("creating the metric"):
        if accepts_pad and data_info.pad_id is not None:
            metric = factory(pad_id=data_info.pad_id)
        else:
            metric = factory()
    if isinstance(metric, mx.metric.EvalMetric):  # e.g. mxnet.metric:Accuracy
        return StockMetric(metric, name)
    if not entry.is_plugin:
        return metric
    problem = metric_object_problem(metric)
    if problem is None and not isinstance(getattr(metric, "name", None), str):
        problem = "has no name (str)"
    if problem is not None:  # found now, not as an AttributeError in the middle of training
        raise ConfigError(
            f"fit.metrics: the {entry.label} made a {type(metric).__name__}, which {problem}.",
            hint=METRIC_HINT.format(builtins=", ".join(METRICS.available())),
        )
    return metric


_SCHEDULER_CLASSES = {
    "factor": "FactorScheduler",
    "multifactor": "MultiFactorScheduler",
    "poly": "PolyScheduler",
    "cosine": "CosineScheduler",
    "plateau": "PlateauScheduler",
}
_INITIALIZER_CLASSES = {
    "xavier": "Xavier",
    "uniform": "Uniform",
    "normal": "Normal",
    "orthogonal": "Orthogonal",
    "zero": "Zero",
    "one": "One",
}


def build_lr_scheduler(spec: LrSchedulerSection | None, base_lr: float) -> Any:
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
        # deferred: MXNet reads its thread settings when it loads (devices.configure_threads first)
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
        every_update = _mxnet_scheduler(scaled, base_lr, warmup)
        return EpochSchedule(every_update)
    return _mxnet_scheduler(spec, base_lr, warmup)


def _mxnet_scheduler(spec: LrSchedulerSection, base_lr: float, warmup: dict[str, Any]) -> Any:
    # deferred: MXNet reads its thread settings when it loads (devices.configure_threads first)
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
    if spec.type == "plateau":
        return cls(factor=spec.factor, min_lr=spec.min_lr, base_lr=base_lr, **warmup)
    if spec.type == "multifactor":
        return cls(step=list(spec.steps or ()), factor=spec.factor, base_lr=base_lr, **warmup)
    if spec.type == "poly":
        return cls(
            max_update=spec.max_update,
            base_lr=base_lr,
            pwr=spec.pwr,
            final_lr=spec.final_lr,
            **warmup,
        )
    return cls(max_update=spec.max_update, base_lr=base_lr, final_lr=spec.final_lr, **warmup)


def optimizer_arguments(spec: OptimizerSection) -> tuple[str, dict[str, Any]]:
    """(optimizer name, keyword parameters) for ``BucketingModule.init_optimizer``.

    ``rescale_grad: auto`` is left out so the module sets it to 1/batch size, as MXNet does.
    Importing mxtrain.optimizers registers the optimizers mxtrain adds (adamw).
    """
    import mxtrain.optimizers  # noqa: F401 (deferred: it imports MXNet, after the thread settings)

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
    # deferred: MXNet reads its thread settings when it loads (devices.configure_threads first)
    import mxnet as mx

    return getattr(mx.init, _INITIALIZER_CLASSES[name])(**dict(params or {}))


def build_initializer(spec: InitializerSection) -> Any:
    """An ``mx.init.Initializer`` from the ``initializer:`` section.

    With ``overrides``, an ``mx.init.Mixed`` whose glob patterns are tried in order (the
    first match wins) before the section's own initializer, which covers the rest.
    """
    # deferred: MXNet reads its thread settings when it loads (devices.configure_threads first)
    import mxnet as mx

    default = _one_initializer(spec.name, spec.params)
    overrides = getattr(spec, "overrides", ())
    if not overrides:
        return default
    patterns = [re.compile(fnmatch.translate(o.pattern)) for o in overrides]
    initializers = [_one_initializer(o.name, o.params) for o in overrides]

    def initialize(desc: Any, arr: Any) -> None:
        """The first matching override, even over a parameter's own initializer (a Gluon
        block's ``weight_initializer``, kept in its variable's ``__init__``); else the
        section's own initializer, which honours that one."""
        for pattern, initializer in zip(patterns, initializers, strict=True):
            if pattern.match(str(desc)):
                attrs = dict(getattr(desc, "attrs", None) or {})
                attrs.pop("__init__", None)
                initializer(mx.init.InitDesc(str(desc), attrs, initializer), arr)
                return
        default(desc, arr)

    return initialize
