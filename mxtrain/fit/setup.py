"""Setting training up: from a Config to the pieces the fit loop needs, as named steps.

:func:`prepare_training` runs the steps in order (seeds, contexts, kvstore, data, kernel
choices, module, starting weights, optimizer, coordination, callbacks) and returns a
:class:`TrainingSetup`. Each step takes the config sections it needs. A new run and a
resumed one (a :class:`Restart`) share them; a resumed run reads its vocabulary, buckets and
weights from its run folder. MXNet is imported only once the caller has applied the run's
thread settings (``devices.prepare_process``), which must come before MXNet loads.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mxtrain import distributed, kernel_choices
from mxtrain.build import (
    TrainingModel,
    build_data_iter,
    build_module,
    build_training_model,
    metrics_read_loss,
    optimizer_arguments,
    param_pattern_error,
    word_embedding,
)
from mxtrain.config import Config
from mxtrain.config.schema import (
    ContextSection,
    IteratorSection,
    KVStoreSection,
    worker_update_keys,
)
from mxtrain.data.base import DataContext
from mxtrain.decoding.evaluation import DecodingEvaluation
from mxtrain.devices import (
    build_contexts,
    configure_threads,
    thread_choices,
    with_threads_in_force,
)
from mxtrain.distributed import Coordinator, is_distributed
from mxtrain.engine.kernels import Choice
from mxtrain.fit.callbacks import CallbackRunner
from mxtrain.fit.memory import plan_memory
from mxtrain.fit.pretrained import (
    check_words_added,
    load_pretrained_embedding,
    vector_words_to_add,
)
from mxtrain.fit.warm_start import WarmStartReport, warm_start
from mxtrain.launch import announce_rank
from mxtrain.models.char_options import reads_chars
from mxtrain.run.bucket_keys import BucketKeys
from mxtrain.run.checkpoint import LoadedCheckpoint, restore_module
from mxtrain.tensorboard import require_writer

if TYPE_CHECKING:  # annotations only: MXNet must load after the run's thread settings
    import mxnet as mx

    from mxtrain.engine.bucketing import BucketingModule

log = logging.getLogger("mxtrain")

#: why a distributed run measures nothing
DISTRIBUTED_NOT_MEASURED = "distributed run: every worker must build the same graph"
#: why a resumed run measures nothing
RESUMED_NOT_MEASURED = "resumed run: it keeps the graph it was trained with"


@dataclass(frozen=True)
class Restart:
    """What a resumed run rebuilds from: its run folder's vocabulary and, when it has one,
    its checkpoint with the bucket lengths and last-batch rule the checkpoint recorded."""

    vocab_file: Path  # absolute: iterators resolve relative paths against the config's folder
    loaded: LoadedCheckpoint | None = None
    buckets: BucketKeys | None = None
    last_batch: str | None = None


@dataclass(frozen=True)
class TrainingSetup:
    """Everything built from the config before training starts."""

    config: Config  # with its auto kernel settings resolved: what the run folder records
    contexts: list[mx.Context]
    train_iter: mx.io.DataIter
    eval_iter: mx.io.DataIter | None
    module: BucketingModule
    #: the model's whole graph (probabilities included) by bucket key, which the run folder
    #: keeps; training may run a trimmed one
    full_sym_gen: Callable[..., Any]
    mxnet_version: str
    rank: int = 0  # distributed worker rank (0 alone writes the run folder)
    coordinator: Coordinator | None = None  # for dist_sync kvstores
    warm_start: WarmStartReport | None = None  # where the starting weights came from
    pretrained: dict[str, Any] | None = None  # model.pretrained_embedding's report
    callbacks: CallbackRunner | None = None  # fit.callbacks (None: none)
    kernel_choices: list[Choice] = field(default_factory=list)
    eval_module: BucketingModule | None = None  # the full graph when training uses another
    #: fit.eval_metrics' decoding metrics of data.eval under the module's current parameters
    #: (None: none asked)
    decoding_evaluation: DecodingEvaluation | None = None
    #: the named eval sets' iterators, the first one being ``eval_iter`` (empty: one set)
    eval_sets: dict[str, mx.io.DataIter] = field(default_factory=dict)


@dataclass(frozen=True)
class Worker:
    """Where this process trains: its devices, its shard of ``data.train`` and the fewest
    rows a batch may have (every device needs its share); ``dist_kv``, the kvstore of a
    distributed run (None: one machine)."""

    contexts: list[mx.Context]
    train_section: IteratorSection
    min_batch: int
    dist_kv: mx.kv.KVStore | None = None

    @property
    def rank(self) -> int:
        """The distributed worker rank (0 alone writes the run folder)."""
        return int(self.dist_kv.rank) if self.dist_kv is not None else 0


def prepare_training(
    config: Config, threads: dict[str, str], restart: Restart | None = None
) -> TrainingSetup:
    """Data, module, kvstore and optimizer for ``config``; a ``restart`` sets the weights of
    its checkpoint before the kvstore is initialised from them."""
    import mxnet as mx  # deferred: the caller applied the thread settings just before

    if config.logging.tensorboard:  # before anything is written: a missing extra says so
        require_writer()
    seed, base_dir = config.experiment.seed, config.base_dir
    log.info("mxtrain, MXNet %s, threads %s, seed %d", mx.__version__, threads, seed)
    seed_everything(seed)
    worker = place_worker(config.context, config.kvstore, config.data.train)
    added = vector_words_to_add(config) if restart is None else ()
    train_iter, eval_iter = build_iterators(
        config.data.eval, worker, seed, base_dir, restart, added, reads_chars(config.model.options)
    )
    check_words_added(config, train_iter, added)
    eval_sets = eval_set_iterators(config, train_iter, eval_iter, worker.min_batch)
    not_measured = ""
    if worker.dist_kv is not None:
        not_measured = DISTRIBUTED_NOT_MEASURED
    elif restart is not None:
        not_measured = RESUMED_NOT_MEASURED
    config, choices = choose_kernels(
        config, train_iter, worker.contexts, not_measured, fresh=restart is None
    )
    kernel_choices.apply_process_settings(config)
    kernel_choices.log_choices(choices)
    model, eval_module, starting = build_model(config, train_iter, eval_iter, worker, restart)
    module = model.module
    coordinator = init_optimizer(module, config, train_iter, worker)
    plan_memory(config, module, train_iter, worker.contexts)
    if module.fixed_param_names:
        log.info("fixed parameters: %s", ", ".join(module.fixed_param_names))
    arg_params, _ = module.get_params()
    log.info(
        "model %s: %s parameters on %s",
        config.model.name,
        f"{int(sum(v.size for v in arg_params.values())):,}",
        ", ".join(str(c) for c in worker.contexts),
    )
    decoding = decoding_evaluation(config, model.sym_gen, eval_iter, worker.contexts[0])
    callbacks = None
    if config.fit.callbacks:  # built before the run folder exists: a bad one fails first
        callbacks = CallbackRunner(config.fit.callbacks, base_dir, module, rank=worker.rank)
    return TrainingSetup(
        config=config, contexts=worker.contexts, train_iter=train_iter, eval_iter=eval_iter,
        eval_sets=eval_sets,
        module=module, mxnet_version=mx.__version__, rank=worker.rank, coordinator=coordinator,
        warm_start=starting.warm_start, pretrained=starting.pretrained, callbacks=callbacks,
        kernel_choices=choices,
        eval_module=eval_module, full_sym_gen=model.sym_gen, decoding_evaluation=decoding,
    )  # fmt: skip


def decoding_evaluation(
    config: Config, sym_gen: Any, eval_iter: mx.io.DataIter | None, context: mx.Context
) -> DecodingEvaluation | None:
    """The decoding metrics of ``fit.eval_metrics`` (bleu, chrf, wer, per) over data.eval,
    decoded as ``fit.decode_eval`` says on the first device at every evaluation; None without
    such metrics or without data.eval."""
    names = config.fit.decoding_metrics
    if not names or eval_iter is None:
        return None
    decoding = config.fit.decoding
    return DecodingEvaluation(
        sym_gen, eval_iter, names, context=context, beam_size=decoding.beam_size,
        max_sentences=decoding.max_sentences, model_name=config.model.name,
    )  # fmt: skip


def seed_everything(seed: int) -> None:
    import mxnet as mx  # deferred: after the thread settings
    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    mx.random.seed(seed)


def place_worker(
    context_cfg: ContextSection, kv_cfg: KVStoreSection, train_section: IteratorSection
) -> Worker:
    """The devices, and in a distributed run the kvstore (created first and only once: a
    second dist kvstore hangs), the announced rank and the rank's shard of ``data.train``."""
    from mxtrain.engine.shapes import fewest_rows  # deferred: it imports MXNet

    contexts = build_contexts(context_cfg)
    min_batch = fewest_rows(len(contexts), context_cfg.work_load)
    if not is_distributed(kv_cfg.type):
        return Worker(contexts, train_section, min_batch)
    dist_kv = distributed.create_kvstore(kv_cfg, contexts)
    rank, workers = dist_kv.rank, dist_kv.num_workers
    log.info("distributed worker rank %d of %d (kvstore %s)", rank, workers, kv_cfg.type)
    announce_rank(rank, workers)  # mxtrain launch names logs by rank
    shard = distributed.shard_data_section(train_section, rank, workers, "data.train", kv_cfg.type)
    return Worker(contexts, shard, min_batch, dist_kv)


