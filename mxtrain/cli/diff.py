"""``mxtrain diff``: the config keys in which two runs (or config files) differ."""

from __future__ import annotations

import json

import click

from mxtrain.cli.options import handle_errors


@click.command(
    "diff",
    short_help="Show the config differences between two runs or config files.",
    epilog="""\b
Examples:
  mxtrain diff runs/ptb_lstm runs/ptb_lstm_lr05
  mxtrain diff runs/ptb_lstm configs/ptb_gru.yaml --json""",
)
@click.argument("run_a", metavar="RUN_A")
@click.argument("run_b", metavar="RUN_B")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of {key, a, b}.")
@handle_errors
def diff_command(run_a: str, run_b: str, as_json: bool) -> None:
    """Show the resolved config keys whose values differ between RUN_A and RUN_B, as
    dotted keys with both values. Each may be a run folder (its saved config.yaml), a run
    name under ./runs, or a config YAML file (defaults filled in, as `mxtrain fit` would)."""
    # deferred: import cost (`mxtrain --help` imports every command)
    from mxtrain.run.history import diff_runs

    label_a, label_b, changes = diff_runs(run_a, run_b)
    if as_json:
        out = [{"key": c.key, "a": c.saved, "b": c.requested} for c in changes]
        click.echo(json.dumps(out, indent=2, default=str))
        return
    if not changes:
        click.echo(f"no differences between the configs of {label_a} and {label_b}")
        return
    click.echo(f"a: {label_a}\nb: {label_b}")
    width = max(len(c.key) for c in changes)
    for change in changes:
        click.echo(f"{change.key:<{width}}  {change.saved!r} -> {change.requested!r}")
