"""model.loss: one_pass end to end: training on the logits graph with the engine's softmax
head, evaluations that score computes again, the saved graph for score/predict/export, an
exact mid-epoch resume, data parallelism, padded sentences and metrics that read the
probabilities."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner
from conftest import (
    STREAM_LM_SIZES,
    assert_same_ending,
    assert_score_repeats_last_evaluation,
    newest_checkpoint,
    small_stream_lm,
    write_corpus,
)

from mxtrain.cli.main import cli
from mxtrain.run.folder import read_metrics

SENTENCES = """\
experiment: {{name: one_pass_sentences, seed: 4, runs_dir: {runs}}}
model: {{name: lstm_lm, num_embed: 8, num_hidden: 8, num_layers: 1, loss: one_pass}}
data:
  train: {{iterator: bucket_sentence, source: train.txt, batch_size: 5}}
  eval: {{iterator: bucket_sentence, source: valid.txt, batch_size: 5}}
optimizer: {{name: adam, learning_rate: 0.01}}
initializer: {{name: uniform, scale: 0.1}}
fit: {{num_epoch: 1, metrics: [perplexity, accuracy]}}
"""


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def make_config(folder: Path) -> Path:
    return small_stream_lm(folder, "one_pass", "loss: one_pass")


def sentences_config(folder: Path) -> Path:
    write_corpus(folder / "train.txt", 150, seed=1)
    write_corpus(folder / "valid.txt", 40, seed=2)
    path = folder / "sentences.yaml"
    path.write_text(SENTENCES.format(runs=folder / "runs"), encoding="utf-8")
    return path


def fit(config: Path, name: str, *overrides: str) -> Path:
    args = ["fit", str(config), "--name", name, "--progress", "plain"]
    for item in overrides:
        args += ["--set", item]
    code, out = invoke(*args)
    assert code == 0, out
    return config.parent / "runs" / name


def test_trains_and_score_computes_its_evaluation_again(tmp_path: Path) -> None:
    run = fit(make_config(tmp_path), "one_pass")
    # the saved graph computes the loss itself (the softmax formulation): score, predict and
    # export load it as any other run's
    graph = json.loads((run / "model-symbol.json").read_text())
    ops = {node["op"] for node in graph["nodes"]}
    assert {"softmax", "pick"} <= ops
    last = [r for r in read_metrics(run / "metrics.jsonl") if r["event"] == "epoch"][-1]
    assert last["train"]["perplexity"] < 60  # a 40-word corpus: it learned something
    assert_score_repeats_last_evaluation(run, **STREAM_LM_SIZES)
    output = tmp_path / "predicted.jsonl"
    code, out = invoke(
        "predict", "--checkpoint", str(run), "--input", str(tmp_path / "valid.txt"),
        "--output", str(output),
    )  # fmt: skip
    assert code == 0, out
    assert len(output.read_text().splitlines()) == 40


def test_mid_epoch_resume_is_bit_identical(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    straight = fit(config, "straight", "fit.max_updates=30")
    short = fit(config, "short", "fit.max_updates=13")
    assert newest_checkpoint(short).name == "e0000-b000013"
    code, out = invoke("resume", str(short), "--set", "fit.max_updates=30")
    assert code == 0, out
    assert_same_ending(straight, short)


def test_two_devices_and_padded_sentences_with_probability_metrics(tmp_path: Path) -> None:
    """bucket_sentence pads the ends of sentences (rows the head zeroes); accuracy reads the
    probabilities, which the head copies before it writes the gradient over them; two CPU
    contexts split each batch."""
    config = sentences_config(tmp_path)
    one = fit(config, "one")
    two = fit(config, "two", "context.devices=cpu", "context.ids=[0,1]")
    for run in (one, two):
        last = [r for r in read_metrics(run / "metrics.jsonl") if r["event"] == "epoch"][-1]
        assert 0 < last["train"]["accuracy"] < 1 and last["train"]["perplexity"] > 1
        assert 0 < last["eval"]["accuracy"] < 1
    config_text = (one / "config.yaml").read_text()
    assert "loss: one_pass" in config_text
