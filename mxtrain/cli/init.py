"""``mxtrain init``: write a commented starter config."""

from __future__ import annotations

from pathlib import Path

import click

from mxtrain.cli.options import handle_errors
from mxtrain.templates import DEFAULT_TEMPLATE, TEMPLATES, template_text, write_template


@click.command(
    "init",
    short_help="Write a commented starter config.",
    epilog="""\b
Examples:
  mxtrain init > my_lm.yaml && mxtrain fit my_lm.yaml
  mxtrain init --template tagger -o tagger.yaml
  mxtrain init --list""",
)
@click.option(
    "--template",
    "-t",
    type=click.Choice(list(TEMPLATES)),
    default=DEFAULT_TEMPLATE,
    show_default=True,
    help="Which kind of experiment to start from.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    default=None,
    help="Write to this file instead of standard output.",
)
@click.option("--force", is_flag=True, help="Replace an existing -o file.")
@click.option("--list", "list_templates", is_flag=True, help="List the templates and exit.")
@handle_errors
def init_command(template: str, output: Path | None, force: bool, list_templates: bool) -> None:
    """Print a commented starter config to edit, check and fit.

    Every key has a comment saying what it does; `mxtrain check FILE --explain` lists all
    the others with their defaults. An existing -o file is never replaced without --force.
    """
    if list_templates:
        width = max(len(name) for name in TEMPLATES)
        for name, summary in TEMPLATES.items():
            click.echo(f"{name:<{width}}  {summary}")
        return
    if output is None:
        click.echo(template_text(template), nl=False)
        return
    write_template(template, output, force=force)
    click.echo(f"wrote {output}; next: mxtrain check {output} && mxtrain fit {output}", err=True)
