"""``mxtrain resume``: continue a run from its newest valid checkpoint."""

from __future__ import annotations

import click

from mxtrain.cli.options import (
    handle_errors,
    json_option,
    progress_mode,
    progress_option,
    quiet_option,
    set_option,
)


@click.command(
    "resume",
    epilog="""\b
Examples:
  mxtrain resume runs/ptb_lstm
  mxtrain resume runs/ptb_lstm --set fit.num_epoch=10      # train longer
  mxtrain resume runs/ptb_lstm --epoch 3 --force           # branch from epoch 3, dropping 4+""",
)
@click.argument("run_dir", metavar="RUN", type=click.Path(file_okay=False))
@click.option(
    "--epoch",
    type=click.IntRange(min=0),
    default=None,
    help="Continue from the checkpoint at the end of this epoch (default: the newest valid "
    "checkpoint, mid-epoch ones included).",
)
@set_option
@click.option(
    "--force",
    is_flag=True,
    help="Accept changes to keys that must match the saved config, and discard checkpoints "
    "newer than --epoch.",
)
@progress_option
@quiet_option
@json_option
@handle_errors
def resume_command(
    run_dir: str,
    epoch: int | None,
    overrides: tuple[str, ...],
    force: bool,
    progress: str,
    quiet: bool,
    json_events: bool,
) -> None:
    """Continue the run in RUN exactly where its newest valid checkpoint left off.

    Parameters, optimizer state, the learning-rate schedule, the position in the data and
    the random streams are restored, so the result matches an uninterrupted run. --set may
    change keys such as fit.num_epoch or optimizer.learning_rate; keys that shape the model
    or the data must match the saved config (the diff is printed).
    """
    from mxtrain.reporting import Reporter
    from mxtrain.train import resume_experiment

    reporter = Reporter(progress_mode(progress, quiet), json_events=json_events)  # type: ignore[arg-type]
    with reporter.session("resume"):
        summary = resume_experiment(
            run_dir, epoch=epoch, overrides=overrides, force=force, reporter=reporter
        )
    final = summary.final_eval
    values = " ".join(f"{k}={v:.2f}" for k, v in (final or {}).items())
    # With --json, stdout carries only events.
    click.echo(
        f"finished: {summary.run.path}" + (f" (eval {values})" if values else ""),
        err=json_events,
    )
