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

progress_option = click.option(
    "--progress",
    type=click.Choice(["auto", "rich", "plain", "quiet"]),
    default="auto",
    show_default=True,
    help="rich: progress bars and an epoch table; plain: one key=value line per log "
    "interval (the default when the output is not a terminal); quiet: warnings and errors "
    "only.",
)
quiet_option = click.option(
    "--quiet", "-q", is_flag=True, help="Same as --progress quiet: warnings and errors only."
)
json_option = click.option(
    "--json",
    "json_events",
    is_flag=True,
    help="Write machine-readable events to stdout, one JSON object per line (start, "
    "interval, eval, checkpoint, epoch_end, early_stop, error, end; see the README); the "
    "human output goes to stderr.",
)


def progress_mode(progress: str, quiet: bool) -> str:
    """The --progress value, with --quiet winning."""
    return "quiet" if quiet else progress