def train_iterator(
    section: IteratorSection,
    seed: int,
    base_dir: Path,
    min_batch: int,
    restart: Restart | None = None,
    extra_words: tuple[str, ...] = (),
    char_max_len: int | None = None,
) -> mx.io.DataIter:
    """The training iterator of ``section`` (data.train, sharded in a distributed run);
    ``extra_words`` join the vocabulary it builds; ``char_max_len``: the model reads its
    words' characters too."""
    context = DataContext(
        role="train",
        seed=seed,
        base_dir=base_dir,
        vocab_file=restart.vocab_file if restart is not None else None,
        buckets=restart.buckets if restart is not None else None,
        min_batch=min_batch,
        last_batch=restart.last_batch if restart is not None else None,
        extra_words=extra_words,
        char_max_len=char_max_len,
    )
    return build_data_iter(section, context, base_dir, "data.train")


def build_iterators(
    eval_section: IteratorSection | None,
    worker: Worker,
    seed: int,
    base_dir: Path,
    restart: Restart | None,
    extra_words: tuple[str, ...] = (),
    char_max_len: int | None = None,
) -> tuple[mx.io.DataIter, mx.io.DataIter | None]:
    """The worker's train iterator (``extra_words`` joining its vocabulary, ``char_max_len``:
    with its words' characters) and, with ``data.eval``, the evaluation one; the log
    describes each."""
    min_batch = worker.min_batch
    train_iter = train_iterator(
        worker.train_section, seed, base_dir, min_batch, restart, extra_words, char_max_len
    )
    describe = getattr(train_iter, "describe", None)  # iterators may describe their data
    if callable(describe):
        log.info("train data: %s", describe())
    if eval_section is None:
        return train_iter, None
    return train_iter, eval_iterator(
        eval_section, "data.eval", train_iter, seed, base_dir, min_batch
    )


