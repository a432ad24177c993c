"""``mxtrain resume``: continue a run from its newest valid checkpoint."""

from __future__ import annotations

import click

from mxtrain.cli.fit import echo_finished, training_output_options, training_reporter
from mxtrain.cli.options import set_option


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
@training_output_options
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
    from mxtrain.fit.resume import resume_experiment  # deferred: the library loads MXNet

    reporter = training_reporter(progress, quiet, json_events)
    with reporter.session("resume"):
        summary = resume_experiment(
            run_dir, epoch=epoch, overrides=overrides, force=force, reporter=reporter
        )
    echo_finished(summary, json_events)
