"""Plain progress when stdout is not a terminal, --quiet, and the run's debug log file."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from mxtrain.cli.main import cli

STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"
# Every line a plain-mode fit prints to stdout is one of these.
INTERVAL = re.compile(
    rf"^{STAMP} INFO epoch (\d+) batch (\d+)/17 samples_per_s=\S+ tokens_per_s=\S+ lr=\S+ "
    r"eta_s=\d+ train_perplexity=[\d.]+$"
)
EPOCH_DONE = re.compile(
    rf"^{STAMP} INFO epoch (\d+) done seconds=\S+ samples_per_s=\S+ tokens_per_s=\S+ lr=\S+ "
    r"train_perplexity=[\d.]+ eval_perplexity=[\d.]+ checkpoint=e\d{4}-b000000( best=\*)?$"
)
OTHER_LOG = re.compile(rf"^{STAMP} (INFO|WARNING) \S.*$")
FINISHED = re.compile(r"^finished: \S+ \(eval perplexity=[\d.]+\)$")


def test_non_tty_output_is_plain_and_parseable(tiny_config: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mxtrain", "fit", str(tiny_config)],
        capture_output=True,
        text=True,
        timeout=240,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        cwd=tiny_config.parent,
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "\x1b[" not in proc.stdout  # no terminal escapes in a pipe
    lines = proc.stdout.splitlines()
    intervals = [m for m in map(INTERVAL.match, lines) if m]
    epochs = [m for m in map(EPOCH_DONE.match, lines) if m]
    for line in lines:
        assert OTHER_LOG.match(line) or FINISHED.match(line), f"unparseable line: {line!r}"
    # 17 batches an epoch, log_interval 5: batches 5, 10, 15 of epochs 1 and 2, in order.
    assert [(int(m[1]), int(m[2])) for m in intervals] == [
        (e, b) for e in (1, 2) for b in (5, 10, 15)
    ]
    assert [int(m[1]) for m in epochs] == [1, 2]
    assert FINISHED.match(lines[-1])


def test_quiet_prints_nothing_but_keeps_the_full_log(tiny_config: Path) -> None:
    result = CliRunner().invoke(cli, ["fit", str(tiny_config), "--quiet"])
    assert result.exit_code == 0, result.output
    assert " INFO " not in result.output and "epoch" not in result.output
    run = tiny_config.parent / "runs" / "tiny"
    log_text = (run / "train.log").read_text()
    assert re.search(r"INFO mxtrain: epoch 2 batch 15/17 samples_per_s=", log_text)
    assert "epoch 2 done" in log_text
    # Errors still reach stderr when quiet.
    again = CliRunner().invoke(cli, ["fit", str(tiny_config), "--quiet"])
    assert again.exit_code == 5 and "already exists" in again.stderr


def test_train_log_is_debug_level_with_environment_facts(tiny_config: Path) -> None:
    result = CliRunner().invoke(cli, ["fit", str(tiny_config), "--progress", "quiet"])
    assert result.exit_code == 0, result.output
    run = tiny_config.parent / "runs" / "tiny"
    log_text = (run / "train.log").read_text()
    assert re.search(r" DEBUG mxtrain: environment mxnet = 1\.\d+\.\d+", log_text)
    assert re.search(r" DEBUG mxtrain: environment threads\.OMP_NUM_THREADS = \d+", log_text)
    assert re.search(r" INFO mxtrain: environment: mxtrain .*MXNet .*numpy .*seed 3", log_text)
    status = json.loads((run / "run.json").read_text())
    environment = status["environment"]
    assert environment["seed"] == 3 and environment["contexts"] == ["cpu(0)"]
    assert environment["env"]["OMP_NUM_THREADS"] == environment["threads"]["OMP_NUM_THREADS"]
    assert {"mxnet", "numpy", "python", "platform", "cpu_count"} <= set(environment)
    # The older top-level fields are still there for readers of run.json.
    assert status["mxnet"] == environment["mxnet"] and "threads" in status
