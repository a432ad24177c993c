"""Gluon models: a plugin returns a HybridBlock written for gluon.Trainer, and `mxtrain fit`
traces it per bucket, adds the tagger's loss head, honours its own initializers, resumes
bit-identically mid-epoch and exports back to a Gluon SymbolBlock; blocks that cannot be
traced are named with the reason."""

from __future__ import annotations

import json
from pathlib import Path

import mxnet as mx
import numpy as np
from click.testing import CliRunner
from conftest import assert_same_ending
from float_bounds import assert_close_at_scale, rnn_chain_roundings

from mxtrain.cli.main import cli
from mxtrain.errors import ExitCode

PLUGIN = '''\
import mxnet as mx
from mxnet.gluon import nn, rnn


class Tagger(mx.gluon.HybridBlock):
    """A bidirectional LSTM tagger as one writes it for gluon.Trainer."""

    def __init__(self, vocab, classes, hidden, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.embed = nn.Embedding(vocab, 8)
            self.lstm = rnn.LSTM(hidden, layout="NTC", bidirectional=True)
            self.drop = nn.Dropout(0.2)
            self.out = nn.Dense(classes, flatten=False, bias_initializer=mx.init.Constant(0.25))

    def hybrid_forward(self, F, x):
        return self.out(self.drop(self.lstm(self.embed(x))))


def tagger(data_info, hidden=6):
    return Tagger(data_info.vocab_size, data_info.num_classes, hidden)


class Untraceable(mx.gluon.HybridBlock):
    def hybrid_forward(self, F, x):
        return F.array(x.asnumpy())


def untraceable(data_info):
    return Untraceable()


def not_hybrid(data_info):
    return nn.Sequential()
'''

WORDS = ["boring", "kally", "mipness", "tusful", "zening", "kalness"]
LABELS = {"ing": "VERB", "ly": "ADV", "ness": "NOUN", "ful": "ADJ"}


def write_project(folder: Path, model: str = "blocks.py:tagger", extra: str = "") -> Path:
    (folder / "blocks.py").write_text(PLUGIN, encoding="utf-8")
    rng = np.random.RandomState(0)
    lines = []
    for _ in range(48):
        for word in rng.choice(WORDS, size=rng.randint(3, 8)):
            label = next(y for s, y in LABELS.items() if word.endswith(s))
            lines.append(f"{word} {label}")
        lines.append("")
    (folder / "train.conll").write_text("\n".join(lines) + "\n", encoding="utf-8")
    path = folder / "gluon.yaml"
    path.write_text(
        f"""\
experiment: {{name: gluon, seed: 2, runs_dir: {folder / "runs"}}}
model: {{name: "{model}", hidden: 6}}
data:
  train: {{iterator: tagged_sequences, source: train.conll, batch_size: 8, buckets: [4, 8]}}
  eval: {{iterator: tagged_sequences, source: train.conll, batch_size: 8}}
optimizer: {{name: adam, learning_rate: 0.03}}
fit: {{num_epoch: 3, metrics: [accuracy]}}
{extra}""",
        encoding="utf-8",
    )
    return path


def fit(config: Path, name: str, *sets: str) -> tuple[int, str]:
    args = ["fit", str(config), "--name", name, "--progress", "plain"]
    for value in sets:
        args += ["--set", value]
    result = CliRunner().invoke(cli, args)
    return result.exit_code, result.output


def load(run: Path, epoch: int) -> dict[str, np.ndarray]:
    arrays = mx.nd.load(str(run / f"model-{epoch:04d}.params"))
    return {k.split(":", 1)[1]: v.asnumpy() for k, v in arrays.items()}


