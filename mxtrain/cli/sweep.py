"""``mxtrain sweep``: one run of a config per point of a grid, in one sweep folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
    metavar="KEY=V1,V2,...",
    help="A config key and its values; several --grid give every combination.",
)
@click.option(
    "--search",
    "searches",
    multiple=True,
    metavar="KEY=SPEC",
    help="Search instead of a grid (Optuna's TPE sampler and median pruner): SPEC is "
    "float:LOW:HIGH[:log], int:LOW:HIGH[:log] or choice:V1,V2,...",
)
@click.option("--trials", type=click.IntRange(min=1), default=None, help="Points of a --search.")
@click.option(
    "--metric",
    default=None,
    help="What a --search optimizes (default: checkpoint.best_metric, else the first eval metric).",
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
    help=(
        "Points run at once; the usable CPU cores are split between them (OpenMP threads) "
        "unless the config or OMP_NUM_THREADS fixes the count."
    ),
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
    searches: tuple[str, ...],
    trials: int | None,
    metric: str | None,
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

    if bool(grids) == bool(searches):
        raise click.UsageError("give --grid KEY=V1,V2 ... or --search KEY=SPEC ..., one of them.")
    if searches:
        driver, sweep = _search(config_file, overrides, searches, trials, seed, metric, name,
                                runs_dir, sample)  # fmt: skip
        click.echo(f"sweep {sweep.folder}: {sweep.trials} trials of {sweep.metric}, "
                   f"{parallel} at a time")  # fmt: skip
    else:
        from mxtrain.sweep_plan import parse_axis

        if trials is not None or metric is not None:
            raise click.UsageError("--trials and --metric go with --search, not --grid.")
        axes = [parse_axis(text) for text in grids]
        sweep = prepare_sweep(
            config_file, overrides, axes, sample=sample, seed=seed, name=name, runs_dir=runs_dir
        )
        driver = None
        click.echo(f"sweep {sweep.folder}: {len(sweep.points)} points, {parallel} at a time")
    run_sweep(sweep, parallel=parallel, driver=driver)
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


def _search(
    config_file: str,
    overrides: tuple[str, ...],
    searches: tuple[str, ...],
    trials: int | None,
    seed: int,
    metric: str | None,
    name: str | None,
    runs_dir: Path | None,
    sample: int | None,
) -> tuple[Any, Any]:
    """The search driver and its sweep, from the --search arguments."""
    from mxtrain.fit.sweep_search import SearchDriver, prepare_search
    from mxtrain.sweep_plan import parse_search

    if trials is None or sample is not None:
        raise click.UsageError("--search needs --trials N (and takes no --random).")
    params = [parse_search(text) for text in searches]
    sweep, lower = prepare_search(
        config_file, overrides, params, trials=trials, seed=seed, metric=metric, name=name,
        runs_dir=runs_dir,
    )  # fmt: skip
    return SearchDriver(sweep, lower), sweep
