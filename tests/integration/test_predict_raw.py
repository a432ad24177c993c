"""`mxtrain predict --outputs raw` for row models: a classifier's raw softmax equals its
records' probabilities, on one device or two, as .npz or .npy; a plugin model's several
outputs all arrive; what .npy cannot hold is refused before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from mxtrain.cli.main import cli
from mxtrain.errors import ConfigError
from mxtrain.inference.raw import _check_one_array

PLUGIN = '''
import mxnet as mx


def two_heads(data_info):
    """A classifier that also outputs its hidden layer (gradient blocked)."""
    def sym_gen(key):
        x = mx.sym.Variable("data")
        y = mx.sym.Variable("softmax_label")
        hidden = mx.sym.Activation(mx.sym.FullyConnected(x, num_hidden=3, name="fc1"), "tanh")
        out = mx.sym.FullyConnected(hidden, num_hidden=data_info.num_classes, name="fc2")
        softmax = mx.sym.SoftmaxOutput(out, y, name="softmax")
        return mx.sym.Group([softmax, mx.sym.BlockGrad(hidden, name="hidden")]), ("data",), (
            "softmax_label",
        )

    return sym_gen
'''

CONFIG = """\
experiment: {{name: {name}, seed: 1, runs_dir: {runs}}}
model: {{name: {model}}}
data:
  train: {{iterator: ndarray, source: rows.npz, batch_size: 8}}
optimizer: {{name: sgd, learning_rate: 0.2}}
fit: {{num_epoch: 1, metrics: [accuracy]}}
checkpoint: {{prefix: model}}
"""


def _invoke(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("raw")
    rng = np.random.default_rng(0)
    data = rng.normal(size=(45, 5)).astype("f4")
    np.savez(folder / "rows.npz", data=data, label=(data[:, 0] > 0).astype("f4"))
    np.save(folder / "new.npy", rng.normal(size=(13, 5)).astype("f4"))
    (folder / "plug.py").write_text(PLUGIN)
    for name, model in (("mlp", "mlp, hidden: [4]"), ("heads", "plug.py:two_heads")):
        config = folder / f"{name}.yaml"
        config.write_text(CONFIG.format(name=name, runs=folder / "runs", model=model))
        code, output = _invoke("fit", config)
        assert code == 0, output
    return folder


def test_raw_softmax_equals_the_records_probabilities(runs: Path) -> None:
    run, rows = runs / "runs/mlp", runs / "new.npy"
    code, output = _invoke("predict", "--checkpoint", run, "--input", rows,
                           "--output", runs / "rec.jsonl")  # fmt: skip
    assert code == 0, output
    records = [json.loads(line) for line in (runs / "rec.jsonl").read_text().splitlines()]
    expected = np.array([r["probabilities"] for r in records])
    for fmt, extra in (("npz", ()), ("npy", ()), ("npz", ("--set", "context.count=2"))):
        out = runs / f"raw.{fmt}"
        code, output = _invoke("predict", "--checkpoint", run, "--input", rows, "--output", out,
                               "--outputs", "raw", "--format", fmt, "--batch-size", "5",
                               "--force", *extra)  # fmt: skip
        assert code == 0, output
        assert "wrote the raw outputs of 13 inputs (0 without a prediction)" in output
        if fmt == "npy":
            got = np.load(out)
        else:
            with np.load(out) as archive:
                got = archive["softmax_output"]
                assert archive["predicted"].all()
                assert (archive["softmax_output.shape"] == [2]).all()
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)


def test_every_output_of_a_plugin_model_arrives(runs: Path) -> None:
    out = runs / "heads.npz"
    code, output = _invoke("predict", "--checkpoint", runs / "runs/heads", "--input",
                           runs / "new.npy", "--output", out, "--outputs", "raw")  # fmt: skip
    assert code == 0, output
    with np.load(out) as archive:
        assert archive["softmax_output"].shape == (13, 2)
        hidden = archive["hidden_output"]
    assert hidden.shape == (13, 3) and (np.abs(hidden) <= 1).all()  # tanh
    code, output = _invoke("predict", "--checkpoint", runs / "runs/heads", "--input",
                           runs / "new.npy", "--output", runs / "heads.npy", "--outputs", "raw",
                           "--format", "npy")  # fmt: skip
    assert code == 2 and "2 outputs (softmax_output, hidden_output)" in output
    assert "--format npz" in output and "Traceback" not in output
    assert not (runs / "heads.npy").exists()


def test_npy_refuses_ragged_rows_and_gaps() -> None:
    one = {"out": (Path("unused"), np.array([[3, 2], [3, 2]]))}
    _check_one_array(["out"], one, np.array([True, True]))  # same shapes, all predicted
    with pytest.raises(ConfigError, match="--format npz"):
        _check_one_array(["out"], {"out": (Path("x"), np.array([[3, 2], [5, 2]]))},
                         np.array([True, True]))  # fmt: skip
    with pytest.raises(ConfigError, match="without a prediction"):
        _check_one_array(["out"], one, np.array([True, False]))
