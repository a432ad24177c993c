"""``mxtrain predict``: one record per input row, in input order, in jsonl, csv or npy.

What a record holds depends on the model's task, which the data iterator reports in
``data_info.task``: language models in :mod:`mxtrain.inference.lm`, taggers in
:mod:`mxtrain.inference.tags`, classifiers and regressors in :mod:`mxtrain.inference.rows`
(see :data:`PREDICTORS`). The output file is written by :mod:`mxtrain.inference.output`.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

import numpy as np

from mxtrain.data.base import TASK_LM, TASK_SEQ2SEQ, TASK_TAG
from mxtrain.errors import ConfigError
from mxtrain.inference.decode import TASK_GENERATE, DecodeFlags, DecodeOptions, decode_options
from mxtrain.inference.ensemble import open_members
from mxtrain.inference.generate import generate_text
from mxtrain.inference.int8 import Int8Options
from mxtrain.inference.lm import predict_lm
from mxtrain.inference.open import OpenedRun, input_file, open_run
from mxtrain.inference.output import check_output, resolve_output, write_output
from mxtrain.inference.raw import RAW_FORMATS, predict_raw
from mxtrain.inference.rows import predict_classes, predict_values
from mxtrain.inference.seq2seq import predict_seq2seq
from mxtrain.inference.tags import predict_tags
from mxtrain.run.plugin_files import uses_kept_plugins

log = logging.getLogger("mxtrain")

FORMATS = ("jsonl", "csv", "npy")


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
    #: ``--outputs raw``: each output's array shape (None: task records were written)
    raw_shapes: dict[str, tuple[int, ...]] | None = None

    @property
    def perplexity(self) -> float:
        """exp(-log_likelihood / tokens) over the whole input (nan without tokens)."""
        return math.exp(-self.log_likelihood / self.tokens) if self.tokens else math.nan


#: what ``predict`` writes for each task a data iterator may report (``data_info.task``)
PREDICTORS: dict[str, Callable[[OpenedRun, int], Predictions]] = {
    TASK_LM: predict_lm,
    TASK_TAG: predict_tags,
    "classify": predict_classes,
    "regress": predict_values,
}
#: tasks whose records are decoded outputs (the decoding flags apply): seq2seq models, and
#: language models with ``--task generate``
DECODERS: dict[str, Callable[[OpenedRun, DecodeOptions], Predictions]] = {
    TASK_SEQ2SEQ: predict_seq2seq,
    TASK_GENERATE: generate_text,
}


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
    outputs: str = "records",
    task: str | None = None,
    decoding: DecodeFlags | None = None,
    ensemble: Sequence[str | os.PathLike[str]] = (),
    rerank: Sequence[str | os.PathLike[str]] = (),
    int8: Int8Options | None = None,
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

    ``outputs="raw"`` writes the model's outputs uninterpreted instead, for any model (its
    iterator need not report a task), as ``npz`` or ``npy``: see :mod:`mxtrain.inference.raw`.

    Seq2seq models (task ``"seq2seq"``) decode each line (:mod:`mxtrain.inference.seq2seq`);
    ``task="generate"`` makes a language model continue each line
    (:mod:`mxtrain.inference.generate`); ``decoding`` holds the flags of both
    (:func:`mxtrain.inference.decode.decode_options`). ``ensemble``: further seq2seq runs
    decoding together with this one; ``rerank``: further seq2seq runs searching and scoring with it
    (:mod:`mxtrain.inference.ensemble`). ``int8``: the model runs its LSTM and FullyConnected
    layers in int8 (:mod:`mxtrain.inference.int8`).
    """
    started = time.perf_counter()
    _check_request(fmt, top_k, outputs)
    generate = _check_task(task, outputs, decoding)
    out_path = resolve_output(Path(output).expanduser().absolute())
    check_output(out_path, force)
    in_path = input_file(input, "input file")
    opened = open_run(
        ref,
        epoch=epoch,
        overrides=overrides,
        batch_size=batch_size,
        data=in_path,
        role="predict",
        # decoding binds its own graphs
        needs_module=lambda data_iter: (
            outputs == "raw" or (not generate and _task(data_iter) != TASK_SEQ2SEQ)
        ),
        int8=int8,
    )
    _check_ensemble(ensemble, outputs, generate, "--ensemble")
    _check_ensemble(rerank, outputs, generate, "--rerank")
    if outputs == "raw":
        return _predict_raw(opened, in_path, out_path, fmt, started)
    members = open_members(ensemble, opened, data=in_path, target=None, role="predict")
    rerankers = open_members(
        rerank, opened, data=in_path, target=None, role="predict", flag="--rerank"
    )
    predictions = _predictions(
        opened, members, rerankers, generate, top_k, decoding or DecodeFlags()
    )
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


