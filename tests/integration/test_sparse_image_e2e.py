"""libsvm and image_record end to end through the CLI: fit, score and predict from YAML."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from mxtrain.cli.main import cli
from mxtrain.run.folder import read_metrics

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
sys.path.insert(0, str(ROOT / "tests" / "unit"))
from image_rec_helpers import bright_dark_images, write_image_rec  # noqa: E402


def invoke(*args: object) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


def logged_eval(run: Path, metric: str) -> dict[int, float]:
    records = read_metrics(run / "metrics.jsonl")
    return {r["epoch"]: r["eval"][metric] for r in records if r["event"] == "epoch"}


def sets(overrides: list[str]) -> list[str]:
    return [part for o in overrides for part in ("--set", o)]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("demo")
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "make_demo_data.py"), "--out", str(folder)],
        check=True,
        capture_output=True,
    )
    return folder


def test_libsvm_mlp_fits_scores_and_predicts(demo: Path) -> None:
    runs = demo / "runs"
    overrides = [
        f"data.train.source={demo / 'sparse_train.svm'}",
        f"data.eval.source={demo / 'sparse_valid.svm'}",
        f"experiment.runs_dir={runs}",
        "fit.num_epoch=3",
    ]
    code, out, err = invoke(
        "fit", CONFIGS / "libsvm_mlp.yaml", "--progress", "plain", *sets(overrides)
    )
    assert code == 0, out + err
    run = runs / "libsvm_mlp"
    accuracy = logged_eval(run, "accuracy")
    assert accuracy[3] > 0.9
    meta = json.loads((run / "vocab.json").read_text())
    assert meta["feature_shape"] == [300] and meta["num_classes"] == 3

    code, out, err = invoke("score", run, "--json")
    assert code == 0, err
    assert json.loads(out)["metrics"]["accuracy"] == pytest.approx(accuracy[3], rel=1e-9)

    # predict: features only (no labels), file order
    valid = (demo / "sparse_valid.svm").read_text().splitlines()
    truth = [int(line.split()[0]) for line in valid]
    (demo / "unlabelled.svm").write_text("\n".join(ln.split(" ", 1)[1] for ln in valid) + "\n")
    preds = demo / "preds.jsonl"
    code, _, err = invoke(
        "predict", "--checkpoint", run, "--input", demo / "unlabelled.svm", "--output", preds
    )
    assert code == 0, err
    labels = [json.loads(line)["label"] for line in preds.read_text().splitlines()]
    assert len(labels) == len(truth)
    assert np.mean(np.array(labels) == np.array(truth)) == pytest.approx(accuracy[3])


IMAGE_CONFIG = """\
experiment:
  name: lenet_rec
  seed: 2
  runs_dir: {runs}
model:
  name: lenet
  channels: [4, 8]
  hidden: 16
data:
  train:
    iterator: image_record
    source: train.rec
    data_shape: [3, 8, 8]
    num_classes: 2
    batch_size: 8
    rand_mirror: true
    scale: 0.00390625
  eval:
    iterator: image_record
    source: valid.rec
    data_shape: [3, 8, 8]
    batch_size: 8
    scale: 0.00390625
context:
  devices: cpu
optimizer:
  name: adam
  learning_rate: 0.01
initializer:
  name: xavier
fit:
  num_epoch: 4
  metrics: [accuracy]
checkpoint:
  prefix: model
  best_metric: accuracy
"""


def test_lenet_fits_on_image_records(tmp_path: Path) -> None:
    write_image_rec(tmp_path, "train", *bright_dark_images(64, size=8, seed=1))
    write_image_rec(tmp_path, "valid", *bright_dark_images(20, size=8, seed=2))
    config = tmp_path / "lenet_rec.yaml"
    config.write_text(IMAGE_CONFIG.format(runs=tmp_path / "runs"))
    code, out, err = invoke("fit", config, "--progress", "plain")
    assert code == 0, out + err
    run = tmp_path / "runs" / "lenet_rec"
    accuracy = logged_eval(run, "accuracy")
    assert max(accuracy) == 4 and accuracy[4] > 0.9
    assert json.loads((run / "vocab.json").read_text())["feature_shape"] == [3, 8, 8]

    code, out, err = invoke("score", run, "--json")
    assert code == 0, err
    assert json.loads(out)["metrics"]["accuracy"] == pytest.approx(accuracy[4], rel=1e-9)

    (tmp_path / "lenet_bad.yaml").write_text(
        IMAGE_CONFIG.format(runs=tmp_path / "runs2").replace("train.rec", "nope.rec")
    )
    code, out, err = invoke("fit", tmp_path / "lenet_bad.yaml", "--progress", "plain")
    assert code != 0 and "nope.rec does not exist" in out + err
