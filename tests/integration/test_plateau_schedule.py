"""lr_scheduler type plateau end to end: decays after patience evaluations without
improvement, holds during the cooldown, and a run stopped mid-epoch resumes bit-identically
(the decay count and the tracker travel in every checkpoint)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import params

from mxtrain.cli.main import cli
from mxtrain.run.folder import read_metrics

# mode max on perplexity: every evaluation after the first is "no improvement", so the
# decays land on known evaluations (2 and 4, the cooldown skipping 3 and 5)
PLATEAU = [
    "optimizer.lr_scheduler={type: plateau, metric: perplexity, mode: max, factor: 0.5, "
    "patience: 0, cooldown: 1}",
    "fit.num_epoch=6",
]


def fit(config: Path, name: str, *sets: str) -> Path:
    args = ["fit", str(config), "--name", name, "--progress", "quiet"]
    for value in (*PLATEAU, *sets):
        args += ["--set", value]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return config.parent / "runs" / name


def epoch_lrs(run: Path) -> list[float]:
    records = read_metrics(run / "metrics.jsonl")
    return [r["lr"] for r in records if r["event"] == "epoch" and not r.get("partial")]


def test_the_lr_decays_after_patience_and_holds_in_the_cooldown(tiny_config: Path) -> None:
    run = fit(tiny_config, "straight")
    assert epoch_lrs(run) == pytest.approx([0.5, 0.5, 0.25, 0.25, 0.125, 0.125], rel=1e-6)
    assert "learning rate now 0.25" in (run / "train.log").read_text()


def test_a_run_stopped_mid_epoch_resumes_bit_identically(tiny_config: Path) -> None:
    straight = fit(tiny_config, "straight")
    per_epoch = next(r for r in read_metrics(straight / "metrics.jsonl") if r["event"] == "epoch")
    stop_at = 3 * per_epoch["batch"] + 2  # inside epoch 4, after two decays' worth of evals
    split = fit(tiny_config, "split", f"fit.max_updates={stop_at}")
    resumed = CliRunner().invoke(
        cli, ["resume", str(split), "--set", "fit.max_updates=null", "--progress", "quiet"]
    )
    assert resumed.exit_code == 0, resumed.output
    assert epoch_lrs(split) == epoch_lrs(straight)
    for name, value in params(straight, 6).items():
        np.testing.assert_array_equal(params(split, 6)[name], value, err_msg=name)