def test_a_gluon_block_trains_with_its_own_names_and_initializers(tmp_path: Path) -> None:
    config = write_project(tmp_path)
    code, output = fit(config, "gluon", "fit.fixed_params=['*dense0_bias']")
    assert code == 0, output
    params = load(tmp_path / "runs/gluon", 3)
    assert "tagger0_embedding0_weight" in params and "tagger0_lstm0_l0_i2h_weight" in params
    # the block's own initializer, kept by a fixed parameter
    bias = params["tagger0_dense0_bias"]
    np.testing.assert_array_equal(bias, np.full_like(bias, 0.25))
    epochs = [
        r["eval"]["accuracy"]
        for r in map(json.loads, (tmp_path / "runs/gluon/metrics.jsonl").read_text().splitlines())
        if r["event"] == "epoch"
    ]
    assert epochs[-1] > 0.9, epochs  # the suffix decides the tag: learnable in 3 epochs

    # an initializer.overrides pattern wins over the block's own initializer
    code, output = fit(
        config,
        "zeroed",
        "fit.fixed_params=['*dense0_bias']",
        "initializer.overrides=[{pattern: '*dense0_bias', name: zero}]",
    )
    assert code == 0, output
    np.testing.assert_array_equal(load(tmp_path / "runs/zeroed", 3)["tagger0_dense0_bias"], 0)


def test_a_gluon_run_resumes_bit_identically_mid_epoch(tmp_path: Path) -> None:
    config = write_project(tmp_path)
    assert fit(config, "straight", "fit.max_updates=17", "fit.eval_interval=4")[0] == 0
    assert fit(config, "split", "fit.max_updates=9", "fit.eval_interval=4")[0] == 0
    result = CliRunner().invoke(
        cli, ["resume", str(tmp_path / "runs/split"), "--set", "fit.max_updates=17"]
    )
    assert result.exit_code == 0, result.output
    assert_same_ending(tmp_path / "runs/straight", tmp_path / "runs/split")


def test_a_gluon_run_exports_back_to_a_gluon_symbol_block(tmp_path: Path) -> None:
    config = write_project(tmp_path)
    assert fit(config, "gluon", "fit.num_epoch=1")[0] == 0
    run, out = tmp_path / "runs/gluon", tmp_path / "exported"
    result = CliRunner().invoke(cli, ["export", str(run), "-o", str(out), "--bucket", "8"])
    assert result.exit_code == 0, result.output
    sentence = ["kally", "boring", "mipness", "tusful", "zening", "kalness", "boring", "kally"]
    source = tmp_path / "in.conll"
    source.write_text("\n".join(sentence) + "\n\n", encoding="utf-8")
    raw = tmp_path / "raw.npz"
    result = CliRunner().invoke(
        cli,
        ["predict", "--checkpoint", str(run), "--input", str(source), "--output", str(raw),
         "--outputs", "raw"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    with np.load(raw) as archive:
        classes = archive["softmax_output"].shape[-1]
        expected = archive["softmax_output"].reshape(-1, classes)[:8]
    tokens = json.loads((run / "vocab.json").read_text())["tokens"]
    ids = mx.nd.array([[tokens.index(w) for w in sentence]])
    block = mx.gluon.SymbolBlock.imports(
        str(out / "model-bucket8-symbol.json"), ["data"], str(out / "model-bucket8-0000.params")
    )
    got = block(ids).asnumpy().reshape(-1, classes)
    chain = rnn_chain_roundings(
        8, 8, classes, num_embed=8, num_hidden=6, num_layers=1, directions=2
    )
    assert_close_at_scale(got, expected, roundings=chain)


def test_blocks_that_cannot_be_traced_are_named_with_the_reason(tmp_path: Path) -> None:
    config = write_project(tmp_path, model="blocks.py:untraceable")
    config.write_text(config.read_text().replace(", hidden: 6", ""))
    code, output = fit(config, "bad")
    assert code == ExitCode.CONFIG, output
    assert "the Gluon block Untraceable cannot be traced to a symbol: AttributeError" in output
    assert "asnumpy" in output and "Traceback" not in output
    config = write_project(tmp_path, model="blocks.py:not_hybrid")
    config.write_text(config.read_text().replace(", hidden: 6", ""))
    code, output = fit(config, "plain")
    assert code == ExitCode.CONFIG, output
    assert "returned the Gluon block Sequential, which is not a HybridBlock" in output
    assert not (tmp_path / "runs/bad").exists() and not (tmp_path / "runs/plain").exists()
