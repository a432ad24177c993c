"""``mxtrain lr-find``: the learning-rate range test of a config, to a PNG file."""

from __future__ import annotations

import json
from pathlib import Path

import click

from mxtrain.cli.options import handle_errors, set_option


@click.command(
    "lr-find",
    short_help="Find a learning rate: a loss-against-rate sweep, to a PNG file.",
    epilog="""\b
Examples:
  mxtrain lr-find configs/ptb_lstm.yaml -o lr.png
  mxtrain lr-find configs/ptb_lstm.yaml --updates 200 --start-lr 1e-5 --end-lr 1 --json

Needs matplotlib: pip install 'mxtrain[plot]'. Writes no run folder.""",
)
@click.argument("config_file", metavar="CONFIG", type=click.Path(dir_okay=False))
@set_option
@click.option(
    "--updates",
    type=click.IntRange(5, 100_000),
    default=100,
    show_default=True,
    help="Updates of the sweep (the data's epochs repeat as needed).",
)
@click.option(
    "--start-lr",
    type=click.FloatRange(min=1e-12, max=1e6),
    default=1e-7,
    show_default=True,
    help="Learning rate of the first update.",
)
@click.option(
    "--end-lr",
    type=click.FloatRange(min=1e-12, max=1e6),
    default=10.0,
    show_default=True,
    help="Learning rate of the last update (the sweep stops earlier once the loss diverges).",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("lr_find.png"),
    show_default=True,
    help="PNG file to write.",
)
@click.option("--force", is_flag=True, help="Replace an existing output file.")
@click.option("--json", "as_json", is_flag=True, help="Also print the result as one JSON line.")
@handle_errors
def lr_find_command(
    config_file: str,
    overrides: tuple[str, ...],
    updates: int,
    start_lr: float,
    end_lr: float,
    output: Path,
    force: bool,
    as_json: bool,
) -> None:
    """Train CONFIG's model from its initial state for a few updates at learning rates rising
    exponentially from --start-lr to --end-lr, and draw the training loss against the rate.
    The suggested rate is where the loss falls fastest, before its minimum; the optimizer,
    batch size and model are the config's, its schedule and evaluations left out."""
    if not start_lr < end_lr:
        raise click.BadParameter(
            f"--start-lr ({start_lr:g}) must be below --end-lr ({end_lr:g}).",
            param_hint="'--start-lr'",
        )
    # deferred: import cost (`mxtrain --help` imports every command)
    from mxtrain.fit.lr_find import find_learning_rate
    from mxtrain.plotting import check_output, import_pyplot, plot_lr_find

    check_output(output, force)
    import_pyplot("mxtrain lr-find")  # a missing extra is said before any training
    result = find_learning_rate(config_file, overrides, start=start_lr, end=end_lr, updates=updates)
    plot_lr_find(result.points, result.suggested, output, title=f"lr-find {config_file}")
    ran = len(result.points)
    stopped = " (stopped: the loss diverged)" if result.stopped else ""
    click.echo(f"{ran} updates from lr {start_lr:g} to {result.points[-1].lr:.3g}{stopped}")
    click.echo(f"lowest smoothed loss at lr {result.min_loss_lr:.3g}")
    if result.suggested is None:
        click.echo("no suggestion: the loss did not fall over enough updates (try --updates "
                   "or a lower --start-lr)")  # fmt: skip
    else:
        click.echo(f"suggested learning rate: {result.suggested:.3g} (steepest descent)")
    click.echo(f"wrote {output}")
    if as_json:
        click.echo(json.dumps(result.to_json()))
