"""``mxtrain export``: a run's inference graph and weights, loadable without mxtrain."""

from __future__ import annotations

import json
from pathlib import Path

import click

from mxtrain.cli.options import BATCH_SIZE, SEQUENCE_LENGTH, handle_errors
from mxtrain.errors import ConfigError


@click.command(
    "export",
    epilog="""\b
Examples:
  mxtrain export runs/ptb_lstm:best -o exported/            # the default (largest) bucket
  mxtrain export runs/ptb_lstm -o exported/ --bucket 20 --bucket 35
  mxtrain export runs/conll_tagger:best -o tagger/ --all-buckets
  mxtrain export runs/ptb_lstm:best -o onnx/ --format onnx --bucket 35 --batch-size 20
  mxtrain export runs/g2p:best -o g2p/ --bucket 20 --max-steps 40   # seq2seq: source length""",
)
@click.argument("checkpoint", metavar="RUN[:EPOCH|:best|:latest|:TAG]")
@click.option(
    "-o",
    "--output",
    "out_dir",
    type=click.Path(file_okay=False),
    required=True,
    help="Folder to write into (created; an existing non-empty one needs --force).",
)
@click.option(
    "--bucket",
    "buckets",
    type=SEQUENCE_LENGTH,
    multiple=True,
    help="A sequence length (bucket key) to unroll the graph for (seq2seq: a source "
    "length); repeatable.",
)
@click.option("--all-buckets", is_flag=True, help="Every bucket the run trained with.")
@click.option(
    "--batch-size",
    type=BATCH_SIZE,
    default=1,
    show_default=True,
    help="The batch axis written in export.json's shapes (the graph itself takes any).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["mxnet", "onnx"]),
    default="mxnet",
    show_default=True,
    help="mxnet: symbol + params files; onnx: one .onnx file per bucket (needs the onnx "
    "package: pip install -e '.[onnx]' in the mxtrain checkout; static shapes, batch axis "
    "--batch-size).",
)
@click.option(
    "--max-steps",
    type=SEQUENCE_LENGTH,
    default=None,
    help="seq2seq: decoder positions the decoder-step graph is built for (a Transformer's "
    "key/value cache size). Default: the longest output predict allows, by default, a "
    "source of the bucket's length (its --max-output-ratio and --max-output-add).",
)
@click.option("--force", is_flag=True, help="Write into a non-empty folder.")
@click.option("--json", "as_json", is_flag=True, help="Print only export.json's content.")
@handle_errors
def export_command(
    checkpoint: str,
    out_dir: str,
    buckets: tuple[int, ...],
    all_buckets: bool,
    batch_size: int,
    fmt: str,
    max_steps: int | None,
    force: bool,
    as_json: bool,
) -> None:
    """Write the inference graph of a checkpoint of RUN, without its training loss head,
    per bucket (sequence length): MXNet symbol + params files (loadable by
    mx.mod.Module.load and gluon.SymbolBlock.imports) or ONNX files; export.json lists the
    graphs with their input and output names and shapes, and the run's vocabularies are
    copied. A sequence-to-sequence run writes, per source length, its encoder graph and its
    decoder-step graph instead (encoder-sourceS, decoder_step-sourceS); export.json says
    what to feed them step by step."""
    # deferred: import cost (`mxtrain --help` imports every command)
    from mxtrain.inference.export import export_run

    if buckets and all_buckets:
        raise ConfigError("Give --bucket or --all-buckets, not both.")
    folder = Path(out_dir).expanduser()
    graphs = export_run(
        checkpoint,
        folder,
        buckets=list(buckets) or None,
        all_buckets=all_buckets,
        batch_size=batch_size,
        force=force,
        fmt=fmt,
        max_steps=max_steps,
    )
    manifest = (folder / "export.json").read_text(encoding="utf-8")
    if as_json:
        click.echo(json.dumps(json.loads(manifest)))
        return
    for graph in graphs:
        inputs = ", ".join(f"{n} {tuple(s)}" for n, s in graph.inputs.items())
        outputs = ", ".join(f"{n} {tuple(s)}" for n, s in graph.outputs.items())
        left_out = (
            f"; left out (training only): {', '.join(graph.dropped)}" if graph.dropped else ""
        )
        target = folder / (f"{graph.prefix}.onnx" if fmt == "onnx" else graph.prefix)
        click.echo(f"{target}: inputs {inputs} -> outputs {outputs}{left_out}")