def eval_iterator(
    section: IteratorSection,
    where: str,
    train_iter: mx.io.DataIter,
    seed: int,
    base_dir: Path,
    min_batch: int,
) -> mx.io.DataIter:
    """One evaluation iterator (``where``: its dotted key), sharing the training vocabulary
    (and reading the words' characters as the train iterator does)."""
    chars = getattr(train_iter, "chars", None)
    context = DataContext(
        role="eval", seed=seed, base_dir=base_dir, train=train_iter, min_batch=min_batch,
        char_max_len=getattr(chars, "max_len", None),
    )  # fmt: skip
    eval_iter = build_data_iter(section, context, base_dir, where)
    describe = getattr(eval_iter, "describe", None)
    if callable(describe):
        log.info("eval data (%s): %s", where, describe())
    return eval_iter


def eval_set_iterators(
    config: Config, train_iter: mx.io.DataIter, first: mx.io.DataIter | None, min_batch: int
) -> dict[str, mx.io.DataIter]:
    """Every named eval set's iterator (``first`` is the first set's), or none for one set."""
    sets = config.data.eval_sets
    if not sets:
        return {}
    seed, base_dir = config.experiment.seed, config.base_dir
    iterators = {sets[0][0]: first}
    for name, section in sets[1:]:
        where = f"data.eval.{name}"
        iterators[name] = eval_iterator(section, where, train_iter, seed, base_dir, min_batch)
    return iterators


def choose_kernels(
    config: Config,
    train_iter: mx.io.DataIter,
    contexts: list[mx.Context],
    not_measured: str,
    *,
    fresh: bool = True,
    remeasure: bool = False,
) -> tuple[Config, list[Choice]]:
    """``config`` with its ``auto`` kernel settings resolved, and every choice made (the
    OpenMP ones first, for a fresh run: a resumed one keeps what it recorded)."""
    probabilities = not metrics_read_loss(config, train_iter.data_info)
    config, choices = kernel_choices.resolve(
        config,
        train_iter,
        contexts,
        probabilities=probabilities,
        not_measured=not_measured,
        remeasure=remeasure,
    )
    return config, (thread_choices() + choices if fresh else choices)


