"""Classification end to end through the CLI: fit, score and predict from YAML alone.

The demo data comes from scripts/make_demo_data.py, generated into a temporary folder; the
configs in configs/ are used as they are, with their data paths overridden by --set.
"""

from __future__ import annotations

import csv
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


def invoke(*args: object) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


def logged_eval(run: Path, metric: str) -> dict[int, float]:
    records = read_metrics(run / "metrics.jsonl")
    return {r["epoch"]: r["eval"][metric] for r in records if r["event"] == "epoch"}


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("demo")
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "make_demo_data.py"), "--out", str(folder)],
        check=True,
        capture_output=True,
    )
    return folder


def blob_overrides(demo: Path) -> list[str]:
    return [
        f"data.train.source={demo / 'features.npy'}",
        f"data.train.labels={demo / 'labels.npy'}",
        f"data.eval.source={demo / 'valid_features.npy'}",
        f"data.eval.labels={demo / 'valid_labels.npy'}",
    ]


def sets(overrides: list[str]) -> list[str]:
    return [part for o in overrides for part in ("--set", o)]


@pytest.fixture(scope="module")
def mlp_run(demo: Path) -> Path:
    """configs/ndarray_mlp.yaml fitted on the generated blobs for 3 epochs."""
    runs = demo / "runs"
    overrides = [*blob_overrides(demo), f"experiment.runs_dir={runs}", "fit.num_epoch=3"]
    code, out, err = invoke(
        "fit", CONFIGS / "ndarray_mlp.yaml", "--progress", "plain", *sets(overrides)
    )
    assert code == 0, out + err
    return runs / "ndarray_mlp"


def test_mlp_log_has_no_bucket_memory_line(mlp_run: Path) -> None:
    """An MLP's data is not bucketed: fit.bucket_memory bounds nothing there and is not logged."""
    log = (mlp_run / "train.log").read_text(encoding="utf-8")
    assert "epoch" in log
    assert "bucket_memory" not in log


def test_fit_reaches_high_eval_accuracy(mlp_run: Path) -> None:
    accuracy = logged_eval(mlp_run, "accuracy")
    assert sorted(accuracy) == [1, 2, 3]
    assert accuracy[3] > 0.9
    assert 0.9 < logged_eval(mlp_run, "f1")[3] <= 1.0
    meta = json.loads((mlp_run / "vocab.json").read_text())
    assert meta["num_classes"] == 3 and meta["feature_shape"] == [20]


def test_score_equals_the_logged_eval_values(mlp_run: Path) -> None:
    for ref, epoch in ((mlp_run, 3), (f"{mlp_run}:1", 1)):
        code, out, err = invoke("score", ref, "--json")
        assert code == 0, err
        metrics = json.loads(out)["metrics"]
        for name in ("accuracy", "cross_entropy", "f1"):
            assert metrics[name] == pytest.approx(logged_eval(mlp_run, name)[epoch], rel=1e-9)
    code, out, err = invoke("score", mlp_run, "--json", "--batch-size", "7")
    assert code == 0, err
    assert json.loads(out)["metrics"]["accuracy"] == pytest.approx(
        logged_eval(mlp_run, "accuracy")[3], rel=1e-9
    )


def test_predict_labels_in_input_order_with_probabilities(mlp_run: Path, demo: Path) -> None:
    features = np.load(demo / "valid_features.npy")
    truth = np.load(demo / "valid_labels.npy")
    out = demo / "preds.jsonl"
    code, _, err = invoke(
        "predict", "--checkpoint", mlp_run, "--input", demo / "valid_features.npy",
        "--output", out,
    )  # fmt: skip
    assert code == 0, err
    records = read_jsonl(out)
    assert [r["line"] for r in records] == list(range(1, len(features) + 1))
    labels = np.array([r["label"] for r in records])
    probs = np.array([r["probabilities"] for r in records])
    assert probs.shape == (len(features), 3)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(labels, probs.argmax(axis=1))
    assert np.mean(labels == truth) == pytest.approx(logged_eval(mlp_run, "accuracy")[3])

    # input order: reversed rows give reversed records, whatever the batch size
    np.save(demo / "reversed.npy", features[::-1])
    top = demo / "top.jsonl"
    code, _, err = invoke(
        "predict", "--checkpoint", mlp_run, "--input", demo / "reversed.npy", "--output", top,
        "--top-k", "2", "--batch-size", "7",
    )  # fmt: skip
    assert code == 0, err
    reversed_records = read_jsonl(top)
    assert [r["label"] for r in reversed_records] == labels[::-1].tolist()
    for record, p in zip(reversed_records, probs[::-1], strict=True):
        (first, p1), (_, p2) = record["top"]
        assert first == record["label"] and p1 >= p2
        assert p1 == pytest.approx(p.max(), abs=1e-6)


