"""Opening a run for inference: from a run folder (and a checkpoint choice) to a bound module.

The checkpoint is chosen by :mod:`mxtrain.run.choose`. A run folder written by ``mxtrain fit``
holds everything needed: ``config.yaml`` (the resolved
config; relative paths in it resolve against ``run.json``'s ``config_dir``), ``vocab.json`` and
the checkpoints. :func:`open_run` rebuilds the data iterator with the saved vocabulary, the
model from ``config.model`` and our BucketingModule bound for inference, and loads the chosen
checkpoint's parameters; :mod:`mxtrain.inference.score` and :mod:`mxtrain.inference.predict`
use what it returns.

No click here; MXNet is imported inside the functions, after the thread settings of the
run's config are applied.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mxtrain.build import build_data_iter, build_module, build_sym_gen
from mxtrain.config import Config, load_config
from mxtrain.config.schema import ComponentOptions, IteratorSection
from mxtrain.data.base import TASK_SEQ2SEQ, DataContext
from mxtrain.data.bucket_sentence_options import TREEBANK_PREFIX
from mxtrain.devices import build_contexts, configure_threads
from mxtrain.errors import ConfigError, DataError, InvalidValue
from mxtrain.inference.int8 import Int8Options, Int8Report, check_int8_devices, int8_module
from mxtrain.models.char_options import reads_chars
from mxtrain.run.bucket_keys import BucketKeys
from mxtrain.run.choose import (
    ChosenCheckpoint,
    merge_selectors,
    open_run_folder,
    parse_checkpoint_ref,
    read_checkpoint_params,
    recorded_buckets,
    resolve_checkpoint,
)
from mxtrain.run.folder import RunFolder
from mxtrain.run.params import param_problems, params_mismatch_error
from mxtrain.run.plugin_files import uses_kept_plugins
from mxtrain.user_files import require_file

log = logging.getLogger("mxtrain")

ROLES = ("eval", "predict")


def input_file(path: str | os.PathLike[str], what: str) -> Path:
    """An input file named on the command line: relative to the current folder, must exist."""
    file = Path(path).expanduser()
    if not file.is_absolute():
        file = Path.cwd() / file
    require_file(
        file,
        what,
        missing_hint="Paths on the command line are relative to the current folder; give a "
        "file the run's data iterator reads (a language model: UTF-8 text, one sentence per "
        "line; a classifier: .npy/.npz/.csv rows).",
    )
    return file


# --------------------------------------------------------------------------------------------
# Opening a run: config, iterator, module, parameters
# --------------------------------------------------------------------------------------------


@dataclass
class OpenedRun:
    """A run folder's model, bound for inference with one epoch's parameters, and its data."""

    run: RunFolder
    epoch: int
    params_file: Path
    config: Config
    data_iter: Any
    module: Any
    data_source: str  # what the iterator reads, for messages and reports
    checkpoint: ChosenCheckpoint | None = None  # what was loaded (tag, position)
    contexts: list[Any] = field(default_factory=list)  # the devices the run's config names
    int8: Int8Report | None = None  # what runs in int8 (--int8)

    def sym_gen(self) -> Any:
        """The model's ``sym_gen``, built from the run's config and its data's facts."""
        return build_sym_gen(self.config.model, self.data_iter.data_info, self.config.base_dir)

    def params(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The checkpoint's (arg_params, aux_params)."""
        if self.checkpoint is not None:
            return self.checkpoint.arrays()
        return read_checkpoint_params(self.params_file)


def _with_options(section: IteratorSection, where: str, **changes: Any) -> IteratorSection:
    """``section`` with some iterator options replaced.

    ``source`` must be an option of the iterator (it says what to read); other keys are
    replaced where the iterator has them, and ``batch_size`` must be one when it is given.
    """
    options = section.options
    names = _option_names(section)
    for key in ("source", "batch_size"):
        if key in changes and key not in names:
            flag = "--data/--input" if key == "source" else "--batch-size"
            raise ConfigError(
                f"{where}: the iterator {section.name!r} has no {key!r} option, so {flag} "
                "cannot be applied to it.",
                hint=f"Leave {flag} out, or use an iterator with a {key!r} option "
                "(bucket_sentence has both).",
            )
    usable = {k: v for k, v in changes.items() if k in names}
    if options is None or not usable:
        return section
    try:
        if isinstance(options, Mapping):
            new_options: ComponentOptions = {**options, **usable}
        else:
            new_options = dataclasses.replace(options, **usable)
    except InvalidValue as exc:
        if exc.key == "batch_size" and "batch_size" in usable:  # the argument, not the file
            raise ConfigError(
                f"--batch-size {usable['batch_size']}: {where}.{exc}.",
                hint="Give a smaller --batch-size.",
            ) from exc
        raise ConfigError(f"{where}: {exc}") from exc
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    return dataclasses.replace(section, options=new_options)


def _data_section(
    config: Config,
    role: str,
    data: Path | str | None,
    batch_size: int | None,
    target: Path | None = None,
) -> tuple[IteratorSection, str]:
    """The iterator section to build and its dotted name for messages."""
    changes: dict[str, Any] = {}
    if batch_size is not None:
        changes["batch_size"] = batch_size
    _check_target_argument(config, role, data, target)
    if batch_size is not None:
        read_by = config.data.eval or config.data.train
        # an iterator that can size batches otherwise (batch_tokens) says what batch_size replaces
        for key in getattr(type(read_by.options), "batch_size_replaces", ()):
            changes[key] = None
    if data is None:
        if config.data.eval is None:
            raise ConfigError(
                f"The run's config ({config.source}) has no data.eval section, so there is "
                "nothing to score by default.",
                hint="Pass --data FILE to score a text file (read with the training data's "
                "iterator options).",
            )
        return _with_options(config.data.eval, "data.eval", **changes), "data.eval"
    sets = dict(config.data.eval_sets)
    if isinstance(data, str) and data in sets:  # --data NAME: one of the eval sets
        return _with_options(sets[data], f"data.eval.{data}", **changes), f"data.eval.{data}"
    section, where = config.data.eval, "data.eval"
    if section is None:
        section, where = config.data.train, "data.train"
    changes.update(source=str(data), max_sentences=None, shuffle=False)
    if target is not None:
        changes.update(target=str(target), max_pairs=None)
    # row iterators (ndarray, csv): all of the file, and no labels file of the training data
    changes.update(max_rows=None, labels=None, num_parts=1, part_index=0)
    return _with_options(section, where, **changes), where


def _calibration_section(config: Config, file: Path | None) -> tuple[IteratorSection, str]:
    """The iterator section --int8 calibrates on: data.train, or ``file`` read with its
    options."""
    train = config.data.train
    if file is None:
        return train, "data.train"
    changes = dict(source=str(file), max_sentences=None, max_rows=None, labels=None)
    return _with_options(train, "data.train", **changes), "--calibration-data"


def _option_names(section: IteratorSection | None) -> set[str]:
    """The option keys of an iterator section (a dataclass's fields or a mapping's keys)."""
    options = section.options if section is not None else None
    if dataclasses.is_dataclass(options) and not isinstance(options, type):
        return {f.name for f in dataclasses.fields(options)}
    return set(options) if isinstance(options, Mapping) else set()


def _check_target_argument(
    config: Config, role: str, data: Path | str | None, target: Path | None
) -> None:
    """``--target`` names the target side of parallel data (an iterator with a ``target``
    option): scoring a file of such data needs it, and nothing else takes it."""
    section = config.data.eval or config.data.train
    parallel = "target" in _option_names(section)
    if target is not None and not parallel:
        raise ConfigError(
            f"--target applies to parallel (source, target) data; this run's iterator "
            f"{section.name!r} reads one file.",
            hint="Leave out --target and give the file to score with --data.",
        )
    if target is not None and data is None:
        raise ConfigError(
            "--target needs --data: the source side of the same pairs.",
            hint="Give both: --data SOURCE_FILE --target TARGET_FILE.",
        )
    named_set = data is not None and str(data) in config.data.eval_set_names
    if parallel and role == "eval" and data is not None and target is None and not named_set:
        raise ConfigError(
            f"--data {data}: this run reads parallel data ({section.name}), so scoring a file "
            "needs its target side too.",
            hint="Give both: --data SOURCE_FILE --target TARGET_FILE (line i of one pairs "
            "with line i of the other).",
        )


def _training_buckets(
    run: RunFolder, config: Config, chosen: ChosenCheckpoint, *, read_data: bool
) -> BucketKeys | None:
    """The bucket keys the model was trained with, when they can be known.

    Saved with the checkpoint, else the config's explicit ``data.train.buckets``, else
    (``read_data``, built-in iterator with ``buckets: auto``) derived from the training data
    as fit did. Scoring needs them to reproduce fit's evaluation exactly (eval reuses the
    training buckets; long sentences are split at the largest one). Predictions do not depend
    on them: without them the input's own buckets are used.
    """
    recorded = recorded_buckets(chosen.loaded, run)
    if recorded is not None:
        return recorded
    train = config.data.train
    buckets = getattr(train.options, "buckets", None)
    if isinstance(buckets, list | tuple) and buckets:
        if all(isinstance(b, list | tuple) for b in buckets):  # (source, target) pairs
            return tuple(sorted((int(s), int(t)) for s, t in buckets))
        return tuple(sorted(int(b) for b in buckets))
    if not read_data or train.name != "bucket_sentence" or buckets != "auto":
        return None
    from mxtrain.data.bucket_sentence import train_buckets  # deferred: it imports MXNet

    try:
        return tuple(train_buckets(train.options, config.base_dir))
    except DataError as exc:
        log.warning(
            "the training buckets cannot be recovered (%s); using the data's own buckets, so "
            "sentences longer than the largest training bucket may be split differently than "
            "during fit",
            exc.message,
        )
        return None


class _ExpectedLargeBuckets(logging.Filter):
    """Predicting binds buckets beyond the largest training bucket on purpose (for long
    lines); the module's advice to make the default bucket the largest is moot there."""

    def filter(self, record: logging.LogRecord) -> bool:
        # mxtrain.engine.bucket_pool.LARGER_BUCKET_WARNING (not imported: that loads MXNet)
        if str(record.msg).startswith("bucket %r %s the default bucket %r"):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


_module_log = logging.getLogger("mxtrain.predict")
_module_log.addFilter(_ExpectedLargeBuckets())


def _load_params(opened: OpenedRun, overrides: Sequence[str]) -> None:
    """Load the params file into the module, explaining any mismatch with the model."""
    module, path = opened.module, opened.params_file
    args, auxs = opened.params()
    problems = param_problems(module.param_shapes(), (args, auxs), source="the checkpoint")
    if problems:
        raise params_mismatch_error(path, opened.run.config_file, problems, overrides)
    module.set_params(args, auxs)


def _named_files(
    data: str | os.PathLike[str] | None,
    target: str | os.PathLike[str] | None,
    role: str,
    eval_sets: tuple[str, ...] = (),
) -> tuple[Path | str | None, Path | None]:
    """The data file (or treebank split, or the name of one of ``eval_sets`` when no file has
    that name) and parallel target file named on the command line."""
    data_file: Path | str | None = None
    if data is not None and str(data).startswith(TREEBANK_PREFIX):
        data_file = str(data)  # a split of the treebank package, read by the iterator
    elif data is not None and str(data) in eval_sets and not Path(data).exists():
        data_file = str(data)  # one of the run's eval sets
    elif data:
        data_file = input_file(data, "data file" if role == "eval" else "input file")
    if role == "predict" and data_file is None:
        raise ValueError("role 'predict' needs a data file")
    return data_file, input_file(target, "target file") if target is not None else None


@uses_kept_plugins
def open_run(
    ref: str | os.PathLike[str],
    *,
    epoch: int | None = None,
    overrides: Sequence[str] = (),
    batch_size: int | None = None,
    data: str | os.PathLike[str] | None = None,
    role: str = "eval",
    target: str | os.PathLike[str] | None = None,
    needs_module: Callable[[Any], bool] | None = None,
    int8: Int8Options | None = None,
) -> OpenedRun:
    """Rebuild a run's model and data for inference from its run folder.

    ``ref`` is ``RUN`` or ``RUN:EPOCH`` (or give ``epoch``); the newest checkpoint by default.
    ``overrides`` are ``--set`` values applied to the saved config (e.g. ``context.count=2``
    to change devices; changes to ``model.*`` cannot fit the checkpoint). ``data`` is a text
    file to read instead of ``data.eval`` (relative to the current folder), with the iterator
    options of ``data.eval`` (or ``data.train`` when there is none); ``batch_size`` replaces
    the iterator's. ``role`` is ``"eval"`` (score: exactly as fit evaluated) or
    ``"predict"`` (every line whole, in file order, see ``DataContext``). ``target`` is the
    target side of parallel data (``data`` then being the source side). ``needs_module(
    data_iter)`` False: no module is bound (``module`` is None; decoding binds its own graphs
    with :meth:`OpenedRun.params`); None: always bound. ``int8``: the module runs its heavy
    operators in int8 (:mod:`mxtrain.inference.int8`).
    """
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, not {role!r}")
    if batch_size is not None and batch_size < 1:
        raise ConfigError(f"The batch size must be a positive integer, got {batch_size}.")
    path, ref_choice = parse_checkpoint_ref(ref)
    wanted = merge_selectors(ref_choice, epoch, os.fspath(ref))
    run = open_run_folder(path)
    status = run.read_status()
    config_dir = run.config_dir()
    config = load_config(run.config_file, overrides, base_dir=config_dir)
    data_file, target_file = _named_files(data, target, role, config.data.eval_set_names)
    if int8 is not None and int8.calibration_data is not None:
        calibration_file = input_file(int8.calibration_data, "calibration data file")
        int8 = dataclasses.replace(int8, calibration_data=calibration_file)

    configure_threads(config.context)  # before MXNet is imported (reading the checkpoint)
    chosen = resolve_checkpoint(run, config.checkpoint.prefix, wanted)
    if status.get("status") not in (None, "finished"):
        log.warning(
            "the run %s did not finish (status: %s); using its checkpoint %s",
            run.path,
            status.get("status"),
            chosen.describe(),
        )
    from mxtrain.engine.shapes import fewest_rows  # deferred: MXNet after the threads

    section, where = _data_section(config, role, data_file, batch_size, target_file)
    contexts = build_contexts(config.context)
    context = DataContext(
        role=role,
        seed=config.experiment.seed,
        base_dir=config.base_dir,
        vocab_file=run.vocab_file.absolute(),  # iterators resolve relative paths elsewhere
        buckets=_training_buckets(run, config, chosen, read_data=role == "eval"),
        min_batch=fewest_rows(len(contexts), config.context.work_load),
        char_max_len=reads_chars(config.model.options),
    )
    data_iter = build_data_iter(section, context, config.base_dir, where)
    source = getattr(data_iter, "source", None) or (str(data_file) if data_file else where)
    describe = getattr(data_iter, "describe", None)
    if callable(describe):
        log.info("%s data: %s", role, describe())

    decodes = getattr(data_iter.data_info, "task", None) == TASK_SEQ2SEQ
    bound = needs_module is None or needs_module(data_iter)
    if int8 is not None and (decodes or not bound):
        raise ConfigError(
            "--int8 runs a model's own graph in int8; decoding (seq2seq models, --task "
            "generate) binds step graphs of its own, which stay fp32.",
            hint="Leave out --int8 here.",
        )
    if not bound:
        log.info("loaded the checkpoint %s (%s)", chosen.params_file, chosen.describe())
        return OpenedRun(
            run, chosen.epoch, chosen.params_file, config, data_iter, None, str(source), chosen,
            contexts,
        )  # fmt: skip
    logger = _module_log if role == "predict" else log

    def build(graphs: Callable[[Any], Any] | None, data: Any) -> Any:
        return build_module(
            config,
            data,
            where,
            contexts,
            for_training=False,
            logger=logger,
            for_metrics=role == "eval",  # score: the same outputs as the evaluations in fit
            graphs=graphs,
        )

    if int8 is None:
        module = build(None, data_iter)
        report = None
    else:
        check_int8_devices(contexts)
        section, section_where = _calibration_section(config, int8.calibration_data)

        def calibration_iter() -> Any:
            # read as predict reads (labels optional, nothing dropped), in file order
            reading = dataclasses.replace(context, role="predict")
            return build_data_iter(section, reading, config.base_dir, section_where)

        module, report = int8_module(run, chosen, int8, build, data_iter, calibration_iter)
    opened = OpenedRun(
        run, chosen.epoch, chosen.params_file, config, data_iter, module, str(source), chosen,
        contexts, report,
    )  # fmt: skip
    if int8 is None:
        _load_params(opened, overrides)
    log.info(
        "loaded %s (checkpoint %s: epoch %d, batch %d) on %s",
        chosen.params_file,
        chosen.describe(),
        chosen.epoch,
        chosen.batch,
        ", ".join(str(c) for c in contexts),
    )
    return opened
