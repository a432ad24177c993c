"""optimizer.lr_mult / wd_mult end to end: `mxtrain fit` applies them, logs them, and names
the config line of a glob that matches no parameter."""

from __future__ import annotations

from pathlib import Path

import mxnet as mx
import numpy as np
from click.testing import CliRunner

from mxtrain.cli.main import cli

CONFIG = """\
experiment: {{name: {name}, seed: 1, runs_dir: {runs}}}
model: {{name: mlp, hidden: [6]}}
data:
  train: {{iterator: ndarray, source: rows.npz, batch_size: 8}}
optimizer:
  name: sgd
  learning_rate: 0.2
  wd: 0.01
{extra}
fit: {fit}
checkpoint: {{prefix: model}}
"""


def _config(folder: Path, name: str, extra: str = "", fit: str = "{num_epoch: 2}") -> Path:
    if not (folder / "rows.npz").exists():
        rng = np.random.default_rng(0)
        data = rng.normal(size=(48, 5)).astype("f4")
        np.savez(folder / "rows.npz", data=data, label=(data[:, 0] > 0).astype("f4"))
    path = folder / f"{name}.yaml"
    path.write_text(CONFIG.format(name=name, runs=folder / "runs", extra=extra, fit=fit))
    return path


def _fit(config: Path) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["fit", str(config), "--progress", "plain"])
    return result.exit_code, result.output


def _params(run: Path) -> dict[str, np.ndarray]:
    loaded = mx.nd.load(str(run / "model-0002.params"))
    return {k.split(":", 1)[1]: v.asnumpy() for k, v in loaded.items()}


def test_a_zero_rate_freezes_like_fixed_params_and_is_logged(tmp_path: Path) -> None:
    """lr_mult 0 on the first layer (with its weight decay off) trains exactly as freezing
    it with fit.fixed_params; a doubled rate on the output layer changes the result."""
    zero = "  lr_mult: {'fc1_*': 0}\n  wd_mult: {'fc1_weight': 0}"
    code, output = _fit(_config(tmp_path, "zero", zero))
    assert code == 0, output
    assert "learning-rate multipliers: fc1_weight x0, fc1_bias x0" in output
    assert "weight decay 0.01 on: pred_weight; not on: fc1_weight, fc1_bias, pred_bias" in output
    code, output = _fit(_config(tmp_path, "fixed", fit="{num_epoch: 2, fixed_params: [fc1_*]}"))
    assert code == 0, output
    code, output = _fit(_config(tmp_path, "double", "  lr_mult: {'pred_*': 2}"))
    assert code == 0, output
    zero_p, fixed_p = _params(tmp_path / "runs/zero"), _params(tmp_path / "runs/fixed")
    double_p = _params(tmp_path / "runs/double")
    assert sorted(zero_p) == sorted(fixed_p)
    for name in zero_p:
        np.testing.assert_allclose(zero_p[name], fixed_p[name], rtol=1e-6, atol=1e-7)
    assert not np.allclose(double_p["pred_weight"], fixed_p["pred_weight"])


def test_a_glob_matching_nothing_names_file_line_and_key(tmp_path: Path) -> None:
    config = _config(tmp_path, "bad", "  lr_mult:\n    embed_*: 0.1")
    code, output = _fit(config)
    assert code == 2, output
    assert f"{config}:10: optimizer.lr_mult: pattern 'embed_*' matches no parameter" in output
    assert "fc1_weight" in output and "Traceback" not in output
    assert not (tmp_path / "runs/bad/model-0001.params").exists()
    # the fixed config runs in the same place
    config.write_text(config.read_text().replace("embed_*", "pred_*"))
    code, output = _fit(config)
    assert code == 0, output
