"""``mxtrain predict``: one output record per input line, from a run folder alone."""

from __future__ import annotations

import click

from mxtrain.cli.options import EPOCH, batch_size_override, handle_errors, set_option


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

\b
Language models: each record has line (1-based), tokens, log_likelihood (natural log, summed
over the predicted tokens, <eos> included), perplexity and, with --top-k K, "next": the K most
likely tokens after the whole line. Blank lines get a record with null values.""",
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
    "line (language models), labels (classifiers, taggers); not for regressors.",
)
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
