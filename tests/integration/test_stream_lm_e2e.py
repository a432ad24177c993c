"""Stateful language models on bptt_stream: fit, exact mid-epoch resume, score, predict."""

from __future__ import annotations

import json
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest
from click.testing import CliRunner
from conftest import assert_same_ending, newest_checkpoint, write_corpus
from float_bounds import rescored_rel

from mxtrain.cli.main import cli
from mxtrain.run.folder import read_metrics

# Dropout, random lengths, momentum, an epoch-counted lr schedule, global-norm clipping and
# evaluations inside the epoch: everything that could make a resumed stream run drift.
STREAM_CONFIG = """\
experiment: {{name: stream, seed: 3, runs_dir: {runs}}}
model: {{name: lstm_lm, num_embed: 10, num_hidden: 10, num_layers: 2, dropout: 0.2,
        cell: {cell}, tie_weights: true}}
data:
  train: {{iterator: bptt_stream, source: train.txt, batch_size: 6, bptt: 7,
          random_length: true, length_step: 2}}
  eval: {{iterator: bptt_stream, source: valid.txt, batch_size: 4, bptt: 9}}
optimizer:
  name: sgd
  learning_rate: 1.0
  momentum: 0.5
  clip_global_norm: 2.0
  lr_scheduler: {{type: multifactor, steps: [1], factor: 0.5, unit: epochs}}
initializer: {{name: uniform, scale: 0.1}}
fit: {{num_epoch: 2, log_interval: 5, eval_interval: 9}}
"""


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


@pytest.fixture
def stream_config(tmp_path: Path) -> Path:
    write_corpus(tmp_path / "train.txt", 150, seed=1)
    write_corpus(tmp_path / "valid.txt", 40, seed=2)
    path = tmp_path / "stream.yaml"
    path.write_text(STREAM_CONFIG.format(runs=tmp_path / "runs", cell="fused"))
    return path


def fit(config: Path, name: str, *overrides: str) -> Path:
    args = ["fit", str(config), "--name", name]
    for item in overrides:
        args += ["--set", item]
    code, out = invoke(*args)
    assert code == 0, out
    return config.parent / "runs" / name


def load(path: Path) -> dict[str, np.ndarray]:
    return {k: v.asnumpy() for k, v in mx.nd.load(str(path)).items()}


def test_mid_epoch_resume_is_bit_identical(stream_config: Path) -> None:
    straight = fit(stream_config, "straight", "fit.max_updates=40")
    short = fit(stream_config, "short", "fit.max_updates=13")
    stop = newest_checkpoint(short)
    assert stop.name == "e0000-b000013"  # inside the first epoch
    saved = load(stop / "optimizer.nd")
    assert any(k.startswith("recurrent_state:lstm_begin_state_") for k in saved)
    code, out = invoke("resume", str(short), "--set", "fit.max_updates=40")
    assert code == 0, out
    # the evaluations after the resume saw the same model and the same data
    params = assert_same_ending(straight, short)
    assert "arg:pred_weight" not in params  # tie_weights: the output layer reads the embedding
    # lr_scheduler.unit: epochs, steps [1]: the second epoch trains at half the rate
    lrs = [r["lr"] for r in read_metrics(straight / "metrics.jsonl") if r["event"] == "epoch"]
    assert lrs == [1.0, 0.5]


def test_checkpoints_keep_the_carried_state(stream_config: Path) -> None:
    """What the resume test depends on: a mid-epoch checkpoint holds non-zero final states
    for every state input (a model restarted from zeros would train differently)."""
    short = fit(stream_config, "short", "fit.max_updates=13")
    saved = load(newest_checkpoint(short) / "optimizer.nd")
    states = {k: v for k, v in saved.items() if k.startswith("recurrent_state:")}
    assert sorted(states) == [
        "recurrent_state:lstm_begin_state_0@0",
        "recurrent_state:lstm_begin_state_1@0",
    ]
    assert all(np.abs(v).max() > 0 for v in states.values())
    assert states["recurrent_state:lstm_begin_state_0@0"].shape == (2, 6, 10)