def _predictions(
    opened: OpenedRun,
    members: list[OpenedRun],
    rerankers: list[OpenedRun],
    generate: bool,
    top_k: int,
    flags: DecodeFlags,
) -> Predictions:
    """The records of every input: decoded (seq2seq, with the ensemble ``members`` and the
    ``rerankers``; or generated), else the model's task's predictions."""
    task = _task(opened.data_iter)
    if members or rerankers:
        options = decode_options(flags, task, generate, top_k)
        return predict_seq2seq(opened, options, members, rerankers)
    if generate or task == TASK_SEQ2SEQ:
        return _decode(opened, task, generate, top_k, flags)
    decode_options(flags, task, generate, top_k)  # refuses decoding flags here
    return _predict(opened, task, top_k)


def _check_ensemble(runs: Sequence[Any], outputs: str, generate: bool, flag: str) -> None:
    if runs and (outputs == "raw" or generate):
        raise ConfigError(
            f"{flag} decodes with further seq2seq models; it does not apply to "
            f"{'--outputs raw' if outputs == 'raw' else '--task generate'}.",
            hint=f"Leave out {flag}.",
        )


def _task(data_iter: Any) -> str | None:
    return getattr(data_iter.data_info, "task", None)


def _check_task(task: str | None, outputs: str, decoding: DecodeFlags | None) -> bool:
    """Whether ``task`` asks for generation; a ConfigError for a task or flags that cannot be."""
    if task not in (None, TASK_GENERATE):
        raise ConfigError(f"Unknown --task {task!r}.", hint=f"Use --task {TASK_GENERATE}.")
    if outputs == "raw" and (task is not None or (decoding and decoding.given())):
        raise ConfigError(
            "--outputs raw writes the model's outputs as they are; --task and the decoding "
            "flags ask for decoded records.",
            hint="Leave them out, or use --outputs records.",
        )
    return task == TASK_GENERATE


def _decode(
    opened: OpenedRun, task: str | None, generate: bool, top_k: int, flags: DecodeFlags
) -> Predictions:
    if generate and task != TASK_LM:
        raise ConfigError(
            f"--task generate continues text with a language model; this run's model has "
            f"task {task!r}.",
            hint="Use a run of a language model (lstm_lm, gru_lm), or leave out --task.",
        )
    options = decode_options(flags, task, generate, top_k)
    return DECODERS[TASK_GENERATE if generate else TASK_SEQ2SEQ](opened, options)


def _predict(opened: OpenedRun, task: str | None, top_k: int) -> Predictions:
    predictor = PREDICTORS.get(task) if task is not None else None
    if predictor is None:
        raise ConfigError(
            f"mxtrain predict cannot interpret this model's output: its data iterator "
            f"({opened.config.data.train.name}) reports task {task!r}.",
            hint=f"Supported tasks: {', '.join([*PREDICTORS, TASK_SEQ2SEQ])} (data_info.task). "
            "`--outputs raw` writes any model's outputs as they are; `mxtrain score` works for "
            "any model.",
        )
    return predictor(opened, top_k)


def _check_request(fmt: str, top_k: int, outputs: str) -> None:
    if outputs not in ("records", "raw"):
        raise ConfigError(f"Unknown --outputs {outputs!r}.", hint="Use records or raw.")
    formats = RAW_FORMATS if outputs == "raw" else FORMATS
    if fmt not in formats:
        raise ConfigError(
            f"--format {fmt} cannot hold {'raw outputs' if outputs == 'raw' else 'records'}.",
            hint=f"With --outputs {outputs} use --format {' or '.join(formats)}.",
        )
    if top_k < 0:
        raise ConfigError(f"--top-k must be 0 or more, got {top_k}.")
    if top_k and outputs == "raw":
        raise ConfigError(
            "--top-k picks the most likely outcomes of a task's records; raw outputs are "
            "written whole.",
            hint="Leave out --top-k, or use --outputs records.",
        )


def _predict_raw(
    opened: OpenedRun, in_path: Path, out_path: Path, fmt: str, started: float
) -> PredictSummary:
    written = predict_raw(opened, fmt, lambda writer: write_output(out_path, writer))
    summary = PredictSummary(
        opened.run.path,
        opened.epoch,
        in_path,
        out_path,
        fmt,
        written.inputs,
        written.inputs - written.predicted,
        0,
        0.0,
        time.perf_counter() - started,
        opened.checkpoint.describe() if opened.checkpoint is not None else None,
        raw_shapes=written.shapes,
    )
    log.info(
        "wrote the raw outputs of %d inputs (%s) to %s in %.1fs",
        summary.lines,
        ", ".join(f"{n} {s}" for n, s in written.shapes.items()),
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
