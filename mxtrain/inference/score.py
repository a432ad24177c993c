"""``mxtrain score``: the config's metrics of a checkpoint over its eval data or a file.

Device metrics (perplexity, accuracy, ...) run the eval batches through the model under
teacher forcing. Decoding metrics (bleu, chrf, wer, per: those of ``fit.eval_metrics`` and
those asked for) decode each distinct source by beam search and compare the outputs with every
target its lines have (:mod:`mxtrain.decoding.evaluation` states the rules); on ``data.eval``
they decode the sources and beam that fit decoded, so the values equal the ones fit logged.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mxtrain.build import build_metric
from mxtrain.config import Config
from mxtrain.config.schema import SEQ2SEQ_HINT, decoding_model_problem
from mxtrain.decoding.evaluation import DecodingEvaluation, FixedModel
from mxtrain.decoding.search import DEFAULT_LENGTH_PENALTY, DecodeOptions
from mxtrain.errors import ConfigError
from mxtrain.inference.decode import graphs_fit
from mxtrain.inference.ensemble import describe, open_members, reverses_target
from mxtrain.inference.int8 import Int8Options
from mxtrain.inference.open import OpenedRun, open_run
from mxtrain.inference.output import finite_or_none
from mxtrain.inference.seq2seq import check_rerank
from mxtrain.run.plugin_files import uses_kept_plugins
from mxtrain.text_metrics import DECODING_METRICS

log = logging.getLogger("mxtrain")


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
    max_batches: int | None = None  # only the first N batches were scored (None: all)
    # how the decoding metrics decoded: {"beam_size", "sources"}, and "ensemble" (the runs
    # and checkpoints decoding together) with --ensemble; None: no decoding metric
    decoding: dict[str, Any] | None = None
    int8: dict[str, Any] | None = None  # with --int8: what ran in int8, the calibration

    def to_json(self) -> dict[str, Any]:
        """``{"run", "epoch", "batch", "checkpoint", "data", "max_batches", "metrics",
        "decoding"[, "int8"]}``; non-finite values become null."""
        int8 = {"int8": self.int8} if self.int8 is not None else {}
        return {
            "run": str(self.run),
            "epoch": self.epoch,
            "batch": self.batch,
            "checkpoint": self.checkpoint,
            "data": self.data,
            "max_batches": self.max_batches,
            "metrics": {k: finite_or_none(v) for k, v in self.metrics.items()},
            "decoding": self.decoding,
            **int8,
        }


@uses_kept_plugins
def score_checkpoint(
    ref: str | os.PathLike[str],
    *,
    epoch: int | None = None,
    data: str | os.PathLike[str] | None = None,
    batch_size: int | None = None,
    overrides: Sequence[str] = (),
    max_batches: int | None = None,
    target: str | os.PathLike[str] | None = None,
    decoding_metrics: Sequence[str] = (),
    beam_size: int | None = None,
    ensemble: Sequence[str | os.PathLike[str]] = (),
    length_penalty: float | None = None,
    rerank: Sequence[str | os.PathLike[str]] = (),
    int8: Int8Options | None = None,
) -> ScoreReport:
    """Score a run's checkpoint with its evaluation metrics (``fit.eval_metrics``, else
    ``fit.metrics``; see :func:`score_run`), the device metrics over the first
    ``max_batches`` batches only when given (a quick estimate). ``target``: the target side
    of a parallel ``data`` file.

    ``decoding_metrics``: metrics of decoded output (bleu, chrf, wer, per) to compute besides
    the config's; ``beam_size``: their beam (default ``fit.decode_eval.beam_size``, 1 without
    it: as fit decoded). On ``data.eval`` they decode what fit decoded (the first
    ``fit.decode_eval.max_sentences`` distinct sources), on a ``data`` file every one.
    ``ensemble``: further seq2seq runs that decode together with this one
    (:mod:`mxtrain.inference.ensemble`); ``rerank``: further seq2seq runs that search too,
    every candidate scored by every model; the device metrics stay this checkpoint's own.
    ``length_penalty``: the beam's GNMT alpha (default 1.0, as ``predict``). ``int8``: the
    device metrics of the model with its LSTM and FullyConnected layers in int8
    (:mod:`mxtrain.inference.int8`).
    """
    started = time.perf_counter()
    unknown = [name for name in decoding_metrics if name not in DECODING_METRICS]
    if unknown:
        raise ConfigError(
            f"--metrics {','.join(unknown)}: not a metric of decoded output.",
            hint=f"Name some of {', '.join(DECODING_METRICS)} (device metrics come from the "
            "run's fit.eval_metrics).",
        )
    opened = open_run(
        ref,
        epoch=epoch,
        overrides=overrides,
        batch_size=batch_size,
        data=data,
        role="eval",
        target=target,
        int8=int8,
    )
    # deferred: MXNet reads its thread settings when it loads (devices.configure_threads first)
    from mxtrain.engine.loop import MetricSet, score

    config = opened.config
    decoding_names = checked_decoding_metrics(config, decoding_metrics, beam_size)
    if length_penalty is not None and not decoding_names:
        raise ConfigError(
            f"--length-penalty {length_penalty} ranks the hypotheses of the decoding metrics, "
            "but the run's fit.eval_metrics lists none and --metrics names none.",
            hint="Add --metrics bleu (or chrf, wer, per) for a seq2seq run, or leave out "
            "--length-penalty.",
        )
    for flag, runs in (("--ensemble", ensemble), ("--rerank", rerank)):
        if runs and not decoding_names:
            raise ConfigError(
                f"{flag} decodes with further models, but no metric of decoded output is "
                "asked for (the run's fit.eval_metrics lists none).",
                hint="Add --metrics wer (or bleu, chrf, per).",
            )
    members = open_members(ensemble, opened, data=data, target=target, role="eval")
    rerankers = open_members(rerank, opened, data=data, target=target, role="eval", flag="--rerank")
    data_info = opened.data_iter.data_info
    names = config.fit.device_evaluation_metrics  # decoding metrics are scored on decoded text
    metrics = MetricSet([build_metric(n, data_info, config.base_dir) for n in names])
    values: dict[str, float] = {}
    if metrics.metrics:  # eval_metrics may list only decoding metrics
        values = score(
            opened.module,
            opened.data_iter,
            metrics,
            max_batches=max_batches,
            prefetch=config.fit.prefetch,
        )
    decoding: dict[str, Any] | None = None
    if decoding_names:
        beam = beam_size if beam_size is not None else config.fit.decoding.beam_size
        alpha = DEFAULT_LENGTH_PENALTY if length_penalty is None else length_penalty
        check_rerank(DecodeOptions(beam_size=beam), len(rerankers))
        decoded, decoding = decoded_scores(
            opened,
            decoding_names,
            beam,
            alpha,
            members,
            on_eval_data=data is None,
            rerankers=rerankers,
        )
        values.update(decoded)
    chosen = opened.checkpoint
    report = ScoreReport(
        opened.run.path,
        opened.epoch,
        opened.data_source,
        values,
        seconds=time.perf_counter() - started,
        checkpoint=chosen.describe() if chosen is not None else None,
        batch=chosen.batch if chosen is not None else 0,
        max_batches=max_batches,
        decoding=decoding,
        int8=opened.int8.as_dict() if opened.int8 is not None else None,
    )
    part = f" (first {max_batches} batches at most)" if max_batches is not None else ""
    log.info("scored %s%s in %.1fs", opened.data_source, part, report.seconds)
    return report


def decoded_scores(
    opened: OpenedRun,
    names: Sequence[str],
    beam: int,
    alpha: float,
    members: Sequence[OpenedRun],
    *,
    on_eval_data: bool,
    rerankers: Sequence[OpenedRun] = (),
) -> tuple[dict[str, float], dict[str, Any]]:
    """The decoding metrics ``names`` of ``opened`` (with the ensemble ``members`` and the
    ``rerankers``) and how they were decoded: ``{"beam_size", "length_penalty", "sources"[,
    "ensemble"][, "rerank"]}``."""
    evaluation = decoding_evaluation(
        opened,
        names,
        beam,
        on_eval_data=on_eval_data,
        ensemble=members,
        length_penalty=alpha,
        rerankers=rerankers,
    )
    with graphs_fit(opened.params_file):
        values = evaluation.scores(*opened.params())
    decoding: dict[str, Any] = {
        "beam_size": beam,
        "length_penalty": alpha,
        "sources": len(evaluation.sources),
    }
    if members:
        decoding["ensemble"] = [
            {"run": str(m.run.path), "checkpoint": describe(m)} for m in (opened, *members)
        ]
    if rerankers:
        decoding["rerank"] = [
            {
                "run": str(m.run.path),
                "checkpoint": describe(m),
                "reverse_target": reverses_target(m),
            }
            for m in rerankers
        ]
    return values, decoding


def checked_decoding_metrics(
    config: Config, asked: Sequence[str], beam_size: int | None
) -> list[str]:
    """The decoding metrics to compute: the config's evaluation ones, then those ``asked``
    (``--metrics``); a ConfigError when the model does not decode, or for ``--beam-size``
    without any."""
    for name in asked:
        problem = decoding_model_problem(name, config.model.name)
        if problem is not None:
            raise ConfigError(f"--metrics {name}: {problem}", hint=SEQ2SEQ_HINT)
    names = list(dict.fromkeys((*config.fit.decoding_metrics, *asked)))
    if beam_size is not None and not names:
        raise ConfigError(
            f"--beam-size {beam_size} sets the beam of the decoding metrics, but the run's "
            "fit.eval_metrics lists none and --metrics names none.",
            hint="Add --metrics bleu (or chrf, wer, per) for a seq2seq run, or leave out "
            "--beam-size.",
        )
    return names


def decoding_evaluation(
    opened: OpenedRun,
    names: Sequence[str],
    beam_size: int,
    *,
    on_eval_data: bool,
    ensemble: Sequence[OpenedRun] = (),
    length_penalty: float = DEFAULT_LENGTH_PENALTY,
    rerankers: Sequence[OpenedRun] = (),
) -> DecodingEvaluation:
    """The decoding metrics ``names`` of ``opened``'s eval iterator at ``beam_size``: on
    data.eval (``on_eval_data``) of its first ``fit.decode_eval.max_sentences`` distinct
    sources, as fit decoded them, else of every one; decoded together with the ``ensemble``
    runs when given, the candidates reranked with the ``rerankers``."""
    config = opened.config

    def fixed_models(runs: Sequence[OpenedRun]) -> list[FixedModel]:
        return [
            FixedModel(
                m.sym_gen(),
                *m.params(),
                name=m.config.model.name,
                reverse_target=reverses_target(m),
            )
            for m in runs
        ]

    return DecodingEvaluation(
        opened.sym_gen(),
        opened.data_iter,
        names,
        context=opened.contexts[0],
        beam_size=beam_size,
        length_penalty=length_penalty,
        max_sentences=config.fit.decoding.max_sentences if on_eval_data else None,
        model_name=config.model.name,
        ensemble=fixed_models(ensemble),
        rerankers=fixed_models(rerankers),
    )


def score_run(
    ref: str | os.PathLike[str],
    *,
    epoch: int | None = None,
    data: str | os.PathLike[str] | None = None,
    batch_size: int | None = None,
    overrides: Sequence[str] = (),
) -> dict[str, float]:
    """The config's evaluation metrics of a checkpoint over ``data.eval`` (or the file
    ``data``).

    Over ``data.eval`` this is the value fit logged for that epoch in metrics.jsonl (all of the
    data is scored: if fit ran with ``fit.eval_max_batches``, fit scored only part of it). The
    batch size and devices do not change the value beyond float rounding.
    """
    return score_checkpoint(
        ref, epoch=epoch, data=data, batch_size=batch_size, overrides=overrides
    ).metrics
