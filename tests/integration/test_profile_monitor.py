"""fit.profile and fit.monitor: what lands in the run folder and in the log."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from mxtrain.cli.main import cli


def fit(tiny_config: Path, *sets: str) -> Path:
    args = ["fit", str(tiny_config), "--progress", "plain"]
    for item in sets:
        args += ["--set", item]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return tiny_config.parent / "runs" / "tiny"


def fit_in_subprocess(tiny_config: Path, *sets: str) -> Path:
    """MXNet's profiler can be finished once per process: profile runs get their own."""
    args = [sys.executable, "-m", "mxtrain", "fit", str(tiny_config), "--progress", "plain"]
    for item in sets:
        args += ["--set", item]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return tiny_config.parent / "runs" / "tiny"


def test_profile_records_the_asked_batches_into_the_run_folder(tiny_config: Path) -> None:
    run = fit_in_subprocess(tiny_config, "fit.profile=3", "fit.num_epoch=1")
    trace = json.loads((run / "profile" / "trace.json").read_text())
    events = trace["traceEvents"]
    # the LSTM LM's operators ran inside the recorded window
    names = {e.get("name") for e in events}
    assert any("FullyConnected" in str(n) for n in names), sorted(map(str, names))[:40]
    summary = (run / "profile" / "summary.txt").read_text()
    assert "FullyConnected" in summary and "Total Count" in summary
    log = (run / "train.log").read_text()
    assert "profiling batches 2-4" in log
    assert "profile written to" in log and "chrome://tracing" in log


def test_profile_longer_than_the_run_is_still_written(tiny_config: Path) -> None:
    run = fit_in_subprocess(tiny_config, "fit.profile=10000", "fit.num_epoch=1")
    assert (run / "profile" / "trace.json").stat().st_size > 0
    assert "FullyConnected" in (run / "profile" / "summary.txt").read_text()


def test_monitor_logs_matching_weights_and_gradients(tiny_config: Path) -> None:
    run = fit(
        tiny_config,
        "fit.monitor={pattern: 'pred_weight|embed', interval: 4}",
        "fit.num_epoch=1",
    )
    rows = [json.loads(line) for line in (run / "monitor.jsonl").read_text().splitlines()]
    assert rows
    assert {r["param"] for r in rows} == {"pred_weight", "embed_weight"}
    assert all(r["batch"] % 4 == 0 for r in rows)
    for r in rows:
        assert r["weight_norm"] > 0 and math.isfinite(r["grad_norm"]) and r["grad_norm"] > 0
        assert r["grad_to_weight"] == r["grad_norm"] / r["weight_norm"]
    # the weights change between records: these are live statistics, not a copy at start
    norms = [r["weight_norm"] for r in rows if r["param"] == "pred_weight"]
    assert len(set(norms)) == len(norms) > 1
    log = (run / "train.log").read_text()
    assert "monitor epoch 1 batch 4 pred_weight: |w|=" in log


def test_monitor_rejects_a_bad_regular_expression(tiny_config: Path) -> None:
    result = CliRunner().invoke(
        cli, ["fit", str(tiny_config), "--set", "fit.monitor={pattern: '(weight'}"]
    )
    assert result.exit_code == 2
    assert "fit.monitor.pattern" in result.output and "regular expression" in result.output
    assert "Traceback" not in result.output
