"""``mxtrain fit``: train an experiment from a YAML file."""

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
@progress_option
@quiet_option
@json_option
@handle_errors
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
    from mxtrain.config import load_config
    from mxtrain.reporting import Reporter
    from mxtrain.run.folder import check_name_option
    from mxtrain.train import fit_experiment

    check_name_option(name)
    reporter = Reporter(progress_mode(progress, quiet), json_events=json_events)  # type: ignore[arg-type]
    with reporter.session("fit"):
        config = load_config(config_file, overrides)
        summary = fit_experiment(config, name=name, force=force, reporter=reporter)
    final = summary.final_eval
    values = " ".join(f"{k}={v:.2f}" for k, v in (final or {}).items())
    # With --json, stdout carries only events.
    click.echo(
        f"finished: {summary.run.path}" + (f" (eval {values})" if values else ""), err=json_events
    )