def test_predict_csv_and_npy_formats(mlp_run: Path, demo: Path) -> None:
    base = ["predict", "--checkpoint", mlp_run, "--input", demo / "valid_features.npy"]
    code, _, err = invoke(*base, "--output", demo / "p.csv", "--format", "csv")
    assert code == 0, err
    with open(demo / "p.csv", newline="") as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == ["line", "label", "prob_0", "prob_1", "prob_2"]
    assert len(rows) == 501
    code, _, err = invoke(*base, "--output", demo / "p.npy", "--format", "npy", "--top-k", "3")
    assert code == 0, err
    table = np.load(demo / "p.npy")
    assert table.dtype.names == ("line", "label", "top_label", "top_prob")
    np.testing.assert_array_equal(table["top_label"][:, 0], table["label"])
    np.testing.assert_allclose(table["top_prob"].sum(axis=1), 1.0, atol=1e-5)
    code, _, err = invoke(*base, "--output", demo / "p4.jsonl", "--top-k", "4")
    assert code == 2 and "more classes than the model has (3)" in err


CSV_CONFIG = """\
experiment: {{name: blobs_csv, runs_dir: {runs}}}
model: {{name: mlp, hidden: [32]}}
data:
  train: {{iterator: csv, source: {train}, label_column: label, batch_size: 50}}
  eval: {{iterator: csv, source: {valid}, batch_size: 50, shuffle: false}}
optimizer: {{name: adam, learning_rate: 0.01}}
fit: {{num_epoch: 3, metrics: [accuracy, top5_accuracy]}}
"""


def test_csv_iterator_end_to_end(demo: Path) -> None:
    config = demo / "blobs_csv.yaml"
    config.write_text(
        CSV_CONFIG.format(
            runs=demo / "runs", train=demo / "blobs.csv", valid=demo / "valid_blobs.csv"
        )
    )
    code, out, err = invoke("fit", config, "--progress", "quiet")
    assert code == 0, out + err
    run = demo / "runs" / "blobs_csv"
    assert logged_eval(run, "accuracy")[3] > 0.9
    code, out, err = invoke("score", run, "--json")
    assert json.loads(out)["metrics"]["accuracy"] == pytest.approx(
        logged_eval(run, "accuracy")[3], rel=1e-9
    )
    # predict: features only (no label column), columns in another order
    with open(demo / "valid_blobs.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    names = [f"x{j}" for j in range(20)][::-1]
    lines = [",".join(names)] + [",".join(r[n] for n in names) for r in rows]
    (demo / "unlabelled.csv").write_text("\n".join(lines) + "\n")
    out_file = demo / "csv_preds.jsonl"
    code, _, err = invoke(
        "predict", "--checkpoint", run, "--input", demo / "unlabelled.csv", "--output", out_file
    )
    assert code == 0, err
    labels = np.array([r["label"] for r in read_jsonl(out_file)])
    truth = np.array([int(r["label"]) for r in rows])
    assert np.mean(labels == truth) == pytest.approx(logged_eval(run, "accuracy")[3])


def test_text_classifier_end_to_end(demo: Path) -> None:
    runs = demo / "runs"
    overrides = [
        f"data.train.source={demo / 'tokens_train.npz'}",
        f"data.eval.source={demo / 'tokens_valid.npz'}",
        f"experiment.runs_dir={runs}",
        "fit.num_epoch=3",
    ]
    code, out, err = invoke(
        "fit", CONFIGS / "text_classifier.yaml", "--progress", "quiet", *sets(overrides)
    )
    assert code == 0, out + err
    run = runs / "text_classifier"
    assert logged_eval(run, "accuracy")[3] > 0.9
    valid = np.load(demo / "tokens_valid.npz")
    # predict from token rows padded further: padding does not change the answers
    padded = np.zeros((valid["data"].shape[0], 16), dtype=np.int32)
    padded[:, :12] = valid["data"]
    np.save(demo / "padded_tokens.npy", padded)
    out_file = demo / "text_preds.jsonl"
    code, _, err = invoke(
        "predict", "--checkpoint", run, "--input", demo / "padded_tokens.npy", "--output", out_file
    )
    assert code == 0, err
    labels = np.array([r["label"] for r in read_jsonl(out_file)])
    assert np.mean(labels == valid["label"]) == pytest.approx(logged_eval(run, "accuracy")[3])


REGRESS_CONFIG = """\
experiment: {{name: regress, runs_dir: {runs}}}
model: {{name: mlp, hidden: [16]}}
data:
  train: {{iterator: ndarray, source: {source}, task: regress, batch_size: 32}}
  eval: {{iterator: ndarray, source: {source}, task: regress, batch_size: 32, shuffle: false}}
optimizer: {{name: adam, learning_rate: 0.02}}
fit: {{num_epoch: 4, metrics: [mse, mae, rmse]}}
"""


def test_regression_end_to_end(demo: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 3)).astype(np.float32)
    np.savez(demo / "reg.npz", data=x, label=x @ np.array([1.0, -1.0, 0.5]) + 2.0)
    config = demo / "regress.yaml"
    config.write_text(REGRESS_CONFIG.format(runs=demo / "runs", source=demo / "reg.npz"))
    code, out, err = invoke("fit", config, "--progress", "quiet")
    assert code == 0, out + err
    run = demo / "runs" / "regress"
    mse = logged_eval(run, "mse")
    assert mse[4] < mse[1] and mse[4] < 0.5
    code, out, _ = invoke("score", run, "--json")
    assert json.loads(out)["metrics"]["rmse"] == pytest.approx(logged_eval(run, "rmse")[4])
    np.save(demo / "reg_x.npy", x[:5])
    code, _, err = invoke(
        "predict", "--checkpoint", run, "--input", demo / "reg_x.npy", "--output", demo / "r.jsonl"
    )
    assert code == 0, err
    records = read_jsonl(demo / "r.jsonl")
    assert [r["line"] for r in records] == [1, 2, 3, 4, 5]
    assert all(isinstance(r["value"], float) for r in records)
    code, _, err = invoke(
        "predict", "--checkpoint", run, "--input", demo / "reg_x.npy",
        "--output", demo / "r2.jsonl", "--top-k", "1",
    )  # fmt: skip
    assert code == 2 and "regressor" in err


