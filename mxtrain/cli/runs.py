"""``mxtrain runs``: a table of the runs in a folder, newest first."""

from __future__ import annotations

import json
from pathlib import Path

import click

from mxtrain.cli.options import handle_errors
from mxtrain.formatting import format_duration, format_time, format_value


@click.command(
    "runs",
    short_help="List the runs in a folder, newest first.",
    epilog="""\b
Examples:
  mxtrain runs                    # the runs in ./runs
  mxtrain runs /scratch/runs --json | jq '.[] | select(.status == "failed")'""",
)
@click.argument("folder", metavar="[DIR]", default="runs", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of the table.")
@handle_errors
def runs_command(folder: str, as_json: bool) -> None:
    """List the runs in DIR (default: ./runs, experiment.runs_dir's default): name, status,
    epochs done, best metric, duration and start time, newest first. A folder that cannot
    be read is listed as `unreadable` with the reason."""
    # deferred: import cost (`mxtrain --help` imports every command)
    from mxtrain.run.history import find_runs

    runs = find_runs(Path(folder))
    if as_json:
        click.echo(json.dumps([run.to_json() for run in runs], indent=2))
        return
    if not runs:
        click.echo(f"no runs in {folder}")
        return
    rows = [("NAME", "STATUS", "EPOCHS", "BEST", "DURATION", "STARTED")]
    for run in runs:
        epochs = str(run.epochs_done)
        if run.num_epoch is not None:
            epochs += f"/{run.num_epoch}"
        best = "-"
        if run.best is not None:
            best = f"{run.best.split} {run.best.metric} {format_value(run.best.value)}"
            best += f" (epoch {run.best.epoch}"
            best += f", {run.best.checkpoint})" if run.best.checkpoint else ")"
        status = run.status
        if run.stop_reason and run.status == "finished":
            status += f" ({run.stop_reason})"
        rows.append(
            (
                run.name,
                status,
                epochs,
                best,
                format_duration(run.duration_s),
                format_time(run.started),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )
    for run in runs:
        if run.problem:
            click.echo(f"{run.name}: {run.problem}")
