"""Train and eval curves of one or more runs, drawn to a PNG file with matplotlib.

matplotlib is an optional extra (``pip install 'mxtrain[plot]'``): it is imported only
here, only when a plot is asked for, and with the Agg backend so no display is needed.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mxtrain.errors import ConfigError, MxtrainError
from mxtrain.run.atomic import atomic_write_bytes
from mxtrain.run.history import Curve, epoch_rows, logged_metrics, main_metric, metric_curves
from mxtrain.user_files import make_folder, require_usable_path

DPI = 100


class MissingExtraError(MxtrainError):
    """An optional dependency is not installed (exit code 2, like a usage error)."""


@dataclass(frozen=True)
class PlottedRun:
    """What one run contributed to a plot."""

    name: str
    curves: list[Curve]


def import_pyplot(command: str = "mxtrain plot") -> Any:
    """matplotlib.pyplot on the Agg backend, or a MissingExtraError saying how to install it."""
    try:
        import matplotlib  # optional dependency: matplotlib (the [plot] extra)
    except ImportError:
        raise MissingExtraError(
            f"`{command}` needs matplotlib, which is not installed in this environment.",
            hint="Install it with `pip install 'mxtrain[plot]'` (or `pip install matplotlib`); "
            "`mxtrain show RUN` prints the main metric as a terminal sparkline without it.",
        ) from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt  # optional dependency: after choosing the Agg backend

    return plt


def plot_runs(
    runs: Sequence[tuple[str, list[dict[str, Any]], dict[str, Any] | None]],
    output: Path,
    *,
    metric: str | None = None,
    width: int = 800,
    height: int = 500,
    log_scale: bool = False,
    force: bool = False,
) -> tuple[str, list[PlottedRun]]:
    """Draw ``metric`` (train solid, eval dashed; one colour per run) to the PNG ``output``.

    ``runs`` holds (label, metrics.jsonl records, config as plain data or None) per run.
    Without ``metric`` the first run's main metric is used. Returns the metric and what
    was drawn. An existing ``output`` is kept unless ``force``; the file is written
    atomically, so a failure never leaves half a PNG.
    """
    if width < 50 or height < 50 or width > 10000 or height > 10000:
        raise ConfigError(
            f"--width/--height must be between 50 and 10000 pixels, got {width}x{height}."
        )
    check_output(output, force)
    if metric is None:
        for _label, records, config in runs:
            metric, _split = main_metric(config, epoch_rows(records))
            if metric is not None:
                break
    plotted = []
    if metric is not None:
        plotted = [PlottedRun(label, metric_curves(records, metric)) for label, records, _ in runs]
        plotted = [p for p in plotted if p.curves]
    if not plotted:
        available = sorted({name for _, records, _ in runs for name in logged_metrics(records)})
        raise ConfigError(
            f"no run has logged values of metric {metric!r} yet."
            if metric
            else "none of these runs has logged any metric yet.",
            hint=f"Metrics logged by these runs: {', '.join(available)}; pick one with --metric."
            if available
            else "Plot again once training has logged a few intervals or an epoch.",
        )
    assert metric is not None
    plt = import_pyplot()
    figure = plt.figure(figsize=(width / DPI, height / DPI), dpi=DPI)
    try:
        axes = figure.add_subplot(1, 1, 1)
        colours = plt.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
        for index, run in enumerate(plotted):
            colour = colours[index % len(colours)]
            for curve in run.curves:
                style = "-" if curve.split == "train" else "--"
                marker = "o" if len(curve.x) <= 30 else None
                axes.plot(
                    curve.x,
                    curve.y,
                    linestyle=style,
                    marker=marker,
                    markersize=3,
                    color=colour,
                    label=f"{run.name} {curve.split}",
                )
        axes.set_xlabel("epoch")
        axes.set_ylabel(metric)
        if log_scale:
            from matplotlib.ticker import LogFormatter  # optional dependency: matplotlib

            axes.set_yscale("log")
            # plain numbers (16.5), not powers of ten (1.65 x 10^1), on a narrow range
            axes.yaxis.set_major_formatter(LogFormatter(labelOnlyBase=False))
            axes.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False))
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize="small")
        write_png(figure, output)
    finally:
        plt.close(figure)
    return metric, plotted


def check_output(output: Path, force: bool) -> None:
    """``output`` can take a new PNG: a usable path ending in .png, not there unless
    ``force``."""
    require_usable_path(output, "plot file", error=ConfigError, hint="Choose another -o path.")
    if output.exists() and not force:
        raise ConfigError(
            f"{output} already exists; mxtrain does not overwrite it.",
            hint="Pass --force to replace it, or choose another -o path.",
        )
    if output.suffix.lower() != ".png":
        raise ConfigError(f"-o {output}: plots are written as PNG; use a name ending in .png.")


def write_png(figure: Any, output: Path) -> None:
    """``figure`` to the PNG ``output``, atomically (a failure never leaves half a file)."""
    figure.tight_layout()
    buffer = io.BytesIO()
    # no bbox_inches="tight": it would change the pixel size the user asked for
    figure.savefig(buffer, format="png", dpi=DPI)
    make_folder(
        output.parent,
        "folder of the plot",
        error=ConfigError,
        hint="Choose an -o path on a file system you can write to.",
    )
    atomic_write_bytes(output, buffer.getvalue())


def plot_lr_find(
    points: Sequence[Any], suggested: float | None, output: Path, *, title: str
) -> None:
    """The range test's loss (raw, faint; smoothed, solid) against the learning rate on a
    log axis, the suggested rate marked, to the PNG ``output`` (checked by check_output)."""
    plt = import_pyplot("mxtrain lr-find")
    figure = plt.figure(figsize=(800 / DPI, 500 / DPI), dpi=DPI)
    try:
        axes = figure.add_subplot(1, 1, 1)
        rates = [p.lr for p in points]
        axes.plot(rates, [p.loss for p in points], color="C0", alpha=0.3, label="batch loss")
        axes.plot(rates, [p.smoothed for p in points], color="C0", label="smoothed")
        if suggested is not None:
            axes.axvline(suggested, color="C3", linestyle="--", label=f"suggested {suggested:.3g}")
        axes.set_xscale("log")
        axes.set_xlabel("learning rate")
        axes.set_ylabel("training loss (cross-entropy)")
        axes.set_title(title, fontsize="small")
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize="small")
        write_png(figure, output)
    finally:
        plt.close(figure)