def test_score_reads_the_whole_split_with_carried_state(stream_config: Path) -> None:
    run = fit(stream_config, "scored", "fit.num_epoch=1")
    code, out = invoke("score", str(run), "--json")
    assert code == 0, out
    scored = json.loads(out.strip().splitlines()[-1])
    last_eval = [r for r in read_metrics(run / "metrics.jsonl") if r["event"] == "epoch"][-1]
    # the saved weights and the same streams, batches and carried state as fit's evaluation,
    # through an inference-bound module (float_bounds.rescored_rel)
    logged = last_eval["eval"]["perplexity"]
    rel = rescored_rel(run, logged, steps=9, batch=4, embed=10, hidden=10, layers=2)
    assert scored["metrics"]["perplexity"] == pytest.approx(logged, rel=rel)


def test_predict_writes_one_record_per_line(stream_config: Path, tmp_path: Path) -> None:
    run = fit(stream_config, "predicted", "fit.num_epoch=1")
    lines = ["w1 w2 w3", "w2 w4"]
    source = tmp_path / "input.txt"
    source.write_text("\n".join(lines) + "\n")
    out_file = tmp_path / "out.jsonl"
    code, out = invoke(
        "predict", "--checkpoint", str(run), "--input", str(source), "--output", str(out_file)
    )
    assert code == 0, out
    records = [json.loads(x) for x in out_file.read_text().splitlines()]
    assert len(records) == len(lines)


def test_results_script_reports_the_runs_figures(stream_config: Path, tmp_path: Path) -> None:
    """scripts/results.py writes RESULTS.md from a run folder, test perplexity scored by
    `mxtrain score RUN:best --data treebank:test`, nothing typed."""
    import subprocess
    import sys

    run = fit(stream_config, "reported", "fit.num_epoch=2")
    script = Path(__file__).resolve().parents[2] / "scripts" / "results.py"
    output = tmp_path / "RESULTS.md"
    proc = subprocess.run(
        [sys.executable, str(script), "--runs", str(tmp_path / "none"), "--output", str(output),
         "--run", f"ptb_zaremba_small={run}"],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(output.with_suffix(".json").read_text())["ptb_zaremba_small"]
    evals = [r["eval"]["perplexity"] for r in read_metrics(run / "metrics.jsonl")
             if r["event"] == "epoch"]  # fmt: skip
    assert figures["valid"] == min(evals) and figures["epochs"] == 2
    assert figures["planned_epochs"] == 13  # the shipped config's num_epoch, not the run's
    code, out = invoke("score", f"{run}:best", "--data", "treebank:test", "--json")
    assert code == 0, out
    test = json.loads(out.strip().splitlines()[-1])["metrics"]["perplexity"]
    assert figures["test"] == pytest.approx(test, rel=1e-9)
    text = output.read_text()
    assert "| `configs/ptb_zaremba_small.yaml` |" in text and f"{min(evals):,.1f}" in text
    assert "| 2 of 13 |" in text
    assert "carried" not in text

    # Run folders stay on the machine that trained them: regenerating elsewhere keeps the row
    # from RESULTS.json, says so, and still compares the run's config with the shipped one.
    again = subprocess.run(
        [sys.executable, str(script), "--runs", str(tmp_path / "none"), "--output", str(output),
         "--no-test"],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    kept = json.loads(output.with_suffix(".json").read_text())["ptb_zaremba_small"]
    assert kept["carried"] is True and kept["test"] == figures["test"]
    assert kept["config_changes"] == figures["config_changes"] and kept["config_changes"]
    text = output.read_text()
    assert "`ptb_zaremba_small`: carried from the previous RESULTS.json" in text
    assert f"{min(evals):,.1f}" in text and "| 2 of 13 |" in text
    assert ", ".join(f"{e}: {v:.1f}" for e, v in enumerate(evals, 1)) in text

    dropped = subprocess.run(
        [sys.executable, str(script), "--runs", str(tmp_path / "none"), "--output", str(output),
         "--no-test", "--drop-missing"],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    assert dropped.returncode == 1 and "nothing to write" in dropped.stderr
