"""checkpoint.period, keep_last and best_metric in a real fit."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from mxtrain.cli.main import cli
from mxtrain.run.folder import read_metrics


def fit(config: Path, *overrides: str) -> Path:
    args = ["fit", str(config), "--set", "fit.num_epoch=4"]
    for item in overrides:
        args += ["--set", item]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return config.parent / "runs" / "tiny"


def tags(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("e"))


def test_keep_last_prunes_old_checkpoints_and_params(tiny_config: Path) -> None:
    run = fit(tiny_config, "checkpoint.keep_last=2")
    assert tags(run) == ["e0003-b000000", "e0004-b000000"]
    assert sorted(p.name for p in run.glob("model-*.params")) == [
        "model-0003.params",
        "model-0004.params",
    ]


def test_period_saves_every_n_epochs_and_the_last(tiny_config: Path) -> None:
    run = fit(tiny_config, "checkpoint.period=3")
    assert tags(run) == ["e0003-b000000", "e0004-b000000"]


def test_best_checkpoint_is_marked_and_survives_pruning(tiny_config: Path) -> None:
    # A learning rate that first helps, then (decayed to nearly nothing) keeps the best
    # epoch early enough that keep_last=1 would otherwise delete it.
    run = fit(
        tiny_config,
        "checkpoint.keep_last=1",
        "checkpoint.best_metric=perplexity",
        "optimizer.learning_rate=2.0",
    )
    epochs = [r for r in read_metrics(run / "metrics.jsonl") if r["event"] == "epoch"]
    values = [r["eval"]["perplexity"] for r in epochs]
    best_epoch = values.index(min(values)) + 1
    best_tag = f"e{best_epoch:04d}-b000000"
    assert (run / "checkpoints" / "best").read_text().strip() == best_tag
    assert best_tag in tags(run) and "e0004-b000000" in tags(run)
    assert len(tags(run)) == (1 if best_epoch == 4 else 2)
    newest = json.loads((run / "checkpoints" / "e0004-b000000" / "state.json").read_text())
    best = newest["state"]["best"]
    assert best["epoch"] == best_epoch and best["tag"] == best_tag
    assert best["value"] == min(values)
    assert newest["bucket_keys"] == [5, 9, 13] and newest["versions"]["mxnet"] == "1.9.1"
    assert epochs[best_epoch - 1].get("best") is True
