"""``mxtrain predict``: one output record per input line, from a run folder alone."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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


def _unset(flag: str, kind: Any, help: str) -> Callable[[Any], Any]:
    """An option whose default None stands for "not given": the library knows the default,
    and refuses a given flag that does not apply."""
    return click.option(flag, type=kind, default=None, help=help)


@click.command(
    "predict",
    epilog="""\b
Examples:
  mxtrain predict --checkpoint runs/ptb_lstm --input sentences.txt --output scores.jsonl
  mxtrain predict --checkpoint runs/ptb_lstm:3 --input sentences.txt --output next.csv \\
      --format csv --top-k 5
  mxtrain predict --checkpoint runs/ptb_lstm --input big.txt --output big.npy --format npy \\
      --batch-size 256 --set context.devices=gpu --force
  mxtrain predict --checkpoint runs/my_plugin_model --input rows.npy --output out.npz \\
      --outputs raw
  mxtrain predict --checkpoint runs/g2p --input words.txt --output prons.jsonl \\
      --beam-size 5 --nbest 3
  mxtrain predict --checkpoint runs/ptb_lstm --task generate --input prompts.txt \\
      --output more.jsonl --sample --top-p 0.9 --seed 7

\b
Language models: each record has line (1-based), tokens, log_likelihood (natural log, summed
over the predicted tokens, <eos> included), perplexity and, with --top-k K, "next": the K most
likely tokens after the whole line. Blank lines get a record with null values.

