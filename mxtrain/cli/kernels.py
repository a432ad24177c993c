"""``mxtrain kernels``: the kernel and OpenMP choices this machine keeps, and measuring again."""

from __future__ import annotations

import json
from pathlib import Path

import click

from mxtrain.cli.options import handle_errors, set_option
from mxtrain.errors import ConfigError


@click.command(
    "kernels",
    short_help="Show or measure again the kernel choices kept for this machine.",
    epilog="""\b
Examples:
  mxtrain kernels                              # what this machine keeps
  mxtrain kernels configs/ptb_lstm.yaml        # what fit would choose for this config
  mxtrain kernels --measure configs/ptb_lstm.yaml   # measure its choices again, now
  mxtrain kernels --measure                    # forget them all: the next fit measures""",
)
@click.argument("config_file", metavar="[CONFIG]", required=False, type=click.Path())
@click.option(
    "--measure",
    is_flag=True,
    help="With CONFIG: measure its choices again now and keep the new ones. Without: forget "
    "every choice kept for this machine, so that the next fit of each shape measures.",
)
@set_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead.")
@handle_errors
def kernels_command(
    config_file: str | None, measure: bool, overrides: tuple[str, ...], as_json: bool
) -> None:
    """Show the kernel and OpenMP choices kept for this machine, or measure them again.

    `mxtrain fit` measures each `auto` choice (model.loss, model.cell,
    context.large_buffers, context.omp_threads, context.omp_wait_policy) once per machine
    and shape, and keeps it: the candidates differ in float rounding, so every later run on
    this machine uses the same ones, busy or quiet, and the same config and seed train the
    same parameters. Choices are measured again only here, or when the CPU, MXNet or mxtrain
    changes. Runs after a new measurement may round differently from runs before it.
    """
    # deferred: the library loads only for a command that runs (--help stays fast)
    from mxtrain.engine.kernels import CACHE_FILE, cache_dir

    cache = cache_dir() / CACHE_FILE
    if config_file is None:
        if overrides:
            raise ConfigError("--set needs a CONFIG.", hint="Name the config file to measure.")
        if measure:
            _forget(cache)
            return
        _show_kept(cache, as_json)
        return
    from mxtrain.config import load_config  # deferred, as above
    from mxtrain.fit.setup import measure_kernel_choices  # deferred, as above

    config = load_config(config_file, overrides)
    choices = measure_kernel_choices(config, remeasure=measure)
    rows = [
        {
            "key": c.key,
            "value": c.value,
            "source": c.source,
            "problem": c.problem,
            "figures_ms": c.figures_ms,
            "why": c.why,
        }
        for c in choices
    ]
    if as_json:
        click.echo(json.dumps({"config": config_file, "cache": str(cache), "choices": rows}))
        return
    click.echo(f"kernel cache: {cache}")
    for choice in choices:
        click.echo(f"  {choice.describe()}")
    if not choices:
        click.echo("  nothing to choose: every setting is explicit, exported or not measured")


def _forget(cache: Path) -> None:
    from mxtrain.kernel_choices import forget_choices  # deferred, as above: the library's cost

    try:
        dropped = forget_choices()
    except OSError as exc:
        raise ConfigError(
            f"the kernel cache {cache} cannot be written ({exc}).",
            hint="Set MXTRAIN_CACHE_DIR to a writable folder.",
        ) from exc
    click.echo(
        f"forgot {dropped} choice(s) kept for this machine in {cache}: the next `mxtrain fit` "
        "of each shape measures again (and may then round differently from earlier runs)."
    )


def _show_kept(cache: Path, as_json: bool) -> None:
    from mxtrain.kernel_choices import kept_choices  # deferred, as above: the library's cost

    kept = kept_choices()
    if as_json:
        click.echo(json.dumps({"cache": str(cache), "machines": kept}))
        return
    click.echo(f"kernel cache: {cache}")
    if not kept:
        click.echo("  nothing kept for this machine yet: `mxtrain fit` measures on first use")
        return
    for machine, problems in kept.items():
        click.echo(f"machine: {machine}")
        for problem, entry in problems.items():
            line = f"  {problem}: {entry.get('value')} (measured {entry.get('measured', '?')}"
            if float(entry.get("load") or 0.0) > 0:
                line += f", {entry['load']} CPUs busy with other processes"
            if entry.get("why"):
                line += f"; {entry['why']}"
            click.echo(line + ")")
            figures = entry.get("figures_ms") or {}
            if figures:
                click.echo("    " + ", ".join(f"{k} {v} ms" for k, v in figures.items()))
