"""`mxtrain sweep` end to end: every point an ordinary run in the sweep folder, the summary
table, a failing point recorded, and a sweep stopped mid-way continued to the same table."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from click.testing import CliRunner

from mxtrain.cli.main import cli

GRID = ["--grid", "optimizer.learning_rate=0.5,0.2", "--grid", "model.num_hidden=8,12"]


def sweep_args(config: Path, name: str) -> list[str]:
    return ["sweep", str(config), *GRID, "--name", name, "--set", "fit.num_epoch=2"]


def table(folder: Path) -> list[dict[str, str]]:
    rows = list(csv.DictReader((folder / "summary.csv").open()))
    for row in rows:
        row.pop("minutes")
    return rows


def stop_when_second_point_starts(config: Path, args: list[str], folder: Path) -> None:
    """Run the sweep ``args`` as a process, SIGTERM it once its second point's run folder
    exists, and check that it stopped with exit code 75 (the process ended either way)."""
    command = [sys.executable, "-m", "mxtrain", *args]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    child = subprocess.Popen(command, cwd=config.parent, env=env, stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not any(folder.glob("002_*/run.json")):
            assert child.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=120) == 75
    finally:
        if child.poll() is None:
            child.kill()


def test_a_grid_sweep_runs_every_point_and_tables_them(tiny_config: Path) -> None:
    result = CliRunner().invoke(cli, sweep_args(tiny_config, "grid"))
    assert result.exit_code == 0, result.output
    folder = tiny_config.parent / "runs" / "grid"
    rows = table(folder)
    assert [r["point"] for r in rows] == [
        "001_learning_rate=0.5,num_hidden=8",
        "002_learning_rate=0.5,num_hidden=12",
        "003_learning_rate=0.2,num_hidden=8",
        "004_learning_rate=0.2,num_hidden=12",
    ]
    assert all(r["status"] == "finished" and r["metric"] == "perplexity" for r in rows)
    assert {r["optimizer.learning_rate"] for r in rows} == {"0.5", "0.2"}
    # each point is an ordinary run: `mxtrain runs` lists them, its config has the point's values
    listed = CliRunner().invoke(cli, ["runs", str(folder), "--json"])
    assert listed.exit_code == 0 and len(json.loads(listed.output)) == 4
    saved = (folder / rows[3]["point"] / "config.yaml").read_text()
    assert "num_hidden: 12" in saved and "learning_rate: 0.2" in saved
    assert (
        "| 004_learning_rate=0.2,num_hidden=12 | finished |" in (folder / "summary.md").read_text()
    )
    # the same command again: nothing left to run, the same table
    again = CliRunner().invoke(cli, sweep_args(tiny_config, "grid"))
    assert again.exit_code == 0, again.output
    assert table(folder) == rows


def test_a_failing_point_is_recorded_and_the_sweep_goes_on(tiny_config: Path) -> None:
    args = ["sweep", str(tiny_config), "--grid", "data.train.source=missing.txt,train.txt",
            "--name", "failing", "--set", "fit.num_epoch=1"]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 6, result.output
    assert "1 of 2 points failed" in result.output
    rows = table(tiny_config.parent / "runs" / "failing")
    assert [r["status"] for r in rows] == ["failed", "finished"]
    assert "missing.txt" in rows[0]["error"]


def test_a_sweep_stopped_midway_continues_to_the_same_table(tiny_config: Path) -> None:
    # three points of one epoch: the stop lands in the second, the third is still pending
    def args(name: str) -> list[str]:
        return ["sweep", str(tiny_config), "--grid", "optimizer.learning_rate=0.5,0.2,0.1",
                "--name", name, "--set", "fit.num_epoch=1"]  # fmt: skip

    straight = CliRunner().invoke(cli, args("straight"))
    assert straight.exit_code == 0, straight.output
    folder = tiny_config.parent / "runs" / "stopped"
    stop_when_second_point_starts(tiny_config, args("stopped"), folder)
    states = {
        p["name"]: p["status"] for p in json.loads((folder / "sweep.json").read_text())["points"]
    }
    assert states["001_learning_rate=0.5"] == "finished"
    assert "pending" in states.values()
    resumed = CliRunner().invoke(cli, args("stopped"))
    assert resumed.exit_code == 0, resumed.output
    assert table(folder) == table(tiny_config.parent / "runs" / "straight")


def test_a_different_sweep_in_the_same_folder_is_refused(tiny_config: Path) -> None:
    first = ["sweep", str(tiny_config), "--grid", "model.num_hidden=8", "--name", "same",
             "--set", "fit.num_epoch=1"]  # fmt: skip
    assert CliRunner().invoke(cli, first).exit_code == 0
    other = [*first[:3], "model.num_hidden=9", *first[4:]]
    result = CliRunner().invoke(cli, other)
    assert result.exit_code == 2 and "holds another sweep" in result.output


SEARCH = ["--search", "optimizer.learning_rate=float:0.05:1.0:log",
          "--search", "model.num_hidden=choice:8,12", "--trials", "4", "--seed", "3"]  # fmt: skip


def search_args(config: Path, name: str) -> list[str]:
    return ["sweep", str(config), *SEARCH, "--name", name, "--set", "fit.num_epoch=3"]


def study_states(folder: Path) -> list[str]:
    import optuna

    study = optuna.load_study(study_name="sweep", storage=f"sqlite:///{folder / 'study.db'}")
    return [t.state.name for t in study.get_trials()]


def test_a_search_samples_its_trials_and_a_stopped_one_continues(tiny_config: Path) -> None:
    folder = tiny_config.parent / "runs" / "search"
    stop_when_second_point_starts(tiny_config, search_args(tiny_config, "search"), folder)
    assert "RUNNING" in study_states(folder) or "pending" not in (folder / "sweep.json").read_text()
    resumed = CliRunner().invoke(cli, search_args(tiny_config, "search"))
    assert resumed.exit_code == 0, resumed.output
    states = study_states(folder)
    assert len(states) == 4 and set(states) <= {"COMPLETE", "PRUNED"}
    rows = table(folder)
    assert len(rows) == 4 and {r["status"] for r in rows} <= {"finished", "pruned"}
    for row in rows:
        assert 0.05 <= float(row["optimizer.learning_rate"]) <= 1.0
        assert row["model.num_hidden"] in ("8", "12")
    # the same command once more: every trial is done
    again = CliRunner().invoke(cli, search_args(tiny_config, "search"))
    assert again.exit_code == 0 and len(study_states(folder)) == 4


def test_search_arguments_are_checked_before_anything_runs(tiny_config: Path) -> None:
    bad = [
        (["--search", "model.dropout=float:0.5:0.1", "--trials", "2"], "LOW < HIGH"),
        (["--search", "model.dropout=normal:0:1", "--trials", "2"], "expected float:LOW"),
        (["--search", "model.num_hidden=int:-5:8", "--trials", "2"], "num_hidden"),
        (["--search", "model.dropout=float:0:0.5"], "--search needs --trials"),
        (["--search", "model.dropout=float:0:0.5", "--grid", "model.num_hidden=8"], "one of"),
        (["--search", "model.dropout=float:0:0.5", "--trials", "2", "--metric", "bleu"], "bleu"),
    ]
    for args, says in bad:
        result = CliRunner().invoke(cli, ["sweep", str(tiny_config), *args, "--name", "bad"])
        assert result.exit_code == 2 and says in result.output, (args, result.output)
        assert not (tiny_config.parent / "runs" / "bad").exists()