@pytest.mark.parametrize("config", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_config_passes_check(config: Path, demo: Path) -> None:
    overrides: list[str] = []
    if config.name == "ndarray_mlp.yaml":
        overrides = blob_overrides(demo)
    elif config.name == "text_classifier.yaml":
        overrides = [
            f"data.train.source={demo / 'tokens_train.npz'}",
            f"data.eval.source={demo / 'tokens_valid.npz'}",
        ]
    code, out, err = invoke("check", config, *sets(overrides))
    assert code == 0, err
    assert "model:" in out


def test_resume_mid_epoch_is_exact(demo: Path) -> None:
    """Order by (seed, epoch), dropout reseeded per batch, f1 counts restored: a run stopped
    mid-epoch (fit.max_updates) and resumed ends bit-identical to a straight run."""
    import mxnet as mx

    runs = demo / "resume_runs"
    common = [
        *blob_overrides(demo),
        f"experiment.runs_dir={runs}",
        "fit.num_epoch=2",
        "model.dropout=0.3",
        "model.batch_norm=true",
        "data.train.batch_size=48",  # 2000 rows: 42 batches, the last one padded
    ]
    code, out, err = invoke(
        "fit", CONFIGS / "ndarray_mlp.yaml", "--name", "straight", "--progress", "quiet",
        *sets(common),
    )  # fmt: skip
    assert code == 0, out + err
    code, out, err = invoke(
        "fit", CONFIGS / "ndarray_mlp.yaml", "--name", "split", "--progress", "quiet",
        *sets([*common, "fit.max_updates=50"]),
    )  # fmt: skip
    assert code == 0, out + err
    code, out, err = invoke("resume", runs / "split", "--set", "fit.max_updates=null")
    assert code == 0, out + err
    status = json.loads((runs / "split" / "run.json").read_text())
    assert [r["from"] for r in status["resumes"]] == ["e0001-b000008"]  # mid-epoch 2
    straight = mx.nd.load(str(runs / "straight" / "model-0002.params"))
    split = mx.nd.load(str(runs / "split" / "model-0002.params"))
    assert sorted(straight) == sorted(split)
    for name, value in straight.items():
        assert np.array_equal(value.asnumpy(), split[name].asnumpy()), name
    epoch = [r for r in read_metrics(runs / "split" / "metrics.jsonl") if r["event"] == "epoch"]
    reference = [
        r for r in read_metrics(runs / "straight" / "metrics.jsonl") if r["event"] == "epoch"
    ]
    assert epoch[-1]["train"] == reference[-1]["train"]
    assert epoch[-1]["eval"] == reference[-1]["eval"]


def test_int8_scores_the_mlp_close_to_fp32(mlp_run: Path) -> None:
    """--int8 runs the MLP's FullyConnected layers (ReLU fused) in int8; the unit tests bound
    the error per layer, here the accuracy of the demo's well-separated blobs holds."""
    code, out, err = invoke("score", mlp_run, "--json")
    assert code == 0, out + err
    fp32 = json.loads(out.strip().splitlines()[-1])
    code, out, err = invoke("score", mlp_run, "--json", "--int8")
    assert code == 0, out + err
    int8 = json.loads(out.strip().splitlines()[-1])
    assert int8["int8"]["operators"] and all(
        op.startswith("FullyConnected ") for op in int8["int8"]["operators"]
    )
    assert int8["metrics"]["accuracy"] >= fp32["metrics"]["accuracy"] - 0.02
