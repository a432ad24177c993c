"""What `check` accepts, `fit` runs: stock MXNet metrics, run names, cross-section rules.

Uses configs/ndarray_mlp.yaml on the demo blobs (scripts/make_demo_data.py), one epoch.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from mxtrain.cli.main import cli
from mxtrain.run.folder import read_metrics

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "ndarray_mlp.yaml"


@pytest.fixture
def demo(demo_blobs: Path) -> Path:
    return demo_blobs


def invoke(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert "Traceback" not in result.output
    return result.exit_code, result.output


def tiny(demo: Path, runs: Path) -> list[str]:
    overrides = [
        f"data.train.source={demo / 'features.npy'}",
        f"data.train.labels={demo / 'labels.npy'}",
        f"data.eval.source={demo / 'valid_features.npy'}",
        f"data.eval.labels={demo / 'valid_labels.npy'}",
        "fit.num_epoch=1",
        f"experiment.runs_dir={runs}",
    ]
    return [arg for o in overrides for arg in ("--set", o)]


def test_stock_mxnet_metric_is_adapted_in_fit_and_score(demo: Path, tmp_path: Path) -> None:
    args = tiny(demo, tmp_path / "runs")
    args += ["--set", "fit.metrics=[cross_entropy, 'mxnet.metric:Accuracy']"]
    args += ["--set", "checkpoint.best_metric='mxnet.metric:Accuracy'"]
    assert invoke("check", CONFIG, *args)[0] == 0
    code, output = invoke("fit", CONFIG, *args, "--name", "stock", "--progress", "plain")
    assert code == 0, output
    run = tmp_path / "runs" / "stock"
    epochs = [r for r in read_metrics(run / "metrics.jsonl") if r["event"] == "epoch"]
    assert 0.5 < epochs[-1]["eval"]["mxnet.metric:Accuracy"] <= 1.0
    assert epochs[-1].get("best") is True  # best_metric found the adapted metric
    code, output = invoke("score", run)
    assert code == 0, output
    assert "mxnet.metric:Accuracy" in output


@pytest.mark.parametrize("name", ["x" * 300, "a\x00b", "a\udcffb", "a/b", "..", "tab\there"])
def test_fit_with_an_impossible_name_leaves_nothing_behind(
    demo: Path, tmp_path: Path, name: str
) -> None:
    runs = tmp_path / "runs"
    code, output = invoke("fit", CONFIG, *tiny(demo, runs), "--name", name)
    assert code == 2, output
    assert "--name" in output and "run name" in output
    assert not runs.exists() or not any(runs.iterdir())
    # the same name in the config: check refuses it, naming the file and the key
    config = tmp_path / "named.yaml"
    quoted = name.encode("unicode_escape").decode("ascii").replace('"', '\\"')
    text = CONFIG.read_text(encoding="utf-8").replace("name: ndarray_mlp", f'name: "{quoted}"')
    config.write_text(text, encoding="utf-8")
    code, output = invoke("check", config)
    assert code == 2 and f"{config}:" in output and "experiment.name" in output
    code, output = invoke("check", CONFIG, "--set", f'experiment.name="{quoted}"')
    assert code == 2 and "--set experiment.name=" in output


def test_launch_refuses_an_impossible_name_before_starting_anything(tmp_path: Path) -> None:
    code, output = invoke("launch", "-n", "1", CONFIG, "--name", "a/b")
    assert code == 2 and "--name 'a/b'" in output and "slashes" in output
