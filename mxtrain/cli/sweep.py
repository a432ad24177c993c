"""``mxtrain sweep``: one run of a config per point of a grid, in one sweep folder."""

from __future__ import annotations

from pathlib import Path

import click

from mxtrain.cli.options import handle_errors, set_option


@click.command(
    "sweep",
    short_help="Run a config once per point of a grid of --set values.",
    epilog="""\b
Examples:
  mxtrain sweep configs/ptb_lstm.yaml --grid optimizer.learning_rate=0.004,0.008 \\
      --grid model.dropout=0.2,0.4 --parallel 2
  mxtrain sweep tagger.yaml --grid model.num_hidden=64,128,256 --grid model.dropout=0,0.2,0.4 \\
      --random 4 --seed 1 --set fit.num_epoch=3
  mxtrain runs runs/ptb_lstm-sweep

Run the same command again to continue a stopped sweep.""",
)
@click.argument("config_file", metavar="CONFIG", type=click.Path(dir_okay=False))
@set_option
@click.option(
    "--grid",
    "grids",
    multiple=True,
    required=True,
    metavar="KEY=V1,V2,...",
    help="A config key and its values; several --grid give every combination.",
)
@click.option(
    "--random",
    "sample",
    type=click.IntRange(min=1),
    default=None,
    help="Run this many points drawn from the grid (without replacement) instead of all.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of --random's draw.")
@click.option(
    "--parallel",
    type=click.IntRange(min=1, max=64),
    default=1,
    show_default=True,
    help="Points run at once; the CPU cores are split between them (OpenMP threads).",
)
@click.option("--name", default=None, help="Sweep folder name (default: EXPERIMENT-sweep).")
@click.option(
    "--runs-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the sweep folder goes (default: the config's experiment.runs_dir).",
)
@handle_errors
def sweep_command(
    config_file: str,
    overrides: tuple[str, ...],
    grids: tuple[str, ...],
    sample: int | None,
    seed: int,
    parallel: int,
    name: str | None,
    runs_dir: Path | None,
) -> None:
    """Run CONFIG once per point of the grid: each point is an ordinary run (`mxtrain fit`
    with the point's values as --set) in the sweep folder, which also holds sweep.json and a
    summary table (summary.md, summary.csv: the values, status, best metric, epoch and
    minutes of each point). A failing point is recorded and the sweep goes on; SIGTERM or
    Ctrl-C stops the running points at a checkpoint (exit 75), and the same command
    continues the sweep: finished points kept, interrupted ones resumed exactly."""
    # deferred: import cost (`mxtrain --help` imports every command)
    from mxtrain.errors import SweepPointsFailed
    from mxtrain.fit.sweep import prepare_sweep, run_sweep
    from mxtrain.sweep_plan import parse_axis

    axes = [parse_axis(text) for text in grids]
    sweep = prepare_sweep(
        config_file, overrides, axes, sample=sample, seed=seed, name=name, runs_dir=runs_dir
    )
    click.echo(f"sweep {sweep.folder}: {len(sweep.points)} points, {parallel} at a time")
    run_sweep(sweep, parallel=parallel)
    failed = [p for p in sweep.points if p.status == "failed"]
    click.echo(f"wrote {sweep.folder / 'summary.md'}")
    if failed:
        raise SweepPointsFailed(
            f"{len(failed)} of {len(sweep.points)} points failed: "
            + ", ".join(f"{p.name} (exit code {p.exit_code})" for p in failed)
            + ".",
            hint=f"Their logs are in {sweep.folder / 'logs'}; the others' results are in "
            "summary.md.",
        )
