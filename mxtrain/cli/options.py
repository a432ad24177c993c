"""Options shared by several commands."""

from __future__ import annotations

import click

set_option = click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a config value by dotted key, typed by the schema; repeatable. "
    "Example: --set optimizer.learning_rate=0.5 --set context.ids=[0,1]",
)
