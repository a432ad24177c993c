"""fit.max_updates, fit.max_time, fit.eval_interval and fit.early_stopping in real runs."""

from __future__ import annotations

import json
from pathlib import Path

import mxnet as mx
import numpy as np
from click.testing import CliRunner
from conftest import newest_checkpoint

from mxtrain.cli.main import cli
from mxtrain.run.folder import read_metrics


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def fit(config: Path, name: str, *overrides: str) -> Path:
    args = ["fit", str(config), "--name", name, "--set", "fit.num_epoch=5"]
    for item in overrides:
        args += ["--set", item]
    code, out = invoke(*args)
    assert code == 0, out
    return config.parent / "runs" / name


def test_max_updates_stops_mid_epoch_and_resume_continues_exactly(tiny_config: Path) -> None:
    straight = fit(tiny_config, "straight", "fit.max_updates=37")
    short = fit(tiny_config, "short", "fit.max_updates=20")
    status = json.loads((short / "run.json").read_text())
    assert status["status"] == "finished" and status["stop_reason"] == "max_updates"
    epochs = [r for r in read_metrics(short / "metrics.jsonl") if r["event"] == "epoch"]
    assert epochs[-1]["finished"] == "max_updates"
    state = json.loads((newest_checkpoint(short) / "state.json").read_text())["state"]
    assert state["position"]["updates"] == 20
    # Resuming without raising the limit has nothing to do, and says which key to raise.
    code, out = invoke("resume", str(short))
    assert code == 2 and "fit.max_updates" in out
    code, out = invoke("resume", str(short), "--set", "fit.max_updates=37")
    assert code == 0, out
    a, b = newest_checkpoint(straight), newest_checkpoint(short)
    assert a.name == b.name
    pa, pb = mx.nd.load(str(a / "params.nd")), mx.nd.load(str(b / "params.nd"))
    for key in pa:
        np.testing.assert_array_equal(pa[key].asnumpy(), pb[key].asnumpy(), err_msg=key)


def test_max_time_ends_training_with_a_checkpoint(tiny_config: Path) -> None:
    run = fit(tiny_config, "timed", "fit.max_time=0.001")
    status = json.loads((run / "run.json").read_text())
    assert status["stop_reason"] == "max_time"
    epochs = [r for r in read_metrics(run / "metrics.jsonl") if r["event"] == "epoch"]
    assert len(epochs) == 1 and epochs[0]["batch"] == 1 and epochs[0]["partial"] is True
    assert newest_checkpoint(run).name == "e0000-b000001"


def test_early_stopping_on_interval_evaluations(tiny_config: Path) -> None:
    # "higher perplexity is better" can never improve while training lowers it: the run must
    # stop after `patience` evaluations that did not improve.
    run = fit(
        tiny_config,
        "early",
        "fit.eval_interval=4",
        "fit.early_stopping={metric: perplexity, mode: max, patience: 2}",
    )
    records = read_metrics(run / "metrics.jsonl")
    evals = [r for r in records if r["event"] == "eval"]
    assert [(r["epoch"], r["batch"]) for r in evals][:3] == [(1, 4), (1, 8), (1, 12)]
    values = [r["eval"]["perplexity"] for r in evals]
    assert values[1] < values[0] and values[2] < values[0]
    status = json.loads((run / "run.json").read_text())
    assert status["stop_reason"] == "early_stopping"
    assert [r for r in records if r["event"] == "epoch"][-1]["finished"] == "early_stopping"


def test_early_stopping_needs_eval_data(tiny_config: Path) -> None:
    code, out = invoke(
        "check", str(tiny_config), "--set", "data.eval=null", "--set", "fit.early_stopping={}"
    )
    assert code == 2 and "fit.early_stopping needs evaluation data" in out
