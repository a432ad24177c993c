"""configs/plugin_example.yaml: a user's model, iterator and metric from a file beside the
config, through fit, score, predict and resume, also from a copied run folder."""

from __future__ import annotations

import json
import runpy
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from mxtrain.cli.main import cli
from mxtrain.run.folder import read_metrics

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
CONFIG = CONFIGS / "plugin_example.yaml"


def invoke(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result.exit_code, result.output


def test_plugin_example_trains_from_its_config(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli,
        [
            "fit",
            str(CONFIG),
            "--set",
            f"experiment.runs_dir={tmp_path}",
            "--set",
            "fit.num_epoch=6",
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    epochs = [
        r
        for r in read_metrics(tmp_path / "plugin_example" / "metrics.jsonl")
        if r["event"] == "epoch"
    ]
    assert epochs[-1]["eval"]["accuracy"] > 0.9
    assert epochs[-1]["eval"]["accuracy"] > epochs[0]["eval"]["accuracy"] - 1e-9
    # The example's own metric is the complement of accuracy on the same points.
    last = epochs[-1]["eval"]
    assert last["misclassified"] == pytest.approx(1 - last["accuracy"], abs=1e-6)


def test_plugin_options_are_checked_against_its_signature(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["check", str(CONFIG), "--set", "data.train.row=10"])
    assert result.exit_code == 2
    assert "data.train.row" in result.output and "Did you mean 'rows'" in result.output


def test_copied_run_folder_scores_predicts_and_resumes_on_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fit from a config folder, copy the run folder elsewhere, delete the config folder
    (config and plugin file): score, predict and resume use the kept plugin copy."""
    origin = tmp_path / "origin"
    origin.mkdir()
    for name in ("plugin_example.yaml", "plugin_example.py"):
        shutil.copy(CONFIGS / name, origin / name)
    code, output = invoke(
        "fit", origin / "plugin_example.yaml", "--set", f"experiment.runs_dir={origin}",
        "--set", "fit.num_epoch=2", "--set", "data.train.rows=600",
    )  # fmt: skip
    assert code == 0, output
    run = origin / "plugin_example"
    kept = run / "plugins" / "plugin_example.py"
    assert kept.read_bytes() == (origin / "plugin_example.py").read_bytes()
    manifest = json.loads((run / "plugins" / "plugins.json").read_text())
    assert [f["reference"] for f in manifest["files"]] == ["plugin_example.py"]

    points = tmp_path / "points.npz"  # the example's own writer: 200 labelled points
    monkeypatch.setattr(sys, "argv", ["plugin_example.py", str(points)])
    runpy.run_path(str(kept), run_name="__main__")
    copy = tmp_path / "elsewhere" / "plugin_example"
    shutil.copytree(run, copy)
    shutil.rmtree(origin)

    code, output = invoke("score", copy, "--json")
    assert code == 0, output
    scored = json.loads(output.strip().splitlines()[-1])
    assert scored["metrics"]["accuracy"] > 0.8
    assert scored["metrics"]["misclassified"] == pytest.approx(1 - scored["metrics"]["accuracy"])
    code, output = invoke("score", copy, "--data", points, "--json")
    assert code == 0, output
    assert json.loads(output.strip().splitlines()[-1])["metrics"]["accuracy"] > 0.8

    out = tmp_path / "arms.jsonl"
    code, output = invoke("predict", "--checkpoint", copy, "--input", points, "--output", out)
    assert code == 0, output
    records = [json.loads(line) for line in out.read_text().splitlines()]
    labels = np.load(points)["label"]
    assert [r["line"] for r in records] == list(range(1, 201))
    assert np.mean([r["label"] for r in records] == labels) > 0.8

    code, output = invoke("resume", copy, "--set", "fit.num_epoch=3", "--progress", "plain")
    assert code == 0, output
    epochs = [r["epoch"] for r in read_metrics(copy / "metrics.jsonl") if r["event"] == "epoch"]
    assert epochs == [1, 2, 3]
    assert "Traceback" not in output


def test_copied_run_without_its_config_folder_names_it_for_missing_data(tmp_path: Path) -> None:
    """Data files are not kept: a relative data path of a vanished config folder says so."""
    origin = tmp_path / "origin"
    origin.mkdir()
    rng = np.random.default_rng(0)
    labels = np.arange(32) % 2
    np.savez(origin / "rows.npz", data=rng.normal(size=(32, 3)).astype("f4"), label=labels)
    (origin / "rows.yaml").write_text(
        f"experiment: {{name: rows, runs_dir: {origin / 'runs'}}}\n"
        "model: {name: mlp, hidden: [4]}\n"
        "data:\n  train: {iterator: ndarray, source: rows.npz, batch_size: 8}\n"
        "  eval: {iterator: ndarray, source: rows.npz, batch_size: 8}\nfit: {num_epoch: 1}\n"
    )
    code, output = invoke("fit", origin / "rows.yaml")
    assert code == 0, output
    copy = tmp_path / "copy"
    shutil.copytree(origin / "runs" / "rows", copy)
    shutil.rmtree(origin)
    code, output = invoke("score", copy)
    assert code == 3, output
    assert f"config folder {origin}" in output and "no longer exists" in output
    assert "data files are not kept" in output and "--data" in output
    assert "Traceback" not in output
    assert output.count("no longer exists") == 1  # score and open_run do not both add it
    code, output = invoke("resume", copy, "--set", "fit.num_epoch=2")
    assert code == 3, output
    assert f"config folder {origin}" in output and "Traceback" not in output
