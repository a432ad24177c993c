"""Scoring and predicting with a trained model, starting from its run folder alone.

A run folder written by ``mxtrain fit`` holds everything needed: ``config.yaml`` (the resolved
config; relative paths in it resolve against ``run.json``'s ``config_dir``), ``vocab.json`` and
``<prefix>-NNNN.params``. :func:`open_run` rebuilds the data iterator with the saved vocabulary,
the model from ``config.model`` and our BucketingModule bound for inference, and loads one
epoch's parameters. :func:`score_run` runs the config's metrics over data; :func:`predict_run`
writes one record per input line, in input order.

What a prediction record holds depends on the model's task, which the data iterator reports
in ``data_info.task``. Language models (``"lm"``) are handled here; classifiers
(``"classify"``) and regressors (``"regress"``) in :mod:`mxtrain.inference.rows`; each task has
its entry in ``_PREDICTORS``.

No click here; MXNet is imported inside the functions, after the thread settings of the
run's config are applied.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

import numpy as np

from mxtrain.config import Config, load_config
from mxtrain.data.base import TASK_LM, TASK_TAG, DataContext
from mxtrain.errors import ConfigError, DataError, RunFolderError
from mxtrain.inference.output import check_output, resolve_output, write_output
from mxtrain.run.layout import (
    CONFIG_FILE,
    PARAMS_FILE,
    RunFolder,
    checkpoint_tag,
    params_file_epoch,
)
from mxtrain.run.params import ParamsFileError, read_params
from mxtrain.run.plugin_files import uses_kept_plugins

log = logging.getLogger("mxtrain")

FORMATS = ("jsonl", "csv", "npy")
ROLES = ("eval", "predict")
_EXAMPLE = "runs/ptb_lstm"


# --------------------------------------------------------------------------------------------
# Finding the run folder and the checkpoint
# --------------------------------------------------------------------------------------------


def parse_checkpoint_ref(ref: str | os.PathLike[str]) -> tuple[Path, int | str | None]:
    """Split ``RUN[:EPOCH|:best|:latest|:TAG]`` into the run folder and what to load.

    ``"runs/x"`` -> ``(Path("runs/x"), None)`` (the newest valid checkpoint);
    ``"runs/x:3"`` -> ``(Path("runs/x"), 3)`` (the end of epoch 3); ``"runs/x:best"``,
    ``"runs/x:latest"`` and ``"runs/x:e0002-b000020"`` keep the text after the colon. A path
    that exists as written is taken whole, even with a colon.
    """
    from mxtrain.run.checkpoint import BEST, LATEST
    from mxtrain.run.layout import parse_tag

    text = os.fspath(ref)
    if not text.strip():
        raise ConfigError(
            "The checkpoint reference is empty.",
            hint=f"Give a run folder such as {_EXAMPLE}, or {_EXAMPLE}:3 for epoch 3.",
        )
    head, sep, tail = text.rpartition(":")
    if not sep or not head or Path(text).exists():
        return Path(text), None
    if tail.isascii() and tail.isdigit():
        return Path(head), int(tail)
    if tail in (BEST, LATEST) or parse_tag(tail) is not None:
        return Path(head), tail
    raise ConfigError(
        f"The checkpoint reference {text!r} ends in {':' + tail!r}, which is not an epoch "
        "number, 'best', 'latest' or a checkpoint tag.",
        hint=f"Write RUN:EPOCH (e.g. {_EXAMPLE}:3), RUN:best, RUN:latest or RUN:TAG (e.g. "
        f"{_EXAMPLE}:e0002-b000020; `mxtrain show RUN` lists the tags), or leave it out for "
        "the newest valid checkpoint.",
    )


def checkpoint_epochs(run: RunFolder, prefix: str) -> list[int]:
    """Epochs that have a ``<prefix>-NNNN.params`` file in ``run``, ascending."""
    epochs = []
    for path in run.path.iterdir():
        epoch = params_file_epoch(prefix, path.name)
        if epoch is not None and path.is_file():
            epochs.append(epoch)
    return sorted(epochs)


def _open_folder(path: Path) -> RunFolder:
    """The run folder at ``path``, or a RunFolderError saying what is missing."""
    if not path.exists():
        hint = "Pass the folder `mxtrain fit` created (runs/<experiment> by default)."
        parent = path.parent if str(path.parent) else Path(".")
        if parent.is_dir():
            runs = sorted(
                p.name for p in parent.iterdir() if p.is_dir() and (p / CONFIG_FILE).is_file()
            )
            if runs:
                shown = ", ".join(runs[:10]) + (", ..." if len(runs) > 10 else "")
                hint += f" Run folders in {parent}: {shown}."
        raise RunFolderError(f"The run folder {path} does not exist.", hint=hint)
    if not path.is_dir():
        raise RunFolderError(
            f"{path} is a file, not a run folder.",
            hint="Pass the folder `mxtrain fit` created (runs/<experiment> by default), "
            f"optionally with :EPOCH, e.g. {_EXAMPLE}:3.",
        )
    run = RunFolder(path)
    if not run.config_file.is_file():
        raise RunFolderError(
            f"The run folder {path} is incomplete: it has no {CONFIG_FILE}.",
            hint="Only folders written by `mxtrain fit` can be scored or used for predictions; "
            "a run that failed before it started training may have left a partial folder.",
        )
    return run


@dataclass(frozen=True)
class ChosenCheckpoint:
    """What :func:`resolve_checkpoint` picked: a verified checkpoint folder, or (run folders
    without ``checkpoints/``, or an epoch that has only its top-level file) an unverified
    ``<prefix>-NNNN.params``."""

    epoch: int  # epochs completed
    batch: int  # batches of the next epoch trained (0: an epoch end)
    tag: str | None  # None: a top-level params file
    params_file: Path
    loaded: Any = None  # checkpoint.LoadedCheckpoint (parameters, bucket keys) or None

    def describe(self) -> str:
        return self.tag if self.tag is not None else self.params_file.name


def resolve_checkpoint(run: RunFolder, prefix: str, wanted: int | str | None) -> ChosenCheckpoint:
    """The checkpoint of ``run`` to load: the newest valid one (None or "latest"), the end of
    epoch N (an int), the recorded best ("best") or a tag, read and verified.

    The choice itself is :func:`mxtrain.run.checkpoint.find_and_load` (the one resume uses): a
    default choice skips unusable checkpoints with a warning; one named explicitly that is
    unusable is a CheckpointError (exit 3) naming the file. A run folder without checkpoints
    (or an epoch whose checkpoint folder was not kept) falls back to ``<prefix>-NNNN.params``,
    which has no checksum: a warning says so.
    """
    from mxtrain.run import checkpoint

    listed = {c.tag: c for c in checkpoint.list_checkpoints(run)}
    epochs = checkpoint_epochs(run, prefix)
    tag: str | None = None
    if isinstance(wanted, int):
        tag = checkpoint_tag(wanted, 0)
        if tag not in listed:
            if wanted not in epochs:
                raise _no_epoch(run, prefix, wanted, epochs)
            return _unverified(run, prefix, wanted)
    elif wanted == checkpoint.BEST and checkpoint.best_tag(run) is None:
        tag = _logged_best(run) or wanted
    elif wanted is not None:
        tag = wanted
    if not listed:
        if tag is not None and not isinstance(wanted, int):
            raise RunFolderError(
                f"The run folder {run.path} has no checkpoint folders "
                f"({run.checkpoints_dir} is missing or empty), so it has no "
                f"checkpoint {wanted!r}.",
                hint="Leave the selector out (or give RUN:EPOCH) to use its "
                f"{prefix}-NNNN.params files.",
            )
        if not epochs:
            raise RunFolderError(
                f"The run folder {run.path} has no checkpoint: no checkpoint folder and no "
                f"{prefix}-NNNN.params file in it.",
                hint="The run stopped before its first checkpoint (see run.json and "
                "train.log); train it again, or pick another run folder.",
            )
        return _unverified(run, prefix, epochs[-1])
    loaded, skipped = checkpoint.find_and_load(run, tag=tag, optimizer=False)
    for bad, reason in skipped:
        log.warning("checkpoint %s is not usable (%s); skipped it", bad.tag, reason)
    ckpt = loaded.checkpoint
    return ChosenCheckpoint(ckpt.epoch, ckpt.batch, ckpt.tag, ckpt.path / PARAMS_FILE, loaded)


def _logged_best(run: RunFolder) -> str | None:
    """Without ``checkpoints/best`` (no checkpoint.best_metric): the checkpoint saved with the
    best logged value, the one ``mxtrain runs`` and ``show`` report as best."""
    from mxtrain.run.history import summarize_run

    best = summarize_run(run.path).best
    if best is None or best.checkpoint is None:
        return None
    log.info(
        "no best checkpoint recorded; using %s, saved with the best %s %s (%g at epoch %d)",
        best.checkpoint,
        best.split,
        best.metric,
        best.value,
        best.epoch,
    )
    return best.checkpoint


def _no_epoch(run: RunFolder, prefix: str, epoch: int, epochs: list[int]) -> RunFolderError:
    listed = ", ".join(str(e) for e in epochs) or "none"
    example = f"{run.path}:{epochs[-1]}" if epochs else f"{run.path}:latest"
    return RunFolderError(
        f"The run folder {run.path} has no checkpoint for epoch {epoch} "
        f"({run.params_file(prefix, epoch).name} is missing).",
        hint=f"It has epoch{'s' if len(epochs) != 1 else ''} {listed}: pass one of them, e.g. "
        f"{example}, RUN:TAG for a mid-epoch checkpoint, or leave the epoch out for the "
        "newest.",
    )


def _unverified(run: RunFolder, prefix: str, epoch: int) -> ChosenCheckpoint:
    path = run.params_file(prefix, epoch)
    log.warning(
        "using %s, which has no checkpoint folder with checksums: it cannot be verified",
        path,
    )
    return ChosenCheckpoint(epoch, 0, None, path)


def _merge_epochs(ref_choice: int | str | None, epoch: int | None, ref: str) -> int | str | None:
    if ref_choice is not None and epoch is not None and ref_choice != epoch:
        raise ConfigError(
            f"Two different checkpoints were given: {ref!r} says {ref_choice}, --epoch says "
            f"{epoch}.",
            hint="Give the checkpoint once, as RUN:EPOCH (or RUN:best, RUN:TAG) or with --epoch.",
        )
    chosen = ref_choice if ref_choice is not None else epoch
    if isinstance(chosen, int) and chosen < 0:
        raise ConfigError(f"The epoch must not be negative, got {chosen}.")
    return chosen


def _input_file(path: str | os.PathLike[str], what: str) -> Path:
    """An input file named on the command line: relative to the current folder, must exist."""
    file = Path(path).expanduser()
    if not file.is_absolute():
        file = Path.cwd() / file
    if not file.exists():
        raise DataError(
            f"The {what} {path} does not exist.",
            hint="Paths on the command line are relative to the current folder; give a file "
            "the run's data iterator reads (a language model: UTF-8 text, one sentence per "
            "line; a classifier: .npy/.npz/.csv rows).",
        )
    if not file.is_file():
        raise DataError(f"The {what} {path} is not a file.", hint="Give a file, not a folder.")
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


def _with_options(section: Any, where: str, **changes: Any) -> Any:
    """``section`` (an IteratorSection) with some iterator options replaced.

    ``source`` must be an option of the iterator (it says what to read); other keys are
    replaced where the iterator has them, and ``batch_size`` must be one when it is given.
    """
    options = section.options
    if dataclasses.is_dataclass(options) and not isinstance(options, type):
        names = {f.name for f in dataclasses.fields(options)}
    elif isinstance(options, Mapping):
        names = set(options)
    else:
        names = set()
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
    if not usable:
        return section
    try:
        if isinstance(options, Mapping):
            new_options: Any = {**options, **usable}
        else:
            new_options = dataclasses.replace(options, **usable)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    return dataclasses.replace(section, options=new_options)


def _data_section(
    config: Config, role: str, data: Path | None, batch_size: int | None
) -> tuple[Any, str]:
    """The iterator section to build and its dotted name for messages."""
    changes: dict[str, Any] = {}
    if batch_size is not None:
        changes["batch_size"] = batch_size
    if data is None:
        if config.data.eval is None:
            raise ConfigError(
                f"The run's config ({config.source}) has no data.eval section, so there is "
                "nothing to score by default.",
                hint="Pass --data FILE to score a text file (read with the training data's "
                "iterator options).",
            )
        return _with_options(config.data.eval, "data.eval", **changes), "data.eval"
    section, where = config.data.eval, "data.eval"
    if section is None:
        section, where = config.data.train, "data.train"
    changes.update(source=str(data), max_sentences=None, shuffle=False)
    # row iterators (ndarray, csv): all of the file, and no labels file of the training data
    changes.update(max_rows=None, labels=None, num_parts=1, part_index=0)
    return _with_options(section, where, **changes), where


def _recorded_buckets(chosen: ChosenCheckpoint) -> tuple[int, ...] | None:
    """Bucket keys saved in the chosen checkpoint's state.json (see mxtrain.run.checkpoint), if
    it has them and they are plain lengths."""
    keys = chosen.loaded.bucket_keys if chosen.loaded is not None else None
    if isinstance(keys, list) and keys and all(type(k) is int and k > 0 for k in keys):
        return tuple(sorted(keys))
    return None


def _training_buckets(
    config: Config, chosen: ChosenCheckpoint, *, read_data: bool
) -> tuple[int, ...] | None:
    """The bucket keys the model was trained with, when they can be known.

    Saved with the checkpoint, else the config's explicit ``data.train.buckets``, else
    (``read_data``, built-in iterator with ``buckets: auto``) derived from the training data
    as fit did. Scoring needs them to reproduce fit's evaluation exactly (eval reuses the
    training buckets; long sentences are split at the largest one). Predictions do not depend
    on them: without them the input's own buckets are used.
    """
    recorded = _recorded_buckets(chosen)
    if recorded is not None:
        return recorded
    train = config.data.train
    buckets = getattr(train.options, "buckets", None)
    if isinstance(buckets, list | tuple) and buckets:
        return tuple(sorted(int(b) for b in buckets))
    if not read_data or train.name != "bucket_sentence" or buckets != "auto":
        return None
    from mxtrain.data.bucket_sentence import train_buckets

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
        if str(record.msg).startswith("bucket %r is larger than the default bucket"):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


_module_log = logging.getLogger("mxtrain.predict")
_module_log.addFilter(_ExpectedLargeBuckets())


def _read_params(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    hint = (
        "The file may be truncated or not an MXNet parameter file; pick another epoch "
        "(RUN:EPOCH) or train the run again."
    )
    try:
        return read_params(path)
    except ParamsFileError as exc:
        if exc.kind == "unreadable":
            message = f"The checkpoint {path} cannot be read ({exc.detail})."
        elif exc.kind == "entry":
            message = (
                f"The checkpoint {path} has an entry {exc.detail!r}; MXNet parameter files "
                "name every entry 'arg:NAME' or 'aux:NAME'."
            )
        else:
            message = f"The checkpoint {path} has no named parameters."
        raise DataError(message, hint=hint) from None


def _load_params(opened: OpenedRun, overrides: Sequence[str]) -> None:
    """Load the params file into the module, explaining any mismatch with the model."""
    module, path = opened.module, opened.params_file
    chosen = opened.checkpoint
    if chosen is not None and chosen.loaded is not None:  # verified and read already
        args, auxs = chosen.loaded.arg_params, chosen.loaded.aux_params
    else:
        args, auxs = _read_params(path)
    data_iter = opened.data_iter
    shapes = {d[0]: tuple(d[1]) for d in [*data_iter.provide_data, *data_iter.provide_label]}
    symbol = module.symbol
    arg_shapes, _, aux_shapes = symbol.infer_shape(**shapes)
    expected = dict(zip(symbol.list_arguments(), arg_shapes or [], strict=True))
    expected.update(zip(symbol.list_auxiliary_states(), aux_shapes or [], strict=True))
    problems = []
    for kind, given, names in (
        ("parameter", args, module.param_names),
        ("auxiliary state", auxs, module.aux_names),
    ):
        missing = [n for n in names if n not in given]
        extra = sorted(set(given) - set(names))
        if missing:
            problems.append(f"the model's {kind}s {', '.join(missing)} are not in the file")
        if extra:
            problems.append(f"the file has {kind}s the model lacks: {', '.join(extra)}")
        for name in names:
            if name in given and name in expected:
                have, want = tuple(given[name].shape), tuple(expected[name])
                if have != want:
                    problems.append(f"{name} is {have} in the file but the model needs {want}")
    if problems:
        model_overrides = [o for o in overrides if o.strip().startswith("model.")]
        if model_overrides:
            raise ConfigError(
                f"The checkpoint {path} does not fit the model: " + "; ".join(problems) + ".",
                hint=f"The override(s) {', '.join(model_overrides)} change the model, whose "
                "shape is fixed by the checkpoint; leave them out.",
            )
        raise DataError(
            f"The checkpoint {path} does not fit the model in {opened.run.config_file}: "
            + "; ".join(problems)
            + ".",
            hint="The params file and config.yaml seem to come from different runs; use the "
            "run folder exactly as `mxtrain fit` wrote it.",
        )
    module.set_params(args, auxs)


@uses_kept_plugins
def open_run(
    ref: str | os.PathLike[str],
    *,
    epoch: int | None = None,
    overrides: Sequence[str] = (),
    batch_size: int | None = None,
    data: str | os.PathLike[str] | None = None,
    role: str = "eval",
) -> OpenedRun:
    """Rebuild a run's model and data for inference from its run folder.

    ``ref`` is ``RUN`` or ``RUN:EPOCH`` (or give ``epoch``); the newest checkpoint by default.
    ``overrides`` are ``--set`` values applied to the saved config (e.g. ``context.count=2``
    to change devices; changes to ``model.*`` cannot fit the checkpoint). ``data`` is a text
    file to read instead of ``data.eval`` (relative to the current folder), with the iterator
    options of ``data.eval`` (or ``data.train`` when there is none); ``batch_size`` replaces
    the iterator's. ``role`` is ``"eval"`` (score: exactly as fit evaluated) or
    ``"predict"`` (every line whole, in file order, see ``DataContext``).
    """
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, not {role!r}")
    if batch_size is not None and batch_size < 1:
        raise ConfigError(f"The batch size must be a positive integer, got {batch_size}.")
    path, ref_choice = parse_checkpoint_ref(ref)
    wanted = _merge_epochs(ref_choice, epoch, os.fspath(ref))
    data_file = _input_file(data, "data file" if role == "eval" else "input file") if data else None
    if role == "predict" and data_file is None:
        raise ValueError("role 'predict' needs a data file")

    run = _open_folder(path)
    status = run.read_status()
    config_dir = run.config_dir()
    config = load_config(run.config_file, overrides, base_dir=config_dir)

    from mxtrain.devices import build_contexts, configure_threads

    configure_threads(config.context)  # before MXNet is imported (reading the checkpoint)
    chosen = resolve_checkpoint(run, config.checkpoint.prefix, wanted)
    if status.get("status") not in (None, "finished"):
        log.warning(
            "the run %s did not finish (status: %s); using its checkpoint %s",
            run.path,
            status.get("status"),
            chosen.describe(),
        )
    from mxtrain.build import build_data_iter, build_sym_gen, explained_model_errors
    from mxtrain.engine.bucketing import BucketingModule

    section, where = _data_section(config, role, data_file, batch_size)
    context = DataContext(
        role=role,
        seed=config.experiment.seed,
        base_dir=config.base_dir,
        vocab_file=run.vocab_file.absolute(),  # iterators resolve relative paths elsewhere
        buckets=_training_buckets(config, chosen, read_data=role == "eval"),
    )
    data_iter = build_data_iter(section, context, config.base_dir, where)
    source = getattr(data_iter, "source", None) or (str(data_file) if data_file else where)
    describe = getattr(data_iter, "describe", None)
    if callable(describe):
        log.info("%s data: %s", role, describe())

    sym_gen = build_sym_gen(config.model, data_iter.data_info, config.base_dir)
    contexts = build_contexts(config.context)
    work_load = config.context.work_load
    with explained_model_errors(config, data_iter, where):
        module = BucketingModule(
            sym_gen,
            data_iter.default_bucket_key,
            contexts,
            work_load_list=list(work_load) if work_load else None,
            logger=_module_log if role == "predict" else log,
        )
        # The language model's loss layer takes labels, so they are bound too.
        module.bind(data_iter.provide_data, data_iter.provide_label, for_training=False)
    opened = OpenedRun(
        run, chosen.epoch, chosen.params_file, config, data_iter, module, str(source), chosen
    )
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


# --------------------------------------------------------------------------------------------
# Scoring
# --------------------------------------------------------------------------------------------


@dataclass
class ScoreReport:
    """What ``mxtrain score`` prints."""

    run: Path
    epoch: int
    data: str
    metrics: dict[str, float]
    seconds: float = 0.0
    checkpoint: str | None = None  # the tag loaded, or the params file's name without one
    batch: int = 0  # batches of the next epoch in the checkpoint (mid-epoch)

    def to_json(self) -> dict[str, Any]:
        """``{"run", "epoch", "batch", "checkpoint", "data", "metrics"}``; non-finite values
        become null."""
        return {
            "run": str(self.run),
            "epoch": self.epoch,
            "batch": self.batch,
            "checkpoint": self.checkpoint,
            "data": self.data,
            "metrics": {k: _finite(v) for k, v in self.metrics.items()},
        }


@uses_kept_plugins
def score_checkpoint(
    ref: str | os.PathLike[str],
    *,
    epoch: int | None = None,
    data: str | os.PathLike[str] | None = None,
    batch_size: int | None = None,
    overrides: Sequence[str] = (),
) -> ScoreReport:
    """Score a run's checkpoint with the config's ``fit.metrics`` (see :func:`score_run`)."""
    started = time.perf_counter()
    opened = open_run(
        ref, epoch=epoch, overrides=overrides, batch_size=batch_size, data=data, role="eval"
    )
    from mxtrain.build import build_metric
    from mxtrain.engine.loop import MetricSet, score

    config = opened.config
    data_info = opened.data_iter.data_info
    metrics = MetricSet([build_metric(n, data_info, config.base_dir) for n in config.fit.metrics])
    values = score(opened.module, opened.data_iter, metrics, prefetch=config.fit.prefetch)
    chosen = opened.checkpoint
    report = ScoreReport(
        opened.run.path,
        opened.epoch,
        opened.data_source,
        values,
        seconds=time.perf_counter() - started,
        checkpoint=chosen.describe() if chosen is not None else None,
        batch=chosen.batch if chosen is not None else 0,
    )
    log.info("scored %s in %.1fs", opened.data_source, report.seconds)
    return report


def score_run(
    ref: str | os.PathLike[str],
    *,
    epoch: int | None = None,
    data: str | os.PathLike[str] | None = None,
    batch_size: int | None = None,
    overrides: Sequence[str] = (),
) -> dict[str, float]:
    """The config's ``fit.metrics`` of a checkpoint over ``data.eval`` (or the file ``data``).

    Over ``data.eval`` this is the value fit logged for that epoch in metrics.jsonl (all of the
    data is scored: if fit ran with ``fit.eval_max_batches``, fit scored only part of it). The
    batch size and devices do not change the value beyond float rounding.
    """
    return score_checkpoint(
        ref, epoch=epoch, data=data, batch_size=batch_size, overrides=overrides
    ).metrics


# --------------------------------------------------------------------------------------------
# Predicting
# --------------------------------------------------------------------------------------------


class Predictions(Protocol):
    """Per-line results of one task, in input order, ready for any output format."""

    def records(self) -> Iterator[dict[str, Any]]:
        """One JSON-able dict per input line."""
        ...

    def csv_header(self) -> list[str]: ...

    def csv_rows(self) -> Iterator[list[Any]]:
        """One row per input line (None for an empty cell)."""
        ...

    def to_numpy(self) -> np.ndarray:
        """One structured-array row per input line."""
        ...

    def totals(self) -> tuple[int, int, int, float]:
        """(lines, lines without a prediction, predicted tokens, total log-likelihood)."""
        ...


@dataclass
class PredictSummary:
    """What ``predict_run`` did."""

    run: Path
    epoch: int
    input: Path
    output: Path
    format: str
    lines: int  # records written (= input lines)
    empty: int  # lines without a prediction (no tokens): null values
    tokens: int  # predicted tokens over all lines
    log_likelihood: float  # their total natural-log likelihood
    seconds: float
    checkpoint: str | None = None  # the tag loaded, or the params file's name without one

    @property
    def perplexity(self) -> float:
        """exp(-log_likelihood / tokens) over the whole input (nan without tokens)."""
        return math.exp(-self.log_likelihood / self.tokens) if self.tokens else math.nan


@dataclass
class LmPredictions:
    """Language-model results per input line (see :func:`predict_run` for their meaning)."""

    tokens: np.ndarray  # int64 [n]: predicted tokens (0 for an empty line)
    log_likelihood: np.ndarray  # float64 [n]: nan for an empty line
    next_ids: np.ndarray  # int64 [n, k]
    next_probs: np.ndarray  # float32 [n, k]: nan for an empty line
    vocab: Sequence[str] | None  # id -> token, or None (ids are written instead)
    top_k: int
    space_token: str = " "  # the char-level word separator, written <space> in csv

    def totals(self) -> tuple[int, int, int, float]:
        done = self.has_prediction()
        return (
            int(self.tokens.size),
            int((~done).sum()),
            int(self.tokens[done].sum()),
            float(self.log_likelihood[done].sum()),
        )

    def has_prediction(self) -> np.ndarray:
        return ~np.isnan(self.log_likelihood)

    def perplexity(self) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            ppl = np.exp(-self.log_likelihood / self.tokens)
        return np.where(self.tokens > 0, ppl, np.nan)

    def _token(self, token_id: int) -> str:
        return self.vocab[token_id] if self.vocab is not None else str(token_id)

    def _next(self, i: int) -> list[tuple[str, float]] | None:
        if np.isnan(self.log_likelihood[i]):
            return None
        return [
            (self._token(int(t)), _short(p))
            for t, p in zip(self.next_ids[i], self.next_probs[i], strict=True)
        ]

    def records(self) -> Iterator[dict[str, Any]]:
        ppl = self.perplexity()
        for i in range(self.tokens.size):
            record: dict[str, Any] = {
                "line": i + 1,
                "tokens": int(self.tokens[i]),
                "log_likelihood": _finite(float(self.log_likelihood[i])),
                "perplexity": _finite(float(ppl[i])),
            }
            if self.top_k:
                pairs = self._next(i)
                record["next"] = None if pairs is None else [list(p) for p in pairs]
            yield record

    def csv_header(self) -> list[str]:
        header = ["line", "tokens", "log_likelihood", "perplexity"]
        return [*header, "next"] if self.top_k else header

    def csv_rows(self) -> Iterator[list[Any]]:
        for record in self.records():
            row = [record["line"], record["tokens"], record["log_likelihood"], record["perplexity"]]
            if self.top_k:
                pairs = record["next"]
                row.append(
                    None
                    if pairs is None
                    else " ".join(f"{self._csv_token(t)}:{p}" for t, p in pairs)
                )
            yield row

    def _csv_token(self, token: str) -> str:
        return "<space>" if token == self.space_token else token

    def to_numpy(self) -> np.ndarray:
        n, k = self.tokens.size, self.top_k
        fields: list[tuple[Any, ...]] = [
            ("line", "<i8"),
            ("tokens", "<i8"),
            ("log_likelihood", "<f8"),
            ("perplexity", "<f8"),
        ]
        if k:
            width = max([1, *(len(t) for t in self.vocab or [])]) if self.vocab else 20
            fields += [("next_id", "<i8", (k,)), ("next_prob", "<f4", (k,))]
            fields += [("next_token", f"<U{width}", (k,))]
        out = np.zeros(n, dtype=fields)
        out["line"] = np.arange(1, n + 1)
        out["tokens"] = self.tokens
        out["log_likelihood"] = self.log_likelihood
        out["perplexity"] = self.perplexity()
        if k:
            empty = ~self.has_prediction()
            out["next_id"] = np.where(empty[:, None], -1, self.next_ids)
            out["next_prob"] = self.next_probs
            out["next_token"] = [
                ["" if empty[i] else self._token(int(t)) for t in self.next_ids[i]]
                for i in range(n)
            ]
        return out


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _short(prob: Any) -> float:
    """A float32 probability as the shortest decimal that reads back as the same float32."""
    return float(str(np.float32(prob)))


def _num_lines(data_iter: Any) -> int | None:
    count = getattr(data_iter, "num_sentences", None)
    if count is None:
        stats = getattr(data_iter, "stats", None)
        count = stats.get("sentences") if isinstance(stats, Mapping) else None
    return int(count) if count is not None else None


def _lm_batch(module: Any, batch: Any, pad: int, top: int) -> list[tuple[int, int, Any, Any, Any]]:
    """Queue the per-row reductions of one forward on each device; nothing is read yet.

    Per device part of the batch: (first row, end row, [log-likelihood, tokens], top-k
    probabilities, top-k ids). Only these small arrays ever leave the device.
    """
    import mxnet as mx

    data, label = batch.data[0], batch.label[0]
    steps = int(data.shape[1])
    parts = []
    lo = 0
    for out in module.get_outputs(merge_multi_context=False)[0]:
        rows = out.shape[0] // steps
        if rows * steps != out.shape[0] or out.ndim != 2:
            raise ConfigError(
                f"The model's output has shape {out.shape}; a language model must output "
                f"(batch * time, vocabulary) probabilities (here time = {steps}).",
                hint="mxtrain predict reads the model as a language model because its data "
                "iterator says task 'lm'.",
            )
        hi = lo + rows
        ctx = out.context
        lab = label[lo:hi].as_in_context(ctx)
        prob = out.reshape((rows, steps, -1))
        picked = mx.nd.pick(prob, lab, axis=2)
        if picked.dtype != np.float32:
            picked = picked.astype(np.float32)
        mask = lab != pad
        # -log(max(p, 1e-10)) per position, as the perplexity metric computes it
        ll = mx.nd.sum(mx.nd.log(mx.nd.maximum(picked, 1e-10)) * mask, axis=1)
        sums = mx.nd.stack(ll, mx.nd.sum(mask, axis=1), axis=1)  # (rows, 2)
        vals = ids = None
        if top:
            real = mx.nd.sum(data[lo:hi].as_in_context(ctx) != pad, axis=1)
            last = mx.nd.maximum(real - 1, 0)
            flat = mx.nd.arange(0, rows, ctx=ctx) * steps + last
            vals, ids = mx.nd.topk(mx.nd.take(out, flat), k=top, ret_typ="both")
        parts.append((lo, hi, sums, vals, ids))
        lo = hi
    return parts


def _predict_lm(opened: OpenedRun, top_k: int) -> LmPredictions:
    """Run the predict iterator through the module; per-line results in input order."""
    data_iter, module = opened.data_iter, opened.module
    info = data_iter.data_info
    pad = info.pad_id if info.pad_id is not None else -1
    vocab = getattr(data_iter, "vocab", None)
    tokens_of = vocab.tokens if vocab is not None and hasattr(vocab, "tokens") else None
    classes = int(info.num_classes or 0)
    usable = classes - (1 if 0 <= pad < classes else 0)
    if top_k > usable:
        raise ConfigError(
            f"--top-k {top_k} asks for more tokens than the model can predict ({usable}, "
            "<pad> excluded).",
            hint=f"Use --top-k {min(usable, 10)} or less.",
        )
    # one more than asked, so that <pad> (never a real next token) can be dropped
    top = min(top_k + 1, classes) if top_k else 0

    count = _num_lines(data_iter)
    if count is None:
        raise ConfigError(
            "The data iterator does not report how many lines it read (num_sentences), so "
            "predictions cannot be aligned with the input lines."
        )
    ll = np.full(count, np.nan)
    tokens = np.zeros(count, dtype=np.int64)
    next_ids = np.full((count, top), -1, dtype=np.int64)
    next_probs = np.full((count, top), np.nan, dtype=np.float32)
    seen = np.zeros(count, dtype=bool)

    def collect(index: np.ndarray, parts: list[tuple[int, int, Any, Any, Any]]) -> None:
        for lo, hi, sums, vals, ids in parts:
            rows = index[lo:hi]
            real = rows >= 0
            where = rows[real]
            if seen[where].any():
                raise RuntimeError(f"input lines {where[seen[where]].tolist()} came twice")
            seen[where] = True
            host = sums.asnumpy()[real]
            ll[where] = host[:, 0]
            tokens[where] = np.rint(host[:, 1]).astype(np.int64)
            if top:
                next_probs[where] = vals.asnumpy()[real]
                next_ids[where] = np.rint(ids.asnumpy()[real]).astype(np.int64)

    data_iter.reset()
    pending = None
    batches = 0
    for batch in data_iter:
        module.forward(batch, is_train=False)
        parts = _lm_batch(module, batch, pad, top)
        if pending is not None:
            collect(*pending)  # the previous batch's results, while this one computes
        index = getattr(batch, "index", None)
        if index is None:
            raise ConfigError(
                "The data iterator's batches have no 'index' (the input line of each row), "
                "so predictions cannot be written in input order."
            )
        pending = (np.asarray(index, dtype=np.int64), parts)
        batches += 1
    if pending is not None:
        collect(*pending)
    log.debug("predicted %d batches", batches)

    if top:
        next_ids, next_probs = _drop_pad(next_ids, next_probs, pad, top_k)
    else:
        next_ids = np.zeros((count, 0), dtype=np.int64)
        next_probs = np.zeros((count, 0), dtype=np.float32)
    ll[~seen] = np.nan
    return LmPredictions(tokens, ll, next_ids, next_probs, tokens_of, top_k)


def _drop_pad(ids: np.ndarray, probs: np.ndarray, pad: int, k: int) -> tuple[Any, Any]:
    """Keep the k best of k + 1 candidates per row, never ``<pad>``."""
    keep = ids != pad
    over = keep.sum(axis=1) > k
    keep[over, -1] = False  # no <pad> among them: drop the (k+1)-th
    n = ids.shape[0]
    return ids[keep].reshape(n, k), probs[keep].reshape(n, k)


_PREDICTORS: dict[str, Callable[[OpenedRun, int], Predictions]] = {TASK_LM: _predict_lm}


def _predict_tag(opened: OpenedRun, top_k: int) -> Predictions:
    """Sequence taggers (task "tag"): one record per sentence, see mxtrain.inference.tags."""
    from mxtrain.inference.tags import predict_tags

    return predict_tags(opened, top_k)


_PREDICTORS[TASK_TAG] = _predict_tag


def _predict_classes(opened: OpenedRun, top_k: int) -> Predictions:
    """Classifiers (task "classify"): one record per input row, see mxtrain.inference.rows."""
    from mxtrain.inference.rows import predict_classes

    return predict_classes(opened, top_k)


def _predict_values(opened: OpenedRun, top_k: int) -> Predictions:
    """Regressors (task "regress"): one record per input row, see mxtrain.inference.rows."""
    from mxtrain.inference.rows import predict_values

    return predict_values(opened, top_k)


_PREDICTORS["classify"] = _predict_classes
_PREDICTORS["regress"] = _predict_values


def _writer(predictions: Predictions, fmt: str) -> Callable[[IO[bytes]], None]:
    def text(fill: Callable[[IO[str]], None]) -> Callable[[IO[bytes]], None]:
        def write(handle: IO[bytes]) -> None:
            wrapper = io.TextIOWrapper(handle, encoding="utf-8", newline="")
            fill(wrapper)
            wrapper.flush()
            wrapper.detach()

        return write

    if fmt == "jsonl":

        def jsonl(out: IO[str]) -> None:
            for record in predictions.records():
                out.write(json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n")

        return text(jsonl)
    if fmt == "csv":

        def table(out: IO[str]) -> None:
            writer = csv.writer(out, lineterminator="\n")
            writer.writerow(predictions.csv_header())
            for row in predictions.csv_rows():
                writer.writerow(["" if v is None else v for v in row])

        return text(table)

    def npy(handle: IO[bytes]) -> None:
        np.save(handle, predictions.to_numpy(), allow_pickle=False)

    return npy


@uses_kept_plugins
def predict_run(
    ref: str | os.PathLike[str],
    input: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    epoch: int | None = None,
    fmt: str = "jsonl",
    batch_size: int | None = None,
    top_k: int = 0,
    overrides: Sequence[str] = (),
    force: bool = False,
) -> PredictSummary:
    """Predict every line of the text file ``input`` and write one record per line to ``output``.

    Records are in input order, one per line, blank lines included (their values are null,
    ``tokens`` 0), so output line i belongs to input line i. No sentence is split, truncated
    or dropped: one longer than every training bucket is run in a bucket of its own.

    For a language model (task ``"lm"``), with ``w1 .. wn`` the tokens of a line:

    * ``tokens``: the number of predicted tokens. The model reads ``w1 .. wn`` and predicts
      each next one, ``w2 .. wn`` and ``<eos>`` (with ``add_eos``, the default; without it
      ``w2 .. wn``), so a line of n tokens has n predicted tokens; ``w1`` itself is not
      predicted (there is no start-of-sentence token).
    * ``log_likelihood``: the sum over those tokens of ``ln p(token | the tokens before it)``
      (natural log; each probability floored at 1e-10 as in the perplexity metric).
    * ``perplexity``: ``exp(-log_likelihood / tokens)``. Over a file, the sum of
      ``log_likelihood`` is ``-ln(perplexity) * tokens`` of ``mxtrain score --data`` on it
      (when no line is longer than the largest training bucket, which score splits as fit's
      evaluation does).
    * ``next`` (``top_k > 0``): the ``top_k`` most likely tokens after the whole line, with
      their probabilities, most likely first: the model's output at the last input position
      (the one that reads ``wn``), i.e. ``p(. | w1 .. wn)``, the same distribution that scores
      ``<eos>`` above. ``<eos>`` is a candidate (the line ending there); ``<pad>`` is never
      listed.

    Formats (``fmt``): ``jsonl`` (one JSON object per line: ``line`` (1-based), ``tokens``,
    ``log_likelihood``, ``perplexity``, and ``next`` as ``[[token, prob], ...]``), ``csv``
    (header ``line,tokens,log_likelihood,perplexity[,next]``, empty cells for null, ``next`` as
    ``"tok:prob tok:prob"``; the char-level space token is written ``<space>``), ``npy`` (a
    structured array, one row per line: ``line`` int64, ``tokens`` int64, ``log_likelihood``
    and ``perplexity`` float64 (NaN for null), and with ``top_k``: ``next_id`` int64 [k] (-1
    for null), ``next_prob`` float32 [k], ``next_token`` str [k]; ``np.load`` reads it without
    ``allow_pickle``). The file is written under a temporary name and renamed when complete;
    an existing ``output`` is an error unless ``force``. A symbolic link is followed (its
    target is replaced); a character device or pipe (``/dev/stdout``) is written directly and
    never replaced (see :mod:`mxtrain.inference.output`).
    """
    started = time.perf_counter()
    if fmt not in FORMATS:
        raise ConfigError(
            f"Unknown output format {fmt!r}.", hint=f"Use one of {', '.join(FORMATS)}."
        )
    if top_k < 0:
        raise ConfigError(f"--top-k must be 0 or more, got {top_k}.")
    out_path = resolve_output(Path(output).expanduser().absolute())
    check_output(out_path, force)
    in_path = _input_file(input, "input file")
    opened = open_run(
        ref,
        epoch=epoch,
        overrides=overrides,
        batch_size=batch_size,
        data=in_path,
        role="predict",
    )
    info = opened.data_iter.data_info
    task = getattr(info, "task", None)
    predictor = _PREDICTORS.get(task) if task is not None else None
    if predictor is None:
        raise ConfigError(
            f"mxtrain predict cannot interpret this model's output: its data iterator "
            f"({opened.config.data.train.name}) reports task {task!r}.",
            hint=f"Supported tasks: {', '.join(_PREDICTORS)} (data_info.task). `mxtrain "
            "score` works for any model.",
        )
    predictions = predictor(opened, top_k)
    check_output(out_path, force)  # again: the file may have appeared meanwhile
    write_output(out_path, _writer(predictions, fmt))
    summary = _summarize(predictions, opened, in_path, out_path, fmt, started)
    log.info(
        "wrote %d records (%d empty lines) to %s in %.1fs",
        summary.lines,
        summary.empty,
        out_path,
        summary.seconds,
    )
    return summary


def _summarize(
    predictions: Predictions,
    opened: OpenedRun,
    in_path: Path,
    out_path: Path,
    fmt: str,
    started: float,
) -> PredictSummary:
    lines, empty, tokens, total = predictions.totals()
    return PredictSummary(
        opened.run.path,
        opened.epoch,
        in_path,
        out_path,
        fmt,
        lines,
        empty,
        tokens,
        total,
        time.perf_counter() - started,
        opened.checkpoint.describe() if opened.checkpoint is not None else None,
    )


__all__ = [
    "FORMATS",
    "LmPredictions",
    "OpenedRun",
    "PredictSummary",
    "Predictions",
    "ScoreReport",
    "checkpoint_epochs",
    "open_run",
    "parse_checkpoint_ref",
    "predict_run",
    "resolve_checkpoint",
    "score_checkpoint",
    "score_run",
]
