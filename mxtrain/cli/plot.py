"""``mxtrain plot``: train and eval curves of one or more runs, to a PNG file."""

from __future__ import annotations

from pathlib import Path

import click

from mxtrain.cli.options import handle_errors


@click.command(
    "plot",
    short_help="Draw train/eval curves of runs to a PNG file.",
    epilog="""\b
Examples:
  mxtrain plot runs/ptb_lstm -o curves.png
  mxtrain plot runs/ptb_lstm runs/ptb_gru --metric perplexity --log -o compare.png
  mxtrain plot runs/conll_tagger --metric accuracy -o acc.png --width 1200 --height 600

Needs matplotlib: pip install 'mxtrain[plot]'.""",
)
@click.argument("runs", metavar="RUN [RUN...]", nargs=-1, required=True)
@click.option(
    "--metric",
    default=None,
    help="Metric to draw (default: the first run's checkpoint.best_metric or first fit.metrics).",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("curves.png"),
    show_default=True,
    help="PNG file to write.",
)
@click.option("--width", type=int, default=800, show_default=True, help="Image width in pixels.")
@click.option("--height", type=int, default=500, show_default=True, help="Image height in pixels.")
@click.option("--log", "log_scale", is_flag=True, help="Logarithmic y axis (e.g. perplexity).")
@click.option("--force", is_flag=True, help="Replace an existing output file.")
@handle_errors
def plot_command(
    runs: tuple[str, ...],
    metric: str | None,
    output: Path,
    width: int,
    height: int,
    log_scale: bool,
    force: bool,
) -> None:
    """Draw the train (solid) and eval (dashed) curves of a metric for each RUN, overlaid,
    to a PNG file. RUN is a run folder or a run name under ./runs; runs still training
    are drawn up to their last logged interval."""
    # deferred: import cost (`mxtrain --help` imports every command)
    from mxtrain.plotting import plot_runs
    from mxtrain.run.history import load_run, resolve_run

    loaded = []
    for run in runs:
        details = load_run(resolve_run(run))
        loaded.append((details.summary.name, details.records, details.config))
    chosen, plotted = plot_runs(
        loaded,
        output,
        metric=metric,
        width=width,
        height=height,
        log_scale=log_scale,
        force=force,
    )
    missing = [name for name, _records, _config in loaded if name not in {p.name for p in plotted}]
    for name in missing:
        click.echo(f"note: {name} has no {chosen} values yet; not drawn", err=True)
    click.echo(f"wrote {output} ({chosen}, {len(plotted)} run(s), {width}x{height} px)")
