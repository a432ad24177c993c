"""model.sampled_softmax end to end: training on the sampled softmax, evaluations, score and
the saved graph on the full one, an exact mid-epoch resume, and clear errors for settings
that cannot work."""

from __future__ import annotations

import json
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest
from click.testing import CliRunner
from conftest import (
    STREAM_LM_SIZES,
    assert_same_ending,
    assert_score_repeats_last_evaluation,
    newest_checkpoint,
    small_stream_lm,
)

from mxtrain.cli.main import cli


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def make_config(folder: Path, *, sampled: int = 8, tie: bool = False) -> Path:
    model = f"tie_weights: {str(tie).lower()}, sampled_softmax: {sampled}"
    return small_stream_lm(folder, "sampled", model)


def fit(config: Path, name: str, *overrides: str) -> tuple[Path, str]:
    args = ["fit", str(config), "--name", name, "--progress", "plain"]
    for item in overrides:
        args += ["--set", item]
    code, out = invoke(*args)
    assert code == 0, out
    return config.parent / "runs" / name, out


def load(path: Path) -> dict[str, np.ndarray]:
    return {k: v.asnumpy() for k, v in mx.nd.load(str(path)).items()}


@pytest.mark.parametrize("tie", [False, True])
def test_trains_sampled_and_evaluates_with_the_full_softmax(tmp_path: Path, tie: bool) -> None:
    config = make_config(tmp_path, tie=tie)
    run, out = fit(config, "sampled")
    assert "sampled softmax" in out and "evaluations use the full softmax" in out
    # the saved graph is the full model: what score, predict and export load
    graph = json.loads((run / "model-symbol.json").read_text())
    ops = {node["op"] for node in graph["nodes"]}
    names = {node["name"] for node in graph["nodes"]}
    assert "pred" in names and "pred_sampled" not in names and "_random_uniform" not in ops
    # fit's evaluation is the full softmax's perplexity: score computes it again (eval_interval
    # evaluates inside the epochs too: the evaluations read the live weights; fit's evaluation
    # module runs with fusion off, see rescored_rel)
    assert_score_repeats_last_evaluation(run, **STREAM_LM_SIZES)
    code, out = invoke("export", str(run), "--output", str(tmp_path / "exported"))
    assert code == 0, out


def test_mid_epoch_resume_is_bit_identical(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    straight, _ = fit(config, "straight", "fit.max_updates=30")
    short, _ = fit(config, "short", "fit.max_updates=13")
    assert newest_checkpoint(short).name == "e0000-b000013"
    code, out = invoke("resume", str(short), "--set", "fit.max_updates=30")
    assert code == 0, out
    assert_same_ending(straight, short)


def test_training_differs_from_the_full_softmax(tmp_path: Path) -> None:
    """The option changes training (a test of the graph choice, not of speed)."""
    config = make_config(tmp_path)
    sampled, _ = fit(config, "sampled", "fit.num_epoch=1")
    full, _ = fit(config, "full", "fit.num_epoch=1", "model.sampled_softmax=0")
    a = load(sampled / "model-0001.params")
    b = load(full / "model-0001.params")
    assert sorted(a) == sorted(b)
    assert not np.array_equal(a["arg:pred_weight"], b["arg:pred_weight"])


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("model.sampled_softmax=19", "must be smaller than the vocabulary it samples from (19"),
        ("model.sampled_softmax=-3", "must be 0 (the full softmax) or a number of sampled words"),
        ("fit.metrics=[accuracy]", "need them"),
    ],
)
def test_settings_that_cannot_work_are_explained(
    tmp_path: Path, override: str, expected: str
) -> None:
    config = make_config(tmp_path)
    code, out = invoke("fit", str(config), "--name", "bad", "--set", override)
    assert code != 0
    assert expected in out
    assert "Traceback" not in out
    assert "sampled_softmax" in out
    assert f"{config}:" in out or "--set" in out  # where the setting was written
    assert not (tmp_path / "runs" / "bad" / "model-symbol.json").exists()
