"""``mxtrain fit``: train an experiment from a YAML file."""

from __future__ import annotations

import click

from mxtrain.cli.main import handle_errors
from mxtrain.cli.options import set_option


@click.command(
    "fit",
    epilog="""\b
Examples:
  mxtrain fit configs/ptb_lstm.yaml
  mxtrain fit configs/ptb_lstm.yaml --set fit.num_epoch=2 --name ptb_short
  mxtrain fit configs/ptb_lstm.yaml --progress plain > train.out""",
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
@click.option(
    "--progress",
    type=click.Choice(["auto", "rich", "plain", "quiet"]),
    default="auto",
    show_default=True,
    help="rich: progress bars; plain: one log line per interval (the default when stdout "
    "is not a terminal); quiet: warnings and errors only.",
)
@handle_errors
def fit_command(
    config_file: str, overrides: tuple[str, ...], name: str | None, force: bool, progress: str
) -> None:
    """Train the experiment in CONFIG into runs/<experiment>/.

    The run folder receives the resolved config, the vocabulary, the symbol, one
    <prefix>-NNNN.params per saved epoch, metrics.jsonl and train.log.
    """
    from mxtrain.config import load_config
    from mxtrain.reporting import Reporter
    from mxtrain.train import fit_experiment

    config = load_config(config_file, overrides)
    summary = fit_experiment(config, name=name, force=force, reporter=Reporter(progress))  # type: ignore[arg-type]
    final = summary.final_eval
    if final:
        values = " ".join(f"{k}={v:.2f}" for k, v in final.items())
        click.echo(f"finished: {summary.run.path} (eval {values})")
    else:
        click.echo(f"finished: {summary.run.path}")
