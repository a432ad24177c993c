"""`mxtrain export` of a seq2seq run: the encoder and decoder-step graphs, loaded with plain
MXNet and decoded greedily step by step here, give what `mxtrain predict --beam-size 1`
gives; export.json says what to feed them; ONNX files of both graphs compute in onnxruntime
what MXNet computes."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import mxnet as mx
import numpy as np
import pytest
from click.testing import CliRunner
from float_bounds import FLOAT32_U, assert_close_at_scale
from onnx_helpers import run_onnx

from mxtrain.cli.main import cli

WORDS = list("abcdefg")
MODELS = {
    "rnn_seq2seq": "{name: rnn_seq2seq, num_embed: 8, num_hidden: 8, attention: mlp}",
    "transformer_seq2seq": "{name: transformer_seq2seq, model_size: 8, num_heads: 2, "
    "ffn_size: 16, num_layers: 1}",
}
CONFIG = """\
experiment: {{name: {name}, seed: 1, runs_dir: {runs}}}
model: {model}
data:
  train: {{iterator: parallel_text, source: train.src, target: train.tgt, batch_size: 8}}
optimizer: {{name: adam, learning_rate: 0.02}}
fit: {{num_epoch: 3, log_interval: 100}}
"""


def invoke(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result.exit_code, result.output


def write_pairs(folder: Path, name: str, count: int, seed: int) -> list[list[str]]:
    """Reversal pairs: the target is the source reversed."""
    rng = random.Random(seed)
    sources = [[rng.choice(WORDS) for _ in range(rng.randint(1, 7))] for _ in range(count)]
    (folder / f"{name}.src").write_text("".join(" ".join(s) + "\n" for s in sources))
    (folder / f"{name}.tgt").write_text("".join(" ".join(s[::-1]) + "\n" for s in sources))
    return sources


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A short run of each seq2seq model on the same pairs; tests only read them."""
    folder = tmp_path_factory.mktemp("seq2seq_export")
    write_pairs(folder, "train", 200, seed=1)
    made = {}
    for name, model in MODELS.items():
        config = folder / f"{name}.yaml"
        config.write_text(CONFIG.format(name=name, runs=folder / "runs", model=model))
        code, output = invoke("fit", config, "--progress", "quiet")
        assert code == 0, output
        made[name] = folder / "runs" / name
    return made