def measure_kernel_choices(config: Config, *, remeasure: bool = False) -> list[Choice]:
    """The kernel and OpenMP choices ``mxtrain fit`` would make for ``config`` on this
    machine (mxtrain.kernel_choices), without training: kept ones are read back, missing ones
    measured and kept; ``remeasure`` measures every one again (``mxtrain kernels --measure``).
    """
    configure_threads(config.context, measure=True, remeasure=remeasure)  # before MXNet loads
    config = dataclasses.replace(config, context=with_threads_in_force(config.context))
    from mxtrain.engine.shapes import fewest_rows  # deferred: MXNet after the threads

    contexts = build_contexts(config.context)
    min_batch = fewest_rows(len(contexts), config.context.work_load)
    train_iter = train_iterator(
        config.data.train, config.experiment.seed, config.base_dir, min_batch,
        char_max_len=reads_chars(config.model.options),
    )  # fmt: skip
    not_measured = DISTRIBUTED_NOT_MEASURED if is_distributed(config.kvstore.type) else ""
    return choose_kernels(config, train_iter, contexts, not_measured, remeasure=remeasure)[1]


def build_model(
    config: Config,
    train_iter: mx.io.DataIter,
    eval_iter: mx.io.DataIter | None,
    worker: Worker,
    restart: Restart | None,
) -> tuple[TrainingModel, BucketingModule | None, StartingWeights]:
    """The training model, its module with its starting weights (a resumed run's checkpoint,
    else the initializer's, then ``model.pretrained_embedding``'s vectors, then
    ``initializer.from``), the evaluation module when the model trains on another graph than
    it is evaluated with (``model.sampled_softmax``: the full softmax; None otherwise), and
    where the starting weights came from."""
    contexts = worker.contexts
    model = build_training_model(config, train_iter, contexts, logger=log)
    warn_if_contexts_take_turns(model.module.symbol, contexts)
    module, started_from, pretrained = model.module, None, None
    if restart is None or restart.loaded is None:  # a new run, or one before its first
        # checkpoint: the initializer's values, then the vectors, then initializer.from
        pretrained = _pretrained_embedding(config, train_iter, model)
    if restart is not None and restart.loaded is not None:
        # Before init_optimizer: with update_on_kvstore (dist_async) the servers keep the
        # weights they are initialised with, so setting them afterwards would be undone by
        # the first pull and a resume would restart from the random initialisation.
        restore_module(module, restart.loaded)
    elif config.initializer.warm_start is not None:  # a run resumed before its first
        # checkpoint starts from these weights again, as its first start did
        where = config.where("initializer", "from")
        started_from = warm_start(module, config.initializer.warm_start, config.base_dir, where)
        _tell_replaced_vectors(pretrained, started_from)
    starting = StartingWeights(started_from, pretrained)
    if not model.trains_on_variant:
        return model, None, starting
    # the model trains on another graph than it is evaluated with (model.sampled_softmax)
    log.info(
        "sampled softmax: training reads a softmax over each position's label and %s words "
        "drawn per batch out of %s (the training perplexity is that softmax's, not the full "
        "one's); evaluations use the full softmax",
        f"{getattr(config.model.options, 'sampled_softmax', 0):,}",
        f"{train_iter.data_info.num_classes:,}",
    )
    if eval_iter is None:
        return model, None, starting
    # bound on the training module's parameter arrays: every update is what it evaluates
    eval_module = build_module(
        config, eval_iter, "data.eval", contexts, for_training=False, for_metrics=True,
        logger=log, shared_params=module,
    )  # fmt: skip
    return model, eval_module, starting


@dataclass(frozen=True)
class StartingWeights:
    """Where a new run's weights came from besides the initializer (run.json keeps both)."""

    warm_start: WarmStartReport | None = None  # initializer.from
    pretrained: dict[str, Any] | None = None  # model.pretrained_embedding


def _pretrained_embedding(
    config: Config, train_iter: mx.io.DataIter, model: TrainingModel
) -> dict[str, Any] | None:
    spec = getattr(config.model.options, "pretrained_embedding", None)
    if spec is None:
        return None
    parameter = word_embedding(config, model.sym_gen)
    return load_pretrained_embedding(model.module, config, spec, train_iter, parameter)


