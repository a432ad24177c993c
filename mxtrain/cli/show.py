"""``mxtrain show``: one run's config, checkpoints and metric history."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import click

from mxtrain.cli.options import handle_errors
from mxtrain.formatting import format_duration, format_size, format_time, format_value

#: Config keys in the short summary (the whole config is behind --config).
SUMMARY_KEYS = (
    "experiment.seed",
    "data.train.iterator",
    "data.train.source",
    "data.train.batch_size",
    "data.eval.iterator",
    "data.eval.source",
    "context.devices",
    "context.ids",
    "optimizer.name",
    "optimizer.learning_rate",
    "optimizer.lr_scheduler.type",
    "fit.num_epoch",
    "fit.metrics",
    "checkpoint.best_metric",
)


@click.command(
    "show",
    short_help="Show a run's config, checkpoints and metric history.",
    epilog="""\b
Examples:
  mxtrain show runs/ptb_lstm
  mxtrain show ptb_lstm --config          # a run name under ./runs; the whole config
  mxtrain show runs/ptb_lstm --json | jq '.epochs[-1].eval'""",
)
@click.argument("run", metavar="RUN")
@click.option("--config", "full_config", is_flag=True, help="Print the whole saved config.")
@click.option("--json", "as_json", is_flag=True, help="Print everything as one JSON object.")
@handle_errors
def show_command(run: str, full_config: bool, as_json: bool) -> None:
    """Show RUN (a run folder, or a run name under ./runs): status, a config summary,
    its checkpoints (epoch, batch, size; marked: latest, the newest valid one that score and
    predict load by default; best, what RUN:best loads; and why any is unusable), the
    train and eval metrics of every epoch and a sparkline of the main eval metric."""
    # deferred: import cost (`mxtrain --help` imports every command)
    from mxtrain.run.history import load_run, resolve_run

    details = load_run(resolve_run(run))
    if as_json:
        click.echo(json.dumps(_as_json(details), indent=2, default=str))
        return
    _print_header(details)
    _print_config(details, full_config)
    _print_checkpoints(details)
    _print_epochs(details)


def _as_json(details: Any) -> dict[str, Any]:
    return {
        "run": details.summary.to_json(),
        "run_json": details.status,
        "config": details.config,
        "config_problem": details.config_problem,
        "checkpoints": [c.__dict__ for c in details.checkpoints],
        "epochs": [row.__dict__ for row in details.epochs],
        "main_metric": details.main_metric,
        "main_split": details.main_split,
    }


def _table(rows: Sequence[Sequence[str]], indent: str = "  ", numbers_right: bool = True) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [
            cell.rjust(w) if numbers_right and _numeric(cell) else cell.ljust(w)
            for cell, w in zip(row, widths, strict=True)
        ]
        click.echo(indent + "  ".join(cells).rstrip())


def _numeric(cell: str) -> bool:
    try:
        float(cell.replace(",", ""))
    except ValueError:
        return False
    return True


def _print_header(details: Any) -> None:
    summary = details.summary
    click.echo(f"run      {summary.path}")
    status = summary.status
    if summary.stop_reason:
        status += f" ({summary.stop_reason})"
    if summary.problem:
        status += f": {summary.problem}"
    click.echo(f"status   {status}")
    started = format_time(summary.started)
    click.echo(f"started  {started}, ran {format_duration(summary.duration_s)}")
    resumes = details.status.get("resumes")
    if isinstance(resumes, list) and resumes:
        froms = ", ".join(str(r.get("from")) for r in resumes if isinstance(r, dict))
        click.echo(f"resumed  {len(resumes)} time(s), from {froms}")
    versions = [f"{k} {details.status[k]}" for k in ("mxtrain", "mxnet") if k in details.status]
    if versions:
        click.echo(f"versions {', '.join(versions)}")


def _print_config(details: Any, full: bool) -> None:
    # deferred: import cost (`mxtrain --help` imports every command)
    from mxtrain.config.resume_policy import value_at

    click.echo("")
    if details.config is None:
        click.echo(f"config: unreadable ({details.config_problem})")
        return
    if full:
        # deferred: import cost (`mxtrain --help` imports every command)
        from mxtrain.run.layout import CONFIG_FILE

        click.echo("config:")
        text = (details.summary.path / CONFIG_FILE).read_text(encoding="utf-8")
        click.echo("".join(f"  {line}" for line in text.splitlines(keepends=True)), nl=False)
        return
    model = details.config.get("model")
    if isinstance(model, dict):
        options = " ".join(f"{k}={_short(v)}" for k, v in model.items() if k != "name")
        click.echo(f"config   model {model.get('name')}: {options}")
    rows = []
    for key in SUMMARY_KEYS:
        value = value_at(details.config, key)
        if value is not None:
            rows.append((key, _short(value)))
    _table(rows, indent="         ", numbers_right=False)
    click.echo("         (the whole config: --config)")


def _short(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_short(v) for v in value) + "]"
    return str(value)


def _print_checkpoints(details: Any) -> None:
    click.echo("")
    if not details.checkpoints:
        click.echo("checkpoints: none")
        return
    click.echo("checkpoints:")
    rows = [("TAG", "EPOCH", "BATCH", "SIZE", "")]
    for ckpt in details.checkpoints:
        rows.append(
            (
                ckpt.tag,
                str(ckpt.epoch),
                str(ckpt.batch),
                format_size(ckpt.size_bytes),
                _marks(ckpt),
            )
        )
    _table(rows)


def _marks(ckpt: Any) -> str:
    marks = [name for name, on in (("latest", ckpt.latest), ("best", ckpt.best)) if on]
    if ckpt.problem:
        marks.append(f"not usable: {ckpt.problem}")
    return ", ".join(marks)


def _print_epochs(details: Any) -> None:
    # deferred: import cost (`mxtrain --help` imports every command)
    from mxtrain.run.history import sparkline

    click.echo("")
    _print_latest_interval(details)
    epochs = details.epochs
    if not epochs:
        click.echo("metrics: no epoch has finished yet")
        return
    train_names = list(dict.fromkeys(k for row in epochs for k in row.train))
    eval_names = list(dict.fromkeys(k for row in epochs for k in (row.eval or {})))
    header = ["EPOCH", *(f"train {n}" for n in train_names), *(f"eval {n}" for n in eval_names)]
    rows = [(*header, "LR", "SECONDS", "")]
    for row in epochs:
        mark = "best" if row.best else ""
        if row.partial:
            mark = (mark + " partial").strip()
        rows.append(
            (
                str(row.epoch),
                *(format_value(row.train.get(n)) for n in train_names),
                *(format_value((row.eval or {}).get(n)) for n in eval_names),
                format_value(row.lr),
                "-" if row.seconds is None else f"{row.seconds:.1f}",
                mark,
            )
        )
    click.echo("metrics per epoch:")
    _table(rows)
    metric, split = details.main_metric, details.main_split
    if metric is None:
        return
    values = [((row.eval if split == "eval" else row.train) or {}).get(metric) for row in epochs]
    present = [v for v in values if v is not None]
    if not present:
        return
    line = f"{split} {metric}  {sparkline(values)}  {format_value(present[0])} -> "
    line += format_value(present[-1])
    best = details.summary.best
    if best is not None:
        line += f"  (best {format_value(best.value)} at epoch {best.epoch}"
        line += f", checkpoint {best.checkpoint})" if best.checkpoint else ")"
    click.echo("")
    click.echo(line)


def _print_latest_interval(details: Any) -> None:
    """For a run still training (or stopped mid-epoch): where its log got to last."""
    last_epoch = details.epochs[-1].epoch if details.epochs else 0
    latest = None
    for record in details.records:
        if record.get("event") == "interval" and isinstance(record.get("epoch"), int):
            latest = record
    if latest is None or latest["epoch"] <= last_epoch:
        return
    train = latest.get("train") if isinstance(latest.get("train"), dict) else {}
    values = " ".join(f"{k}={format_value(v)}" for k, v in train.items())
    click.echo(f"latest   epoch {latest['epoch']} batch {latest.get('batch')}: train {values}")