class ExportedGraph:
    """One exported graph bound by MXNet's Module from its files alone, batch of 1."""

    def __init__(self, folder: Path, entry: dict[str, Any]) -> None:
        self.entry = entry
        self.names = list(entry["inputs"])
        self.module = mx.mod.Module.load(str(folder / entry["prefix"]), 0,
                                         data_names=self.names, label_names=None)  # fmt: skip
        self.module.bind([(n, tuple(s)) for n, s in entry["inputs"].items()], for_training=False)

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The outputs by their role (export.json's output_roles)."""
        data = [mx.nd.array(inputs[n]) for n in self.names]
        self.module.forward(mx.io.DataBatch(data), is_train=False)
        outputs = [o.asnumpy() for o in self.module.get_outputs()]
        return dict(zip(self.entry["output_roles"], outputs, strict=True))


def load_graphs(folder: Path) -> tuple[dict[str, Any], dict[tuple[int, str], ExportedGraph]]:
    manifest = json.loads((folder / "export.json").read_text())
    graphs = {(g["source_length"], g["role"]): ExportedGraph(folder, g) for g in manifest["graphs"]}
    return manifest, graphs


def greedy(
    manifest: dict[str, Any], graphs: dict[tuple[int, str], ExportedGraph], ids: list[int]
) -> tuple[list[int], float]:
    """Decode one source with the exported graphs as export.json's ``decoding`` says: the
    smallest exported source length that holds it, greedy, pad and bos never chosen, at most
    ceil(2 L) + 10 tokens (predict's default limit) with eos counted."""
    feed = manifest["decoding"]
    length = min(s for s, _ in graphs if s >= len(ids))
    source = np.zeros((1, length), dtype=np.float32)
    source[0, : len(ids)] = ids
    carried = graphs[length, "encoder"]({"source": source})
    step = graphs[length, "decoder_step"]
    tokens, total, prev = [], 0.0, feed["bos_id"]
    for t in range(math.ceil(2 * len(ids)) + 10):
        inputs = {"prev_token": np.array([prev], "f4"), "step": np.array([t], "f4"), **carried}
        outputs = step(inputs)
        log_probs = outputs.pop("log_probs")[0].astype(np.float64)
        log_probs[[feed["pad_id"], feed["bos_id"]]] = -np.inf
        prev = int(np.argmax(log_probs))
        total += float(log_probs[prev])
        if prev == feed["eos_id"]:
            break
        tokens.append(prev)
        carried.update(outputs)  # the new states
    return tokens, total


@pytest.mark.parametrize("model", sorted(MODELS))
def test_greedy_decoding_of_the_exported_graphs_equals_predict_beam_1(
    model: str, runs: dict[str, Path], tmp_path: Path
) -> None:
    run = runs[model]
    out = tmp_path / "exported"
    code, output = invoke("export", run, "-o", out, "--all-buckets")
    assert code == 0, output
    assert f"{out / 'encoder-source7'}: inputs source (1, 7) -> outputs" in output
    assert (out / "vocab.json").is_file() and (out / "target_vocab.json").is_file()
    manifest, graphs = load_graphs(out)
    trained = json.loads((run / "model_inputs.json").read_text())["buckets"]
    assert {s for s, _ in graphs} == {s for s, _ in trained}
    assert {g["max_steps"] for g in manifest["graphs"] if g["source_length"] == 7} == {24}
    feed = manifest["decoding"]
    states = feed["state_names"]
    for (_, role), graph in graphs.items():
        if role == "decoder_step":
            assert set(graph.names) == {"prev_token", "step", *feed["static_names"], *states}
            assert graph.entry["output_roles"] == ["log_probs", *states]
        else:
            assert graph.entry["output_roles"] == [*feed["static_names"], *states]
    # the same sources through predict, each alone (batch of 1: the exported shapes)
    sources = write_pairs(tmp_path, "test", 12, seed=5)
    code, output = invoke("predict", "--checkpoint", run, "--input", tmp_path / "test.src",
                          "--output", tmp_path / "out.jsonl", "--beam-size", "1",
                          "--batch-size", "1")  # fmt: skip
    assert code == 0, output
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert any(r["output"] for r in records)  # some outputs are decoded past the first step
    source_vocab = json.loads((out / "vocab.json").read_text())["tokens"]
    target_vocab = json.loads((out / "target_vocab.json").read_text())["tokens"]
    for words, record in zip(sources, records, strict=True):
        tokens, log_prob = greedy(manifest, graphs, [source_vocab.index(w) for w in words])
        # the same graphs, shapes and parameters as predict's: the same kernels, the same
        # choice at every step
        assert " ".join(target_vocab[t] for t in tokens) == record["output"], words
        # each step's log-softmax over V rounds along ~2 V terms; the sum over the steps
        bound = (len(tokens) + 1) * 4 * len(target_vocab) * FLOAT32_U * (1 + abs(log_prob))
        assert abs(log_prob - record["log_prob"]) <= bound


def test_bucket_picks_source_lengths_and_max_steps_sizes_the_transformer_caches(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "t"
    code, output = invoke("export", runs["transformer_seq2seq"], "-o", out, "--bucket", "4",
                          "--max-steps", "9", "--batch-size", "3")  # fmt: skip
    assert code == 0, output
    manifest = json.loads((out / "export.json").read_text())
    assert [g["prefix"] for g in manifest["graphs"]] == ["encoder-source4", "decoder_step-source4"]
    step = manifest["graphs"][1]
    assert step["inputs"]["self_keys_0"] == [3, 2, 9, 4]  # (N, heads, max_steps, head size)
    assert step["inputs"]["cross_keys_0"] == [3, 2, 4, 4]  # (N, heads, S, head size)
    assert step["outputs"]["log_probs_output"][0] == 3
    code, output = invoke("export", runs["rnn_seq2seq"], "-o", tmp_path / "x", "--max-steps", 0)
    assert code == 2 and "--max-steps" in output


def attention_roundings(length: int, width: int, classes: int) -> int:
    """Roundings along the longest chain of an encoder (a bidirectional recurrent layer over
    ``length`` positions, or a layer of attention: dots over ``width``, a softmax over
    ``length``) and one decoder step (a recurrent or self-attention layer, attention over
    the ``length`` source positions, the output layer and its log-softmax over ``classes``):
    each piece's dot products and softmax sums, generously counted per position."""
    encoder = 2 * length * (5 * width + 5)
    step = (5 * width + 5) + 2 * length * width + 2 * width + 2 * classes
    return encoder + step


@pytest.mark.parametrize("model", sorted(MODELS))
def test_onnx_encoder_and_step_compute_in_onnxruntime_what_mxnet_computes(
    model: str, runs: dict[str, Path], onnxruntime_python: Path, tmp_path: Path
) -> None:
    pytest.importorskip("onnx", reason="the onnx package is a test extra: pip install -e '.[test]'")
    run = runs[model]
    code, output = invoke("export", run, "-o", tmp_path / "onnx", "--format", "onnx")
    assert code == 0, output
    assert invoke("export", run, "-o", tmp_path / "mxnet")[0] == 0
    _, graphs = load_graphs(tmp_path / "mxnet")
    onnx_graphs = {g["role"]: g for g in json.loads((tmp_path / "onnx/export.json").read_text())
                   ["graphs"]}  # fmt: skip
    source = np.array([[4, 5, 6, 7, 0, 0, 0]], dtype="f4")
    want = graphs[7, "encoder"]({"source": source})
    roles = onnx_graphs["encoder"]["onnx_output_roles"]
    got = run_onnx(onnxruntime_python, tmp_path / "onnx/encoder-source7.onnx",
                   {"source": source}, tmp_path)  # fmt: skip
    classes = len(json.loads((run / "target_vocab.json").read_text())["tokens"])
    chain = attention_roundings(7, 16, classes)
    for role, array in zip(roles, got, strict=True):
        assert_close_at_scale(array, want[role], roundings=chain, err_msg=role)
    # a step from the third position on, fed MXNet's encoder outputs
    inputs = {"prev_token": np.array([5], "f4"), "step": np.array([2], "f4"), **want}
    expected = graphs[7, "decoder_step"](inputs)
    feed = {n: inputs[n] for n in onnx_graphs["decoder_step"]["inputs"]}
    got = run_onnx(onnxruntime_python, tmp_path / "onnx/decoder_step-source7.onnx", feed, tmp_path)
    for role, array in zip(onnx_graphs["decoder_step"]["onnx_output_roles"], got, strict=True):
        assert_close_at_scale(array, expected[role], roundings=chain, err_msg=role)
