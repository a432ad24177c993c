"""`mxtrain export --format onnx`: onnxruntime computes what mxtrain computes (it runs in
an environment of its own: tests/onnx_helpers.py), unsupported operators are named before
anything is written, and `mxtrain list`'s export column tells the truth about every
built-in model."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import mxnet as mx
import numpy as np
import pytest
from click.testing import CliRunner
from conftest import TINY_CONFIG, write_corpus
from float_bounds import assert_close_at_scale, rnn_chain_roundings
from onnx_helpers import run_onnx

from mxtrain.build import build_sym_gen
from mxtrain.cli.main import cli
from mxtrain.config import load_config, parse_config
from mxtrain.data.array_options import ArrayDataInfo
from mxtrain.data.base import DataInfo, Seq2SeqInfo
from mxtrain.fit.new_run import fit_experiment
from mxtrain.inference.export import (
    _onnx_ready,
    inference_symbol,
    unsupported_operators,
    write_onnx,
)
from mxtrain.registry import DECODING_MODELS, GLUON_MODEL, MODEL_EXPORTS, MODELS

pytest.importorskip("onnx", reason="the onnx package is a test extra: pip install -e '.[test]'")


def invoke(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("onnx_lm")
    write_corpus(folder / "train.txt", 120, seed=1)
    write_corpus(folder / "valid.txt", 30, seed=2)
    config = folder / "tiny.yaml"
    text = textwrap.dedent(TINY_CONFIG.format(runs_dir=folder / "runs"))
    config.write_text(text.replace("cell: unfused", "cell: fused"))
    return fit_experiment(load_config(config)).run.path


def test_onnxruntime_computes_what_mxtrain_computes(
    lm_run: Path, onnxruntime_python: Path, tmp_path: Path
) -> None:
    out, ref = tmp_path / "onnx", tmp_path / "mxnet"
    args = ("--bucket", "9", "--batch-size", "3")
    code, output = invoke("export", f"{lm_run}:best", "-o", out, "--format", "onnx", *args)
    assert code == 0, output
    assert f"{out / 'model-bucket9.onnx'}: inputs data (3, 9)" in output
    assert json.loads((out / "export.json").read_text())["graphs"][0]["onnx_outputs"]
    assert invoke("export", f"{lm_run}:best", "-o", ref, *args)[0] == 0
    ids = np.random.default_rng(0).integers(1, 10, (3, 9)).astype("f4")
    module = mx.mod.Module.load(str(ref / "model-bucket9"), 0, label_names=None)
    module.bind([("data", ids.shape)], for_training=False)
    module.forward(mx.io.DataBatch([mx.nd.array(ids)]), is_train=False)
    (got,) = run_onnx(onnxruntime_python, out / "model-bucket9.onnx", {"data": ids}, tmp_path)
    # onnxruntime's own kernels and summation orders: the forward chain's roundings (its
    # approximated sigmoid and tanh counted as a few each), at the outputs' scale
    chain = rnn_chain_roundings(9, 3, got.shape[-1], num_embed=8, num_hidden=12, num_layers=1)
    assert_close_at_scale(got, module.get_outputs()[0].asnumpy(), roundings=chain)


def test_a_tagger_with_padding_runs_in_onnxruntime(
    onnxruntime_python: Path, tmp_path: Path
) -> None:
    """The fine-tuning README's last step: a bidirectional tagger (sequence lengths from the
    padding) exported to ONNX labels padded sentences as mxtrain predict does."""
    train = tmp_path / "train.conll"
    train.write_text("the DET\ncat NOUN\nsat VERB\n\nthe DET\ndog NOUN\n\n" * 20)
    config = tmp_path / "tagger.yaml"
    config.write_text(
        f"experiment: {{name: tagger, runs_dir: {tmp_path / 'runs'}}}\n"
        "model: {name: rnn_tagger, num_embed: 4, num_hidden: 4, bidirectional: true}\n"
        "data: {train: {iterator: tagged_sequences, source: train.conll, batch_size: 4,"
        " buckets: [4]}}\n"
        "fit: {num_epoch: 2}\n"
    )
    code, output = invoke("fit", config)
    assert code == 0, output
    out = tmp_path / "onnx"
    code, output = invoke("export", tmp_path / "runs/tagger", "-o", out, "--format", "onnx",
                          "--batch-size", "2")  # fmt: skip
    assert code == 0, output
    tokens = json.loads((tmp_path / "runs/tagger/vocab.json").read_text())["tokens"]
    ids = np.array([[tokens.index(w) for w in ("the", "cat", "sat")] + [0],
                    [tokens.index(w) for w in ("the", "dog")] + [0, 0]], dtype="f4")  # fmt: skip
    (got,) = run_onnx(onnxruntime_python, out / "model-bucket4.onnx", {"data": ids}, tmp_path)
    source = tmp_path / "in.conll"
    source.write_text("the\ncat\nsat\n\nthe\ndog\n\n")
    code, output = invoke("predict", "--checkpoint", tmp_path / "runs/tagger", "--input",
                          source, "--output", tmp_path / "raw.npz", "--outputs", "raw")  # fmt: skip
    assert code == 0, output
    with np.load(tmp_path / "raw.npz") as archive:
        expected = archive["softmax_output"]
    got = got.reshape(2, 4, -1)
    # onnxruntime against MXNet: the bidirectional forward chain, at the outputs' scale
    chain = rnn_chain_roundings(4, 2, got.shape[-1], num_embed=4, num_hidden=4, num_layers=1,
                                directions=2)  # fmt: skip
    assert_close_at_scale(got[0, :3], expected[0, :3], roundings=chain)
    assert_close_at_scale(got[1, :2], expected[1, :2], roundings=chain)


PLUGIN = """
import mxnet as mx


