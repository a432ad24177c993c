"""``mxtrain list``: the built-in models, iterators and metrics."""

from __future__ import annotations

import click

from mxtrain.cli.main import handle_errors


@click.command("list", epilog="Example:\n\n  mxtrain list models")
@click.argument("kind", type=click.Choice(["models", "iterators", "metrics", "all"]), default="all")
@handle_errors
def list_command(kind: str) -> None:
    """List registered built-ins (KIND: models, iterators, metrics or all)."""
    from mxtrain.registry import ITERATORS, METRICS, MODELS

    registries = {"models": MODELS, "iterators": ITERATORS, "metrics": METRICS}
    for name, registry in registries.items():
        if kind not in (name, "all"):
            continue
        click.echo(f"{name}:")
        for entry in registry.entries():
            click.echo(f"  {entry.name:<18} {entry.summary}")