def _tell_replaced_vectors(
    pretrained: dict[str, Any] | None, started_from: WarmStartReport | None
) -> None:
    if pretrained is None or started_from is None:
        return
    if pretrained["parameter"] in started_from.loaded:
        log.warning(
            "initializer.from replaced the pretrained embedding %s with its own values (list "
            "it in initializer.from.exclude, with allow_missing: true, to keep the vectors)",
            pretrained["parameter"],
        )


#: MXNet 1.9.1 operators that never run on two CPU contexts of one process at once (the fused
#: recurrent layers, measured: docs/scale.md)
CPU_TURN_TAKING_OPERATORS = frozenset({"RNN"})


def warn_if_contexts_take_turns(symbol: Any, contexts: list[Any]) -> None:
    """Log a warning when several CPU contexts train a graph whose fused RNN layers take
    turns across them: such a model trains no faster than on one context."""
    if len(contexts) < 2 or any(c.device_type != "cpu" for c in contexts):
        return
    operators = {node["op"] for node in json.loads(symbol.tojson())["nodes"]}
    if operators & CPU_TURN_TAKING_OPERATORS:
        log.warning(
            "%d CPU contexts: MXNet's fused RNN operator, which this model uses, runs on one "
            "CPU context of a process at a time, so the contexts take turns and train no "
            "faster than one. Two processes do run side by side: mxtrain launch -n 2 -s 1 "
            "CONFIG --set kvstore.type=dist_sync (docs/scale.md).",
            len(contexts),
        )


def init_optimizer(
    module: BucketingModule, config: Config, train_iter: mx.io.DataIter, worker: Worker
) -> Coordinator | None:
    """The optimizer of ``config.optimizer`` on ``module`` with its kvstore; for dist_sync
    workers, the coordinator that makes them decide together (None otherwise)."""
    from mxtrain.engine.parameters import ParamPatternError  # deferred: it imports MXNet

    opt_cfg, kv_cfg, dist_kv = config.optimizer, config.kvstore, worker.dist_kv
    optimizer_name, optimizer_params = optimizer_arguments(opt_cfg)
    accumulation = config.fit.grad_accumulation
    sync = kv_cfg.type in distributed.DIST_SYNC_TYPES
    if accumulation > 1 and opt_cfg.rescale_grad == "auto":
        # gradients are summed over K batches: average over all their samples
        batch_size = train_iter.provide_data[0].shape[0]
        workers = dist_kv.num_workers if dist_kv is not None and sync else 1
        optimizer_params["rescale_grad"] = 1.0 / (batch_size * accumulation * workers)
    kvstore = dist_kv
    if kvstore is None:
        kvstore = distributed.create_kvstore(kv_cfg, worker.contexts)
    # update_on_kvstore: auto, unless an optimizer key needs the updates on the workers (the
    # config check refused the settings that update on the servers)
    on_kvstore = distributed.resolve_update_on_kvstore(kv_cfg)
    if worker_update_keys(opt_cfg):
        on_kvstore = False
    try:
        module.init_optimizer(
            kvstore=kvstore, optimizer=optimizer_name, optimizer_params=optimizer_params,
            update_on_kvstore=on_kvstore,
            clip_global_norm=opt_cfg.clip_global_norm, lr_mult=opt_cfg.lr_mult,
            wd_mult=opt_cfg.wd_mult,
        )  # fmt: skip
    except ParamPatternError as exc:
        raise param_pattern_error(config, exc) from exc
    # which parameters learn at another rate and which the weight decay reaches (MXNet
    # silently leaves out every parameter not named *_weight or *_gamma)
    multipliers = module.update_multipliers()
    scaled = [f"{name} x{lr:g}" for name, (lr, _) in multipliers.items() if lr != 1.0]
    if scaled:
        log.info("learning-rate multipliers: %s", ", ".join(scaled))
    if opt_cfg.wd != 0:
        decayed = [n if wd == 1.0 else f"{n} x{wd:g}" for n, (_, wd) in multipliers.items() if wd]
        spared = [name for name, (_, wd) in multipliers.items() if not wd]
        log.info(
            "weight decay %g on: %s%s",
            opt_cfg.wd,
            ", ".join(decayed) or "no parameter",
            f"; not on: {', '.join(spared)} (optimizer.wd_mult changes this)" if spared else "",
        )
    if dist_kv is None:
        return None
    if not sync:
        log.info("dist_async: workers neither wait for each other nor agree on batch counts")
        return None
    compression = kv_cfg.gradient_compression
    return Coordinator(dist_kv, unit=compression.threshold if compression is not None else 1.0)
