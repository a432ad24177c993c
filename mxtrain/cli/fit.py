"""``mxtrain fit``: train an experiment from a YAML file."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from mxtrain.cli.options import (
    handle_errors,
    json_option,
    progress_mode,
    progress_option,
    quiet_option,
    set_option,
)

if TYPE_CHECKING:  # annotations only: the library loads after the arguments are parsed
    from mxtrain.fit.supervise import FitSummary
    from mxtrain.reporting import Reporter


def training_output_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--progress, --quiet and --json, and the error handling, of ``fit`` and ``resume``."""
    return progress_option(quiet_option(json_option(handle_errors(command))))


def training_reporter(progress: str, quiet: bool, json_events: bool) -> Reporter:
    """The reporter a training command's output options ask for."""
    from mxtrain.reporting import Reporter  # deferred: keeps --help fast

    return Reporter(progress_mode(progress, quiet), json_events=json_events)  # type: ignore[arg-type]


def echo_finished(summary: FitSummary, json_events: bool) -> None:
    """The last line of a training command: the run folder and the final evaluation."""
    final = summary.final_eval
    values = " ".join(f"{k}={v:.2f}" for k, v in (final or {}).items())
    # With --json, stdout carries only events.
    click.echo(
        f"finished: {summary.run.path}" + (f" (eval {values})" if values else ""), err=json_events
    )


@click.command(
    "fit",
    epilog="""\b
Examples:
  mxtrain fit configs/ptb_lstm.yaml
  mxtrain fit configs/ptb_lstm.yaml --set fit.num_epoch=2 --name ptb_short
  mxtrain fit configs/ptb_lstm.yaml --progress plain > train.out
  mxtrain fit configs/ptb_lstm.yaml --json 2>train.err | jq -c 'select(.event=="epoch_end")'""",
)
@click.argument("config_file", metavar="CONFIG", type=click.Path(dir_okay=False))
@set_option
@click.option(
    "--name",
    default=None,
    help="Run name (folder under experiment.runs_dir); default: experiment.name.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Replace an existing run folder of the same name (it is deleted only after the "
    "new run finishes; if the new run fails, the old one is kept).",
)
@training_output_options
def fit_command(
    config_file: str,
    overrides: tuple[str, ...],
    name: str | None,
    force: bool,
    progress: str,
    quiet: bool,
    json_events: bool,
) -> None:
    """Train the experiment in CONFIG into runs/<experiment>/.

    The run folder receives the resolved config, the vocabulary, the symbol, one
    <prefix>-NNNN.params per saved epoch, metrics.jsonl and train.log.
    """
    # deferred: the library (and MXNet behind it) loads only for a command that runs
    from mxtrain.config import load_config
    from mxtrain.fit.new_run import fit_experiment
    from mxtrain.run.folder import check_name_option

    check_name_option(name)
    reporter = training_reporter(progress, quiet, json_events)
    with reporter.session("fit"):
        config = load_config(config_file, overrides)
        summary = fit_experiment(config, name=name, force=force, reporter=reporter)
    echo_finished(summary, json_events)
