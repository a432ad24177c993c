"""fit.eval_metrics end to end: training logs fit.metrics, evaluations (epoch ends,
eval_interval, `mxtrain score`) log fit.eval_metrics, and best_metric watches those."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from mxtrain.cli.main import cli
from mxtrain.run.folder import read_metrics

CONFIG = """\
experiment: {{name: em, seed: 1, runs_dir: {runs}}}
model: {{name: mlp, hidden: [6]}}
data:
  train: {{iterator: ndarray, source: rows.npz, batch_size: 8}}
  eval: {{iterator: ndarray, source: rows.npz, batch_size: 8, shuffle: false}}
optimizer: {{name: sgd, learning_rate: 0.2}}
fit:
  num_epoch: 2
  eval_interval: 3
  log_interval: 2
  metrics: [cross_entropy]
  eval_metrics: [accuracy, "mxnet.metric:F1"]
checkpoint: {{prefix: model, best_metric: {best}}}
"""


def _invoke(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result.exit_code, result.output


def _config(folder: Path, best: str = "accuracy") -> Path:
    rng = np.random.default_rng(0)
    data = rng.normal(size=(48, 5)).astype("f4")
    np.savez(folder / "rows.npz", data=data, label=(data[:, 0] > 0).astype("f4"))
    path = folder / "em.yaml"
    path.write_text(CONFIG.format(runs=folder / "runs", best=best))
    return path


def test_training_and_evaluations_log_their_own_metrics(tmp_path: Path) -> None:
    code, output = _invoke("fit", _config(tmp_path), "--progress", "plain")
    assert code == 0, output
    records = read_metrics(tmp_path / "runs/em/metrics.jsonl")
    intervals = [r for r in records if r["event"] == "interval"]
    evals = [r for r in records if r["event"] == "eval"]
    epochs = [r for r in records if r["event"] == "epoch"]
    assert intervals and evals and len(epochs) == 2
    assert all(set(r["train"]) <= {"cross_entropy", "grad_norm"} for r in intervals)
    for record in [*evals, *epochs]:
        assert set(record["eval"]) == {"accuracy", "mxnet.metric:F1"}, record
    assert all(set(r["train"]) == {"cross_entropy"} for r in epochs)
    # score uses the evaluation metrics too, and agrees with the logged epoch
    code, output = _invoke("score", tmp_path / "runs/em:2", "--json")
    assert code == 0, output
    scored = json.loads(output.strip().splitlines()[-1])["metrics"]
    assert set(scored) == {"accuracy", "mxnet.metric:F1"}
    assert scored["accuracy"] == epochs[1]["eval"]["accuracy"]


def test_best_metric_must_be_an_evaluation_metric(tmp_path: Path) -> None:
    config = _config(tmp_path, best="cross_entropy")
    code, output = _invoke("check", config)
    assert code == 2, output
    line = (
        config.read_text()
        .splitlines()
        .index(next(row for row in config.read_text().splitlines() if row.startswith("checkpoint")))
        + 1
    )
    assert f"em.yaml:{line}: checkpoint.best_metric 'cross_entropy' is not one of " in output
    assert "fit.eval_metrics (accuracy, mxnet.metric:F1)" in output
    assert "Traceback" not in output