def gated(data_info):
    def sym_gen(key):
        x = mx.sym.Variable("data")
        x = x * (x != 0)  # _not_equal_scalar: no ONNX conversion in MXNet 1.9.1
        out = mx.sym.FullyConnected(x, num_hidden=data_info.num_classes, name="fc")
        label = mx.sym.Variable("softmax_label")
        return mx.sym.SoftmaxOutput(out, label, name="softmax"), ("data",), ("softmax_label",)

    return sym_gen
"""


def test_unsupported_operators_are_named_and_nothing_is_written(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    data = rng.normal(size=(24, 5)).astype("f4")
    np.savez(tmp_path / "rows.npz", data=data, label=(data[:, 0] > 0).astype("f4"))
    (tmp_path / "plug.py").write_text(PLUGIN)
    config = tmp_path / "gated.yaml"
    config.write_text(
        f"experiment: {{name: gated, runs_dir: {tmp_path / 'runs'}}}\n"
        "model: {name: plug.py:gated}\n"
        "data: {train: {iterator: ndarray, source: rows.npz, batch_size: 8}}\n"
        "fit: {num_epoch: 1}\n"
    )
    assert invoke("fit", config)[0] == 0
    code, output = invoke(
        "export", tmp_path / "runs/gated", "-o", tmp_path / "x", "--format", "onnx"
    )
    assert code == 2 and "cannot convert the operator(s) _not_equal_scalar" in output
    assert "--format mxnet" in output and "Traceback" not in output
    assert not (tmp_path / "x").exists()
    assert invoke("export", tmp_path / "runs/gated", "-o", tmp_path / "y")[0] == 0  # mxnet
    # --max-steps sizes a seq2seq decoder step: refused for a model without one
    code, output = invoke("export", tmp_path / "runs/gated", "-o", tmp_path / "z", "--max-steps", 5)
    assert code == 2 and "--max-steps" in output and not (tmp_path / "z").exists()


def _toy(name: str) -> tuple[Any, Any]:
    """(data_info, bucket key) to build a built-in model with."""
    lm = DataInfo(vocab_size=30, num_classes=30, pad_id=0, task="lm")
    rows: dict[str, Any] = {"num_classes": 3, "pad_id": -1, "task": "classify"}
    return {
        "lstm_lm": (lm, 7),
        "gru_lm": (lm, 7),
        "rnn_tagger": (DataInfo(vocab_size=30, num_classes=5, pad_id=0, task="tag"), 7),
        "rnn_seq2seq": (Seq2SeqInfo(vocab_size=30, num_classes=20, pad_id=0), (7, 5)),
        "transformer_seq2seq": (Seq2SeqInfo(vocab_size=30, num_classes=20, pad_id=0), (7, 5)),
        "mlp": (ArrayDataInfo(**rows, feature_shape=(5,)), (5,)),
        "lenet": (ArrayDataInfo(**rows, feature_shape=(1, 28, 28)), (1, 28, 28)),
        "rnn_classifier": (
            ArrayDataInfo(**rows, vocab_size=30, feature_shape=(7,), integer_data=True),
            (7,),
        ),
    }[name]


@pytest.mark.parametrize(
    "name", sorted(e.name for e in MODELS.entries() if e.name != GLUON_MODEL)
)  # the gluon model's operators are the block's (tests/integration/test_gluon_models.py)
def test_list_says_truly_which_models_export_to_onnx(name: str, tmp_path: Path) -> None:
    info, key = _toy(name)
    reader = "parallel_text, target: y" if name in DECODING_MODELS else "bucket_sentence"
    data = f"{{train: {{iterator: {reader}, source: x}}}}"
    config = parse_config(
        f"model: {{name: {name}}}\ndata: {data}\n", source="x.yaml", base_dir=Path(".")
    )
    sym_gen = build_sym_gen(config.model, info, Path("."))
    if name in DECODING_MODELS:  # export writes the encoder and the decoder step: converted
        assert MODEL_EXPORTS[name] == "mxnet, onnx"
        converts_both_decoder_graphs(sym_gen, key[0], tmp_path)
        return
    symbol, _, labels = sym_gen(key)
    graph, _ = inference_symbol(symbol, list(labels))
    missing = unsupported_operators(_onnx_ready(graph))
    expected = "mxnet, onnx" if not missing else f"mxnet (onnx: no {', '.join(missing)})"
    assert MODEL_EXPORTS[name] == expected


def converts_both_decoder_graphs(sym_gen: Any, length: int, folder: Path) -> None:
    """The encoder and decoder-step graphs of ``sym_gen`` written by MXNet's ONNX exporter
    (any parameter values: conversion reads their shapes)."""
    steps, batch = 11, 2
    graphs = {
        "encoder": (sym_gen.encoder(length, steps), {"source": (batch, length)}),
        "decoder_step": (sym_gen.decoder_step(length, steps),
                         sym_gen.input_shapes(length, batch, steps)),
    }  # fmt: skip
    for role, (graph, shapes) in graphs.items():
        arg_shapes, _, aux_shapes = graph.infer_shape(**shapes)
        params = {n: mx.nd.ones(s) for n, s in zip(graph.list_arguments(), arg_shapes, strict=True)
                  if n not in shapes}  # fmt: skip
        params.update(zip(graph.list_auxiliary_states(), map(mx.nd.ones, aux_shapes), strict=True))
        inputs = {n: list(s) for n, s in shapes.items()}
        assert write_onnx(graph, params, inputs, folder / f"{role}.onnx"), role