\b
Seq2seq models: each line is decoded by beam search (encoder once per batch, decoder step
by step on its states): {"line", "output", "score", "log_prob"} (+ "nbest" with --nbest > 1);
score is log_prob divided by the GNMT length penalty. --task generate: {"line", "prompt",
"output", "tokens", "log_likelihood"}.""",
)
@click.option(
    "--checkpoint",
    metavar="RUN[:EPOCH|:best|:latest|:TAG]",
    required=True,
    help="Run folder written by `mxtrain fit`, optionally with the checkpoint: an epoch "
    "end, best, latest or a tag such as e0002-b000020 (default: the newest valid one).",
)
@click.option(
    "--input",
    "input_file",
    metavar="FILE",
    required=True,
    help="Input in the training data's format, labels optional: text with one sentence per "
    "line (language models), CoNLL/CoNLL-U (taggers), .npy/.npz/.csv rows or LibSVM text "
    "(classifiers, regressors), a RecordIO .rec file (images).",
)
@click.option(
    "--output",
    "output_file",
    metavar="FILE",
    required=True,
    help="Where to write the records (never overwritten without --force; /dev/stdout "
    "or a pipe is written directly).",
)
@click.option(
    "--outputs",
    type=click.Choice(["records", "raw"]),
    default="records",
    show_default=True,
    help="records: what the model's task means (log-likelihood, labels, ...); raw: every "
    "output of the model as it is, per input, for any model (npz or npy).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["jsonl", "csv", "npy", "npz"]),
    default=None,
    help="jsonl (the default for records): one JSON object per record; csv: a header and one "
    "row per record (taggers: per token); npy: a NumPy array (records: a structured one); npz "
    "(the default for raw): one array per output.",
)
@click.option(
    "--epoch", type=EPOCH, default=None, help="The end of this epoch (instead of RUN:EPOCH)."
)
@batch_size_override(
    "--input",
    "lines or sentences (language models, taggers), rows (array, CSV, LibSVM) or images per "
    "batch; the records do not change.",
)
@click.option(
    "--top-k",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Also list the K most likely outcomes with probabilities: next tokens after each "
    "line (language models), labels (classifiers, taggers); not for regressors or seq2seq. "
    "With --task generate: sample each token among the K most likely.",
)
@click.option(
    "--task",
    type=click.Choice(["generate"]),
    default=None,
    help="generate: a language model continues each line of --input (greedy by default; "
    "stateful LMs carry their state through the prompt, others recompute the prefix each "
    "step). Default: the model's own task.",
)
@_unset(
    "--beam-size",
    click.IntRange(min=1),
    "Hypotheses kept per input by beam search (seq2seq, generate); 1 is greedy. "
    "Default: 5 for seq2seq, 1 for generate.",
)
@_unset(
    "--nbest",
    click.IntRange(min=1),
    "Write the N best outputs per input with their scores (N <= --beam-size; default 1).",
)
@length_penalty_option("the outputs")
@_unset(
    "--max-output-ratio",
    click.FloatRange(min=0),
    "seq2seq: at most ceil(RATIO * source length) + --max-output-add output tokens "
    "(<eos> included). Default: 2.0.",
)
@_unset(
    "--max-output-add",
    click.IntRange(min=0),
    "seq2seq: see --max-output-ratio. Default: 10.",
)
@_unset(
    "--max-tokens",
    click.IntRange(min=1),
    "generate: at most N tokens after each prompt (<eos> included; it ends one "
    "earlier). Default: 20.",
)
@click.option(
    "--sample",
    is_flag=True,
    help="generate: draw each token from the model's distribution instead of searching "
    "(implied by --temperature, --top-p and --top-k).",
)
@_unset(
    "--temperature",
    click.FloatRange(min=0, min_open=True),
    "generate: sample from p ** (1 / T), renormalized (default 1).",
)
@_unset(
    "--top-p",
    click.FloatRange(min=0, max=1, min_open=True),
    "generate: sample among the most likely tokens holding probability P (nucleus).",
)
@_unset(
    "--seed",
    int,
    "generate with sampling: the same seed gives the same text on the same machine (default 0).",
)
@further_runs_option(
    "--ensemble",
    "seq2seq: decode together with this run too (repeatable): the mean of the models' "
    "probabilities at each step. The runs must share their vocabularies.",
)
@further_runs_option(
    "--rerank",
    "seq2seq: this run searches too (repeatable; e.g. a right-to-left model, data "
    "reverse_target: true); every candidate either beam kept is scored by every model and "
    "they are ranked by the mean of the log-probabilities. Needs --beam-size > 1.",
)
@int8_options
@set_option
@click.option("--force", is_flag=True, help="Replace an existing output file.")
@handle_errors
def predict_command(
    checkpoint: str,
    input_file: str,
    output_file: str,
    outputs: str,
    fmt: str | None,
    epoch: int | None,
    batch_size: int | None,
    top_k: int,
    task: str | None,
    beam_size: int | None,
    nbest: int | None,
    length_penalty: float | None,
    max_output_ratio: float | None,
    max_output_add: int | None,
    max_tokens: int | None,
    sample: bool,
    temperature: float | None,
    top_p: float | None,
    seed: int | None,
    ensemble: tuple[str, ...],
    rerank: tuple[str, ...],
    int8: bool,
    calibration_batches: int | None,
    calibration_data: str | None,
    overrides: tuple[str, ...],
    force: bool,
) -> None:
    """Predict every input (line, sentence, row or image) of --input and write --output.

    Records come in input order, one per input; nothing is split, truncated or dropped
    (sequences longer than every training bucket run in a bucket of their own). Language
    models give log-likelihood and perplexity per line, classifiers a label and class
    probabilities, regressors a value, taggers a label per token. The output is written
    under a temporary name and renamed when complete; a symbolic link's target is replaced
    that way; a device or pipe (--output /dev/stdout) is written directly, without --force,
    and never replaced.
    """
    # deferred: import cost (`mxtrain --help` imports every command)
    from rich.console import Console

    # deferred: the inference modules cost ~0.2 s, which `mxtrain --help` should not pay
    from mxtrain.inference.decode import DecodeFlags
    from mxtrain.inference.output import is_stream
    from mxtrain.inference.predict import predict_run
    from mxtrain.reporting import Reporter

    reporter = Reporter("plain", console=Console(stderr=True))
    try:
        summary = predict_run(
            checkpoint,
            input_file,
            output_file,
            epoch=epoch,
            fmt=fmt or ("npz" if outputs == "raw" else "jsonl"),
            batch_size=batch_size,
            top_k=top_k,
            overrides=overrides,
            force=force,
            outputs=outputs,
            task=task,
            decoding=DecodeFlags(
                beam_size=beam_size,
                nbest=nbest,
                length_penalty=length_penalty,
                max_output_ratio=max_output_ratio,
                max_output_add=max_output_add,
                max_tokens=max_tokens,
                sample=sample,
                temperature=temperature,
                top_p=top_p,
                seed=seed,
            ),
            ensemble=ensemble,
            rerank=rerank,
            int8=int8_request(int8, calibration_batches, calibration_data),
        )
    finally:
        reporter.close()
    # With --output /dev/stdout (or another stream) the records own stdout: summary to stderr.
    to_stderr = is_stream(summary.output)
    if summary.raw_shapes is not None:
        arrays = ", ".join(f"{name} {shape}" for name, shape in summary.raw_shapes.items())
        click.echo(
            f"wrote the raw outputs of {summary.lines:,} inputs ({summary.empty:,} without a "
            f"prediction) to {summary.output}: {arrays} (checkpoint {summary.checkpoint})",
            err=to_stderr,
        )
    elif summary.tokens:  # sequence models: token counts and the overall perplexity
        click.echo(
            f"wrote {summary.lines:,} records ({summary.empty:,} blank lines) to "
            f"{summary.output}: {summary.tokens:,} tokens, perplexity "
            f"{summary.perplexity:.2f} (checkpoint {summary.checkpoint})",
            err=to_stderr,
        )
    else:
        click.echo(
            f"wrote {summary.lines:,} records to {summary.output} "
            f"(checkpoint {summary.checkpoint})",
            err=to_stderr,
        )
