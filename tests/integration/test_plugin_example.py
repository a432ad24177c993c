"""configs/plugin_example.yaml: a user's model and iterator from a file beside the config."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from mxtrain.cli.main import cli
from mxtrain.rundir import read_metrics

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "plugin_example.yaml"


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


def test_plugin_options_are_checked_against_its_signature(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["check", str(CONFIG), "--set", "data.train.row=10"])
    assert result.exit_code == 2
    assert "data.train.row" in result.output and "Did you mean 'rows'" in result.output
