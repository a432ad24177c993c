"""A model that cannot be built for its data is named as such, not as fit.fixed_params."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from click.testing import CliRunner

from mxtrain.cli.main import cli

PLUGIN = '''
import mxnet as mx


def named_input(data_info, input_name="features"):
    """A linear classifier whose input Variable is called ``input_name``."""
    def sym_gen(key):
        x = mx.sym.Variable(input_name)
        y = mx.sym.Variable("softmax_label")
        h = mx.sym.FullyConnected(x, num_hidden=data_info.num_classes, name="fc")
        return mx.sym.SoftmaxOutput(h, y, name="softmax"), (input_name,), ("softmax_label",)

    return sym_gen


def buggy(data_info):
    """A plugin whose sym_gen has a bug of its own (a KeyError)."""
    def sym_gen(key):
        return {}["missing"]

    return sym_gen
'''

CONFIG = """\
experiment: {{name: build, seed: 1, runs_dir: {runs}}}
model: {model}
data:
  train: {{iterator: ndarray, source: {source}, batch_size: 8}}
fit: {fit}
checkpoint: {{prefix: model}}
"""


def invoke(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result.exit_code, result.output


def setup(folder: Path, model: str, shape: tuple[int, ...] = (4,), fit: str = "{num_epoch: 1}"):
    rng = np.random.default_rng(0)
    labels = np.arange(32) % 2
    np.savez(folder / "rows.npz", data=rng.normal(size=(32, *shape)).astype("f4"), label=labels)
    np.save(folder / "in.npy", rng.normal(size=(3, *shape)).astype("f4"))
    (folder / "plug.py").write_text(PLUGIN)
    config = folder / "build.yaml"
    config.write_text(CONFIG.format(runs=folder / "runs", model=model, source="rows.npz", fit=fit))
    return config


def test_plugin_data_name_mismatch_names_the_plugin_and_the_iterator(tmp_path: Path) -> None:
    config = setup(tmp_path, "{name: plug.py:named_input}")
    code, output = invoke("fit", config)
    assert code == 2, output
    assert "model: the model 'plug.py:named_input' (plugin file" in output
    assert str(tmp_path / "plug.py") in output
    assert "data.train (data (8, 4); labels softmax_label (8,))" in output
    assert "['features']" in output and "data_names" in output and "data_name" in output
    assert "fixed_params" not in output and "Traceback" not in output
    # Nothing is left behind that blocks the fixed config.
    config.write_text(config.read_text().replace("plug.py:named_input}", "mlp, hidden: [4]}"))
    code, output = invoke("fit", config)
    assert code == 0, output


def test_fixed_params_pattern_that_matches_nothing_is_named_fixed_params(tmp_path: Path) -> None:
    config = setup(tmp_path, "{name: mlp, hidden: [4]}", fit="{num_epoch: 1, fixed_params: [x*]}")
    code, output = invoke("fit", config)
    assert code == 2, output
    assert "build.yaml:5: fit.fixed_params:" in output and "'x*' matches no parameter" in output
    assert "Traceback" not in output
    config.write_text(config.read_text().replace("fixed_params: [x*]", "fixed_params: [fc*]"))
    config.write_text(
        config.read_text().replace("}\ncheckpoint", ", fixed_params_exclude: [q]}\ncheckpoint")
    )
    code, output = invoke("fit", config)
    assert code == 2, output
    assert (
        "build.yaml:5: fit.fixed_params_exclude:" in output and "'q' matches no parameter" in output
    )


def test_lenet_on_images_too_small_for_its_layers_names_model_and_shape(tmp_path: Path) -> None:
    """3x2x200 images pass lenet's own shape check, but pooling needs 2 rows after conv1."""
    config = setup(tmp_path, "{name: lenet}", shape=(3, 2, 200))
    code, output = invoke("fit", config)
    assert code == 2, output
    assert "model: the model 'lenet' cannot be built" in output
    assert "data (8, 3, 2, 200)" in output
    assert "operator pool2: kernel size (2) exceeds input" in output
    assert "change the model section's options" in output
    assert "fixed_params" not in output and "Traceback" not in output


def test_predict_with_mismatched_data_name_names_model_and_section(tmp_path: Path) -> None:
    config = setup(tmp_path, "{name: plug.py:named_input, input_name: data}")
    code, output = invoke("fit", config)
    assert code == 0, output
    code, output = invoke(
        "predict", "--checkpoint", tmp_path / "runs" / "build", "--input", tmp_path / "in.npy",
        "--output", tmp_path / "out.jsonl", "--set", "data.train.data_name=features",
    )  # fmt: skip
    assert code == 2, output
    assert "model: the model 'plug.py:named_input' (plugin file" in output
    assert "(features (8, 4);" in output and "['data']" in output
    assert "cannot build the model for inference" not in output and "Traceback" not in output
    assert not (tmp_path / "out.jsonl").exists()


def test_a_bug_in_a_plugin_model_names_the_plugin_not_mxtrain(tmp_path: Path) -> None:
    """Any exception a plugin's own code raises while the model is built is the plugin's:
    exit 2 naming the plugin file and the exception, not an internal error of mxtrain's."""
    config = setup(tmp_path, "{name: plug.py:buggy}")
    code, output = invoke("fit", config)
    assert code == 2, output
    assert "model: the model 'plug.py:buggy' (plugin file" in output
    assert "KeyError: 'missing'" in output and "--debug" in output
    assert "internal error" not in output and "Traceback" not in output
    assert not (tmp_path / "runs" / "build").exists()
