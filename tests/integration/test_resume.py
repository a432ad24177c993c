"""Exact resume: interrupted + resumed runs equal uninterrupted ones, through real signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import metric_trace, params, write_corpus

from mxtrain.cli.main import cli

# Dropout, momentum and a short lr schedule: everything that makes resume hard.
RESUME_CONFIG = """\
experiment: {{name: {name}, seed: 5, runs_dir: {runs}}}
model: {{name: lstm_lm, num_embed: 8, num_hidden: 12, num_layers: 2, dropout: 0.3,
        cell: {cell}}}
data:
  train: {{iterator: bucket_sentence, source: train.txt, batch_size: 8, buckets: [5, 9, 13]}}
  eval: {{iterator: bucket_sentence, source: valid.txt, batch_size: 8}}
optimizer:
  name: sgd
  learning_rate: 0.5
  momentum: 0.9
  lr_scheduler: {{type: factor, step: 7, factor: 0.8}}
fit: {{num_epoch: {epochs}, log_interval: 4}}
"""


def make_config(
    folder: Path, name: str, epochs: int, cell: str = "unfused", sentences: int = 120
) -> Path:
    if not (folder / "train.txt").exists():
        write_corpus(folder / "train.txt", sentences, seed=1)
        write_corpus(folder / "valid.txt", 30, seed=2)
    path = folder / f"{name}.yaml"
    path.write_text(RESUME_CONFIG.format(name=name, runs=folder / "runs", epochs=epochs, cell=cell))
    return path


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def assert_same_run(straight: Path, resumed: Path, epoch: int) -> None:
    a, b = params(straight, epoch), params(resumed, epoch)
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    trace_a, trace_b = metric_trace(straight), metric_trace(resumed)
    assert len(trace_a) == len(trace_b)
    for row_a, row_b in zip(trace_a, trace_b, strict=True):
        assert row_a == row_b  # metric sums are restored exactly, so values are equal


@pytest.mark.parametrize("cell", ["unfused", "fused"])
def test_resume_at_epoch_boundary_matches_straight_run(tmp_path: Path, cell: str) -> None:
    straight = make_config(tmp_path, "straight", 3, cell)
    assert invoke("fit", str(straight))[0] == 0
    short = make_config(tmp_path, "split", 1, cell)
    assert invoke("fit", str(short))[0] == 0
    code, out = invoke("resume", str(tmp_path / "runs" / "split"), "--set", "fit.num_epoch=3")
    assert code == 0, out
    assert_same_run(tmp_path / "runs" / "straight", tmp_path / "runs" / "split", 3)
    status = json.loads((tmp_path / "runs" / "split" / "run.json").read_text())
    assert status["status"] == "finished" and len(status["resumes"]) == 1


def _start_fit(config: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "mxtrain", "fit", str(config), "--progress", "plain"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        cwd=config.parent,
    )


def _wait_for_interval(run: Path, proc: subprocess.Popen[str], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        metrics = run / "metrics.jsonl"
        if metrics.exists() and '"interval"' in metrics.read_text():
            return
        if proc.poll() is not None:
            raise AssertionError(f"fit ended early: {proc.communicate()[0]}")
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("no interval record in time")


def test_sigterm_checkpoints_mid_epoch_and_resume_matches(tmp_path: Path) -> None:
    straight = make_config(tmp_path, "straight", 2, sentences=1200)
    assert invoke("fit", str(straight))[0] == 0
    config = make_config(tmp_path, "stopped", 2, sentences=1200)
    run = tmp_path / "runs" / "stopped"
    proc = _start_fit(config)
    try:
        _wait_for_interval(run, proc)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 75, output
    assert "SIGTERM received" in output and "mxtrain resume" in output
    assert json.loads((run / "run.json").read_text())["status"] == "preempted"
    tags = sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("e"))
    assert tags, "a checkpoint of the stop point must exist"
    code, out = invoke("resume", str(run))
    assert code == 0, out
    assert_same_run(tmp_path / "runs" / "straight", run, 2)


def test_resume_refuses_must_match_changes_and_shows_the_diff(tmp_path: Path) -> None:
    config = make_config(tmp_path, "policy", 1)
    assert invoke("fit", str(config))[0] == 0
    run = str(tmp_path / "runs" / "policy")
    code, out = invoke("resume", run, "--set", "fit.num_epoch=2", "--set", "model.num_hidden=5")
    assert code == 2
    assert "model.num_hidden: 12 -> 5 (must match)" in out and "--force" in out
    assert "fit.num_epoch" not in out.split("must match the saved run:")[1]
    code, out = invoke("resume", run)
    assert code == 2 and "nothing to resume" in out and "fit.num_epoch=2" in out


def test_resume_falls_back_when_the_newest_checkpoint_is_corrupt(tmp_path: Path) -> None:
    config = make_config(tmp_path, "corrupt", 2)
    assert invoke("fit", str(config))[0] == 0
    run = tmp_path / "runs" / "corrupt"
    newest = run / "checkpoints" / "e0002-b000000" / "params.nd"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    newest.write_bytes(bytes(data))
    code, out = invoke("resume", str(run), "--set", "fit.num_epoch=3")
    # Falling back to epoch 1 would overwrite epoch 2's (corrupt) checkpoint: the corrupt one
    # is not counted as something to protect, so the resume goes ahead from epoch 1.
    assert code == 0, out
    log = (run / "train.log").read_text()
    assert "e0002-b000000" in log and "falling back" in log
    assert (run / "model-0003.params").exists()


def test_missing_run_folder_is_a_clear_error(tmp_path: Path) -> None:
    code, out = invoke("resume", str(tmp_path / "nope"))
    assert code == 5 and "nope" in out and "Traceback" not in out


def test_resume_keeps_the_recorded_buckets_when_the_rule_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run started by one mxtrain and resumed by a newer one whose ``buckets: auto`` rule
    derives other buckets still sees the batches it started with."""
    straight = make_config(tmp_path, "straight", 2)
    auto = straight.read_text().replace("buckets: [5, 9, 13]", "buckets: auto, num_buckets: 3")
    straight.write_text(auto)
    assert invoke("fit", str(straight))[0] == 0
    short = make_config(tmp_path, "split", 1)
    short.write_text(auto.replace("num_epoch: 2", "num_epoch: 1").replace("straight", "split"))
    assert invoke("fit", str(short))[0] == 0

    import mxtrain.data.bucket_sentence as bucket_sentence

    def other_rule(lengths: np.ndarray, options: object) -> list[int]:
        return [4, int(lengths.max())]  # what a different rule might choose

    monkeypatch.setattr(bucket_sentence, "derive_buckets", other_rule)
    code, out = invoke("resume", str(tmp_path / "runs" / "split"), "--set", "fit.num_epoch=2")
    assert code == 0, out
    assert_same_run(tmp_path / "runs" / "straight", tmp_path / "runs" / "split", 2)
