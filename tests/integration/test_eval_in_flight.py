"""An evaluation inside an epoch (fit.eval_interval) leaves training's numbers alone, however
far the devices lag behind Python.

MXNet's oneDNN operators re-lay a weight out in place for inference; a backward still queued
when an evaluation's forward is pushed then computes with the other layout's kernel (1-ulp
differences that depended on timing: on a loaded machine a run stopped mid-epoch and resumed
was not bit-identical to a straight one). A callback keeps the CPU busy so that the batch
before the evaluation is still queued when it starts, which makes the race certain."""

from __future__ import annotations

from pathlib import Path

import mxnet as mx
import numpy as np
from click.testing import CliRunner

from mxtrain.cli.main import cli

BUSY = '''\
import mxnet as mx


class Busy:
    """Queues a few seconds of matrix products after batch 3, without waiting for them."""

    def __init__(self):
        self.a = mx.nd.ones((1200, 1200))

    def on_batch_end(self, ctx):
        if ctx.batch == 3:
            for _ in range(12):
                self.a = mx.nd.dot(self.a, self.a) / 1200
'''

WORDS = {"boring": "VERB", "kally": "ADV", "mipness": "NOUN", "tusful": "ADJ", "zening": "VERB"}


def write_project(folder: Path) -> Path:
    (folder / "busy.py").write_text(BUSY, encoding="utf-8")
    rng = np.random.RandomState(0)
    lines = []
    for _ in range(64):
        for word in rng.choice(sorted(WORDS), size=rng.randint(3, 8)):
            lines.append(f"{word} {WORDS[word]}")
        lines.append("")
    (folder / "train.conll").write_text("\n".join(lines) + "\n", encoding="utf-8")
    path = folder / "tagger.yaml"
    path.write_text(
        f"""\
experiment: {{name: tagger, seed: 3, runs_dir: {folder / "runs"}}}
model: {{name: rnn_tagger, num_embed: 16, num_hidden: 32, dropout: 0.2}}
data:
  train: {{iterator: tagged_sequences, source: train.conll, batch_size: 8, buckets: [4, 8]}}
  eval: {{iterator: tagged_sequences, source: train.conll, batch_size: 8}}
optimizer: {{name: adam, learning_rate: 0.01}}
fit: {{num_epoch: 1, max_updates: 4, callbacks: [busy.py:Busy]}}
""",
        encoding="utf-8",
    )
    return path


def trained(config: Path, name: str, *sets: str) -> dict[str, np.ndarray]:
    args = ["fit", str(config), "--name", name, "--progress", "quiet"]
    result = CliRunner().invoke(cli, [*args, *[a for s in sets for a in ("--set", s)]])
    assert result.exit_code == 0, result.output
    folder = config.parent / "runs" / name / "checkpoints"
    newest = sorted(p for p in folder.iterdir() if p.is_dir())[-1]
    return {k: v.asnumpy() for k, v in mx.nd.load(str(newest / "params.nd")).items()}


def test_an_evaluation_after_batch_4_leaves_its_update_unchanged(tmp_path: Path) -> None:
    config = write_project(tmp_path)
    plain = trained(config, "plain")
    evaluated = trained(config, "evaluated", "fit.eval_interval=4")
    assert sorted(plain) == sorted(evaluated)
    for name in plain:
        np.testing.assert_array_equal(plain[name], evaluated[name], err_msg=name)
