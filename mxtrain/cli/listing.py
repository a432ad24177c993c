"""``mxtrain list``: the built-in models, iterators, metrics, optimizers and initializers."""

from __future__ import annotations

import click

from mxtrain.cli.options import handle_errors
from mxtrain.registry import ITERATORS, METRICS, MODEL_EXPORTS, MODELS
from mxtrain.text_metrics import DECODING_METRICS

KINDS = ["models", "iterators", "metrics", "optimizers", "initializers", "all"]


@click.command(
    "list",
    epilog="\b\nExamples:\n  mxtrain list models\n  mxtrain list optimizers",
)
@click.argument("kind", type=click.Choice(KINDS), default="all")
@handle_errors
def list_command(kind: str) -> None:
    """List what a config can name (KIND: models, iterators, metrics, optimizers,
    initializers or all). MXNet is not imported."""
    # deferred: import cost (`mxtrain --help` imports every command)
    from mxtrain.config.schema import INITIALIZERS, OPTIMIZERS, SUPPORTED_OPTIMIZERS

    def exports(name: str) -> str:
        return f" [export: {MODEL_EXPORTS[name]}]" if name in MODEL_EXPORTS else ""

    sections: dict[str, list[tuple[str, str]]] = {
        "models": [(e.name, e.summary + exports(e.name)) for e in MODELS.entries()],
        "iterators": [(e.name, e.summary) for e in ITERATORS.entries()],
        "metrics": [(e.name, e.summary) for e in METRICS.entries()]
        + [(m.name, f"{m.summary} [seq2seq, decoded output]") for m in DECODING_METRICS.values()],
        "optimizers": [(name, OPTIMIZERS[name].summary) for name in SUPPORTED_OPTIMIZERS],
        "initializers": [(name, spec.summary) for name, spec in sorted(INITIALIZERS.items())],
    }
    for name, rows in sections.items():
        if kind not in (name, "all"):
            continue
        click.echo(f"{name}:")
        width = max([18, *(len(entry) for entry, _ in rows)])  # names longer than 18 stay aligned
        for entry, summary in rows:
            click.echo(f"  {entry:<{width}} {summary}")
