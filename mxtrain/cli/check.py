"""``mxtrain check``: validate a config and print it resolved, without training."""

from __future__ import annotations

import click

from mxtrain.cli.options import handle_errors, set_option


@click.command(
    "check",
    epilog="""\b
Examples:
  mxtrain check configs/ptb_lstm.yaml
  mxtrain check configs/ptb_lstm.yaml --set model.num_hidden=650 --explain""",
)
@click.argument("config_file", metavar="CONFIG", type=click.Path(dir_okay=False))
@set_option
@click.option(
    "--explain",
    is_flag=True,
    help="List every key with its value, default, meaning and where the value came from "
    "(file:line, an included file's line, --set, or default).",
)
@handle_errors
def check_command(config_file: str, overrides: tuple[str, ...], explain: bool) -> None:
    """Validate CONFIG and print the resolved configuration (MXNet is not imported, unless a
    plugin the config names imports it)."""
    # deferred: the config layer (YAML, schema) costs ~60 ms, which `mxtrain --help` should not pay
    from mxtrain.config import dump_config, explain_config, load_config, value_origins

    config = load_config(config_file, overrides)
    for note in config.notes:
        click.echo(f"note: {note}.", err=True)
    if not explain:
        click.echo(dump_config(config), nl=False)
        return
    rows = explain_config(config)
    origins = value_origins(config)
    width = max(len(key) for key, *_ in rows)
    for key, value, default, doc in rows:
        marker = "" if value == default else f"  (default: {default!r})"
        click.echo(f"{key:<{width}}  {value!r}{marker}  from {origins[key]}")
        if doc:
            click.echo(f"{'':<{width}}    {doc}")
