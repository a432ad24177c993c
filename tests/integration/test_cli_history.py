"""End-to-end: `mxtrain runs`, `show` and `diff` on runs made by a real tiny `mxtrain fit`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from conftest import TINY_CONFIG, write_corpus

from mxtrain.cli.main import cli
from mxtrain.run.folder import read_metrics
from mxtrain.run.history import SPARK_BLOCKS


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """runs/tiny (sgd lr 0.5, 2 epochs) then runs/tiny_b (lr 0.1, 3 epochs, best kept)."""
    root = tmp_path_factory.mktemp("history")
    write_corpus(root / "train.txt", 120, seed=1)
    write_corpus(root / "valid.txt", 30, seed=2)
    config = root / "tiny.yaml"
    config.write_text(textwrap.dedent(TINY_CONFIG.format(runs_dir=root / "runs")))
    runner = CliRunner()
    first = runner.invoke(cli, ["fit", str(config)], catch_exceptions=False)
    assert first.exit_code == 0, first.output
    second = runner.invoke(
        cli,
        [
            "fit",
            str(config),
            "--name",
            "tiny_b",
            "--set",
            "optimizer.learning_rate=0.1",
            "--set",
            "fit.num_epoch=3",
            "--set",
            "checkpoint.best_metric=perplexity",
        ],
        catch_exceptions=False,
    )
    assert second.exit_code == 0, second.output
    return root


def invoke(*args: str) -> click.testing.Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def epoch_records(run: Path) -> list[dict]:
    return [r for r in read_metrics(run / "metrics.jsonl") if r.get("event") == "epoch"]


def test_runs_lists_real_runs_newest_first(two_runs: Path) -> None:
    result = invoke("runs", str(two_runs / "runs"))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["NAME", "STATUS", "EPOCHS", "BEST", "DURATION", "STARTED"]
    assert [line.split()[0] for line in lines[1:3]] == ["tiny_b", "tiny"]
    best_b = min(r["eval"]["perplexity"] for r in epoch_records(two_runs / "runs" / "tiny_b"))
    assert lines[1].split()[1:3] == ["finished", "3/3"]
    assert f"eval perplexity {best_b:.4g}" in lines[1]
    assert lines[2].split()[1:3] == ["finished", "2/2"]


def test_runs_json_and_damaged_folders(two_runs: Path, tmp_path: Path) -> None:
    # a copy of the real runs plus a running, a failed and a corrupt hand-made folder
    runs = tmp_path / "runs"
    runs.mkdir()
    for name in ("tiny", "tiny_b"):
        os.symlink(two_runs / "runs" / name, runs / name)
    for name, status in (("live", '{"status": "running", "started": 1}'), ("bad", "{oops")):
        (runs / name).mkdir()
        (runs / name / "run.json").write_text(status)
    failed = runs / "failed"
    failed.mkdir()
    (failed / "run.json").write_text(json.dumps({"status": "failed", "started": 2, "ended": 3}))
    result = invoke("runs", str(runs), "--json")
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.output)}
    assert {n: r["status"] for n, r in rows.items()} == {
        "tiny": "finished",
        "tiny_b": "finished",
        "live": "running",
        "bad": "unreadable",
        "failed": "failed",
    }
    assert rows["tiny"]["epochs_done"] == 2 and rows["tiny"]["best"]["metric"] == "perplexity"
    table = invoke("runs", str(runs))
    assert table.exit_code == 0
    assert "bad: run.json is not valid JSON" in table.output


def test_runs_on_a_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    result = invoke("runs", str(tmp_path / "nowhere"))
    assert result.exit_code == 5
    assert "does not exist" in result.output and "Traceback" not in result.output


def test_show_prints_checkpoints_metrics_and_sparkline(two_runs: Path) -> None:
    run = two_runs / "runs" / "tiny_b"
    result = invoke("show", str(run))
    assert result.exit_code == 0, result.output
    out = result.output
    assert "status   finished" in out
    assert "optimizer.learning_rate  0.1" in out
    best_tag = (run / "checkpoints" / "best").read_text().strip()
    ckpt_lines = [line for line in out.splitlines() if line.strip().startswith("e000")]
    assert [line.split()[0] for line in ckpt_lines] == [
        "e0001-b000000",
        "e0002-b000000",
        "e0003-b000000",
    ]
    assert [line.split()[-1] == "best" for line in ckpt_lines] == [
        line.split()[0] == best_tag for line in ckpt_lines
    ]
    records = epoch_records(run)
    for record in records:
        row = next(line for line in out.splitlines() if line.split()[:1] == [str(record["epoch"])])
        assert f"{record['train']['perplexity']:.4g}" in row
        assert f"{record['eval']['perplexity']:.4g}" in row
    spark = next(line for line in out.splitlines() if line.startswith("eval perplexity"))
    blocks = spark.split()[2]
    assert len(blocks) == 3 and set(blocks) <= set(SPARK_BLOCKS)
    evals = [r["eval"]["perplexity"] for r in records]
    worst = evals.index(max(evals))
    assert blocks[worst] == SPARK_BLOCKS[-1] and blocks[evals.index(min(evals))] == SPARK_BLOCKS[0]


def test_show_json_and_full_config(two_runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(two_runs)  # RUN as a bare name under ./runs
    result = invoke("show", "tiny", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["run"]["status"] == "finished"
    assert [c["tag"] for c in data["checkpoints"]] == ["e0001-b000000", "e0002-b000000"]
    assert [e["eval"] for e in data["epochs"]] == [
        r["eval"] for r in epoch_records(two_runs / "runs" / "tiny")
    ]
    assert data["config"]["optimizer"]["learning_rate"] == 0.5
    full = invoke("show", "tiny", "--config")
    saved = (two_runs / "runs" / "tiny" / "config.yaml").read_text()
    assert all(f"  {line}" in full.output for line in saved.splitlines() if line)


def test_show_unknown_run_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = invoke("show", "nope")
    assert result.exit_code == 5
    assert "run nope not found" in result.output and "mxtrain runs" in result.output


def test_diff_between_runs_and_against_a_config_file(two_runs: Path) -> None:
    a, b = two_runs / "runs" / "tiny", two_runs / "runs" / "tiny_b"
    result = invoke("diff", str(a), str(b))
    assert result.exit_code == 0, result.output
    changed = {line.split()[0]: line for line in result.output.splitlines()[2:]}
    assert set(changed) == {"optimizer.learning_rate", "fit.num_epoch", "checkpoint.best_metric"}
    assert "0.5 -> 0.1" in changed["optimizer.learning_rate"]
    assert "None -> 'perplexity'" in changed["checkpoint.best_metric"]
    as_json = json.loads(invoke("diff", str(b), str(a), "--json").output)
    assert {"key": "fit.num_epoch", "a": 3, "b": 2} in as_json
    # a config file is resolved with its defaults before comparing
    same = invoke("diff", str(a), str(two_runs / "tiny.yaml"))
    assert same.exit_code == 0 and "no differences" in same.output
    edited = two_runs / "edited.yaml"
    edited.write_text(
        (two_runs / "tiny.yaml").read_text().replace("num_hidden: 12", "num_hidden: 9")
    )
    result = invoke("diff", str(edited), str(a))
    assert result.output.splitlines()[2].split() == ["model.num_hidden", "9", "->", "12"]


def test_diff_with_a_bad_config_names_the_file(two_runs: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {name: lstm_lm, num_hiden: 3}\ndata: {train: {source: x.txt}}\n")
    result = invoke("diff", str(two_runs / "runs" / "tiny"), str(bad))
    assert result.exit_code == 2
    assert "bad.yaml" in result.output and "num_hidden" in result.output


def test_runs_in_a_real_subprocess(two_runs: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mxtrain", "runs", str(two_runs / "runs")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[1].startswith("tiny_b")


def test_every_command_help_has_an_example() -> None:
    names = sorted(cli.commands)
    assert {"runs", "show", "diff", "plot", "init", "fit", "resume", "score"} <= set(names)
    for name in names:
        result = invoke(name, "--help")
        assert result.exit_code == 0
        examples = result.output.split("Examples:", 1)
        assert len(examples) == 2, f"`mxtrain {name} --help` has no Examples section"
        assert f"mxtrain {name}" in examples[1], f"`mxtrain {name} --help` example"


def test_bash_completion_script_is_generated() -> None:
    env = {**os.environ, "_MXTRAIN_COMPLETE": "bash_source"}
    proc = subprocess.run(
        [sys.executable, "-m", "mxtrain"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "complete -o nosort -F _mxtrain_completion mxtrain" in proc.stdout


def test_show_a_run_that_is_still_training(tmp_path: Path) -> None:
    run = tmp_path / "live"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"status": "running", "started": 1.0}))
    (run / "metrics.jsonl").write_text(
        json.dumps({"event": "interval", "epoch": 1, "batch": 40, "train": {"perplexity": 321.5}})
        + "\n"
    )
    result = invoke("show", str(run))
    assert result.exit_code == 0, result.output
    assert "status   running" in result.output
    assert "config: unreadable (no config.yaml)" in result.output
    assert "latest   epoch 1 batch 40: train perplexity=321.5" in result.output
    assert "no epoch has finished yet" in result.output
