"""`mxtrain export`: the inference graph loads in MXNet's Module and Gluon's SymbolBlock
without mxtrain's help and computes what `mxtrain predict --outputs raw` computes."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest
from click.testing import CliRunner
from conftest import TINY_CONFIG, WORDS, write_corpus
from float_bounds import assert_close_at_scale, mlp_chain_roundings, rnn_chain_roundings

from mxtrain.cli.main import cli
from mxtrain.config import load_config
from mxtrain.fit.new_run import fit_experiment


def invoke(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("export")
    write_corpus(folder / "train.txt", 120, seed=1)
    write_corpus(folder / "valid.txt", 30, seed=2)
    config = folder / "tiny.yaml"
    config.write_text(textwrap.dedent(TINY_CONFIG.format(runs_dir=folder / "runs")))
    # a loss with a training-only output, whatever this machine would measure fastest
    return fit_experiment(load_config(config, ["model.loss=softmax"])).run.path


def nine_word_lines(n: int) -> list[str]:
    rng = np.random.default_rng(3)
    return [" ".join(rng.choice(WORDS, 9)) for _ in range(n)]


def test_exported_lm_equals_predict_raw_in_module_and_gluon(lm_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "exported"
    code, output = invoke("export", f"{lm_run}:best", "-o", out, "--bucket", "9")
    assert code == 0, output
    assert "inputs data (1, 9) -> outputs softmax_output (9, " in output
    assert "left out (training only): nll_output" in output
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["graphs"][0]["prefix"] == "model-bucket9"
    assert (out / "vocab.json").is_file()
    # the same lines through predict --outputs raw
    lines = nine_word_lines(6)
    source = tmp_path / "in.txt"
    source.write_text("".join(f"{line}\n" for line in lines))
    code, output = invoke("predict", "--checkpoint", f"{lm_run}:best", "--input", source,
                          "--output", tmp_path / "raw.npz", "--outputs", "raw")  # fmt: skip
    assert code == 0, output
    with np.load(tmp_path / "raw.npz") as archive:
        expected = archive["softmax_output"][:, :9]
    tokens = json.loads((lm_run / "vocab.json").read_text())["tokens"]
    ids = np.array([[tokens.index(w) for w in line.split()] for line in lines], dtype="f4")
    # Module, from the files alone
    module = mx.mod.Module.load(str(out / "model-bucket9"), 0, data_names=["data"],
                                label_names=None)  # fmt: skip
    module.bind([("data", ids.shape)], for_training=False)
    module.forward(mx.io.DataBatch([mx.nd.array(ids)]), is_train=False)
    got = module.get_outputs()[0].asnumpy().reshape(len(lines), 9, -1)
    # predict ran these lines in its own bucket and batch shape: other kernel blockings, so
    # the forward chain's roundings over the longest bucket (13), at the outputs' scale
    chain = rnn_chain_roundings(13, len(lines), expected.shape[-1], num_embed=8, num_hidden=12,
                                num_layers=1)  # fmt: skip
    assert_close_at_scale(got, expected, roundings=chain)
    # Gluon's SymbolBlock
    block = mx.gluon.SymbolBlock.imports(
        str(out / "model-bucket9-symbol.json"), ["data"], str(out / "model-bucket9-0000.params")
    )
    got = block(mx.nd.array(ids)).asnumpy().reshape(len(lines), 9, -1)
    assert_close_at_scale(got, expected, roundings=chain)


def test_every_bucket_and_refusals(lm_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "all"
    code, output = invoke("export", lm_run, "-o", out, "--all-buckets", "--json")
    assert code == 0, output
    graphs = json.loads(output)["graphs"]
    assert [g["bucket_key"] for g in graphs] == [5, 9, 13]
    assert all(g["inputs"] == {"data": [1, g["bucket_key"]]} for g in graphs)
    code, output = invoke("export", lm_run, "-o", out)
    assert code == 2 and "is not empty" in output and "--force" in output
    code, output = invoke("export", lm_run, "-o", tmp_path / "x", "--bucket", "5", "--all-buckets")
    assert code == 2 and "not both" in output
    (lm_run.parent / "old").mkdir()
    for name in ("config.yaml", "run.json"):
        (lm_run.parent / "old" / name).write_bytes((lm_run / name).read_bytes())
    code, output = invoke("export", lm_run.parent / "old", "-o", tmp_path / "y")
    assert code != 0 and "model_inputs.json" in output and "Traceback" not in output
    (lm_run.parent / "broken").mkdir()
    for name in ("config.yaml", "run.json", "model_inputs.json", "model-symbol.json"):
        (lm_run.parent / "broken" / name).write_bytes((lm_run / name).read_bytes())
    (lm_run.parent / "broken" / "model-0001.params").write_bytes(b"not a params file")
    code, output = invoke("export", lm_run.parent / "broken", "-o", tmp_path / "z")
    assert code != 0 and "model-0001.params" in output, output
    assert "Traceback" not in output and not (tmp_path / "z").exists()


def test_a_classifier_exports_its_softmax_without_the_label(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    data = rng.normal(size=(40, 5)).astype("f4")
    np.savez(tmp_path / "rows.npz", data=data, label=(data[:, 0] > 0).astype("f4"))
    config = tmp_path / "mlp.yaml"
    config.write_text(
        f"experiment: {{name: mlp, runs_dir: {tmp_path / 'runs'}}}\n"
        "model: {name: mlp, hidden: [4]}\n"
        "data: {train: {iterator: ndarray, source: rows.npz, batch_size: 8}}\n"
        "fit: {num_epoch: 2}\n"
    )
    assert invoke("fit", config)[0] == 0
    run, out = tmp_path / "runs/mlp", tmp_path / "out"
    code, output = invoke("export", run, "-o", out, "--batch-size", "4")
    assert code == 0, output
    graph = json.loads((out / "export.json").read_text())["graphs"][0]
    symbol = mx.sym.load(str(out / f"{graph['prefix']}-symbol.json"))
    assert "softmax_label" not in symbol.list_arguments()
    assert graph["inputs"] == {"data": [4, 5]} and graph["outputs"]["softmax_output"] == [4, 2]
    np.save(tmp_path / "new.npy", data[:7])
    invoke("predict", "--checkpoint", run, "--input", tmp_path / "new.npy", "--output",
           tmp_path / "raw.npy", "--outputs", "raw", "--format", "npy")  # fmt: skip
    module = mx.mod.Module.load(str(out / graph["prefix"]), 0, label_names=None)
    module.bind([("data", (7, 5))], for_training=False)
    module.forward(mx.io.DataBatch([mx.nd.array(data[:7])]), is_train=False)
    # predict's batches are not 7 rows: the perceptron's forward chain, at the outputs' scale
    assert_close_at_scale(module.get_outputs()[0].asnumpy(), np.load(tmp_path / "raw.npy"),
                          roundings=mlp_chain_roundings(5, [4], 2, 7))  # fmt: skip
