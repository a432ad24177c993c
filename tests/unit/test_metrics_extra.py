"""top5_accuracy, cross_entropy, f1, mae, mse, rmse: equal to numpy references, device sums."""

from __future__ import annotations

import json
import math
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

from mxtrain.build import build_metric
from mxtrain.data.base import DataInfo
from mxtrain.metrics import (
    DeviceCrossEntropy,
    DeviceF1,
    DeviceMAE,
    DeviceMSE,
    DeviceRMSE,
    DeviceTopKAccuracy,
)
from mxtrain.registry import METRICS

PAD = -1
CLASSES = 8


def class_batches(count: int = 4, seed: int = 0, pad: int = PAD):
    """(labels (B,), probs (B, C)) with padding rows at the end of some batches."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        rows = int(rng.integers(3, 9))
        probs = rng.random((rows, CLASSES)).astype(np.float32) ** 3
        probs /= probs.sum(axis=1, keepdims=True)
        labels = rng.integers(0, CLASSES, rows).astype(np.float32)
        if pad != 0:
            labels[labels == 0] = 1  # keep 0 a real class only when it is not the pad id
        if i % 2:
            labels[-2:] = pad
        out.append((labels, probs))
    return out


def real(batches, pad=PAD):
    labels = np.concatenate([b[0] for b in batches])
    probs = np.concatenate([b[1] for b in batches])
    keep = labels != pad
    return labels[keep].astype(int), probs[keep]


def feed(metric, batches) -> None:
    for labels, preds in batches:
        metric.update([mx.nd.array(labels)], [mx.nd.array(preds)])


def macro_f1(labels: np.ndarray, guess: np.ndarray) -> float:
    scores = []
    for c in sorted(set(labels) | set(guess)):
        tp = np.sum((guess == c) & (labels == c))
        fp = np.sum((guess == c) & (labels != c))
        fn = np.sum((guess != c) & (labels == c))
        scores.append(2 * tp / (2 * tp + fp + fn))
    return float(np.mean(scores))


def test_cross_entropy_equals_numpy() -> None:
    batches = class_batches()
    metric = DeviceCrossEntropy(pad_id=PAD)
    feed(metric, batches)
    labels, probs = real(batches)
    expected = np.mean(-np.log(np.maximum(probs[np.arange(labels.size), labels], 1e-10)))
    assert metric.get() == {"cross_entropy": pytest.approx(expected, rel=1e-6)}


@pytest.mark.parametrize("k", [1, 3, 5, 20])
def test_top_k_accuracy_equals_numpy(k: int) -> None:
    batches = class_batches(seed=1)
    metric = DeviceTopKAccuracy(pad_id=PAD, k=k)
    assert metric.name == f"top{k}_accuracy"
    feed(metric, batches)
    labels, probs = real(batches)
    top = np.argsort(-probs, axis=1)[:, :k]
    expected = np.mean([label in row for label, row in zip(labels, top, strict=True)])
    assert metric.get()[metric.name] == pytest.approx(expected)
    with pytest.raises(ValueError, match="k must"):
        DeviceTopKAccuracy(k=0)


@pytest.mark.parametrize("pad", [PAD, 0])
def test_f1_equals_numpy_macro_f1(pad: int) -> None:
    batches = class_batches(seed=2, pad=pad)
    metric = DeviceF1(pad_id=pad)
    feed(metric, batches)
    labels, probs = real(batches, pad)
    assert metric.get()["f1"] == pytest.approx(macro_f1(labels, probs.argmax(axis=1)))


def test_f1_skips_classes_never_seen_and_is_nan_when_empty() -> None:
    metric = DeviceF1(pad_id=None)
    assert math.isnan(metric.get()["f1"])
    probs = np.eye(4, dtype=np.float32)[[0, 1, 1]]  # predicts 0, 1, 1; class 2, 3 unused
    metric.update([mx.nd.array([0, 1, 0])], [mx.nd.array(probs)])
    assert metric.get()["f1"] == pytest.approx(macro_f1(np.array([0, 1, 0]), np.array([0, 1, 1])))


def regression_batches(shape: tuple[int, ...], seed: int = 3):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(4):
        rows = int(rng.integers(2, 7))
        target = rng.normal(size=(rows, *shape)).astype(np.float32)
        pred = (target + rng.normal(scale=0.5, size=target.shape)).astype(np.float32)
        if i % 2:
            target[-1] = np.nan  # a padding row
            pred[-1] = 1e6  # whatever the model says there does not count
        out.append((target, pred))
    return out


@pytest.mark.parametrize("shape", [(), (3,)])
def test_regression_metrics_equal_numpy(shape: tuple[int, ...]) -> None:
    batches = regression_batches(shape)
    metrics = [DeviceMAE(pad_id=0), DeviceMSE(pad_id=-1), DeviceRMSE()]  # pad_id is ignored
    for metric in metrics:
        feed(metric, batches)
    target = np.concatenate([b[0] for b in batches]).astype(np.float64)
    pred = np.concatenate([b[1] for b in batches]).astype(np.float64)
    keep = ~np.isnan(target)
    err = pred[keep] - target[keep]
    values = {}
    for metric in metrics:
        values.update(metric.get())
    assert values["mae"] == pytest.approx(np.mean(np.abs(err)), rel=1e-6)
    assert values["mse"] == pytest.approx(np.mean(err**2), rel=1e-6)
    assert values["rmse"] == pytest.approx(np.sqrt(np.mean(err**2)), rel=1e-6)
    with pytest.raises(ValueError, match="one prediction per target"):
        DeviceMAE().update([mx.nd.zeros((2,))], [mx.nd.zeros((2, 2))])


def _all_metrics():
    return [
        DeviceCrossEntropy(pad_id=PAD),
        DeviceTopKAccuracy(pad_id=PAD),
        DeviceF1(pad_id=PAD),
    ]


def test_interval_epoch_devices_and_state_round_trip() -> None:
    batches = class_batches(count=6, seed=4)
    whole = _all_metrics()
    for metric in whole:
        feed(metric, batches)
    # two devices, an interval reset in the middle, a checkpoint and a restore
    split = _all_metrics()
    for i, (labels, probs) in enumerate(batches[:3]):
        ctx = mx.cpu(i % 2)
        for metric in split:
            metric.update([mx.nd.array(labels, ctx=ctx)], [mx.nd.array(probs, ctx=ctx)])
    for metric in split:
        metric.reset_interval()
    state = json.loads(json.dumps([m.get_state() for m in split]))
    resumed = _all_metrics()
    for metric, saved in zip(resumed, state, strict=True):
        metric.set_state(saved)
        assert metric.get() == pytest.approx(next(m for m in split if m.name == metric.name).get())
        feed(metric, batches[3:])
    for ours, reference in zip(resumed, whole, strict=True):
        assert ours.get() == pytest.approx(reference.get())
    interval = _all_metrics()
    for metric in interval:
        feed(metric, batches[3:])
    for ours, reference in zip(resumed, interval, strict=True):
        assert ours.get_interval() == pytest.approx(reference.get())
        ours.reset()
        assert math.isnan(next(iter(ours.get().values())))


@pytest.mark.parametrize("name", ["top5_accuracy", "cross_entropy", "f1", "mae", "mse", "rmse"])
def test_registered_and_built_like_fit_builds_them(name: str) -> None:
    info = DataInfo(num_classes=3, pad_id=-1, task="classify")
    metric = build_metric(name, info, Path("."))
    assert metric.name == name
    assert METRICS.get(name).summary
    labels = mx.nd.array([0, 2, -1] if name not in ("mae", "mse", "rmse") else [0.5, 1.0, 2.0])
    preds = mx.nd.array([[0.7, 0.2, 0.1], [0.1, 0.2, 0.7], [0.3, 0.3, 0.4]])
    if name in ("mae", "mse", "rmse"):
        preds = mx.nd.array([0.5, 1.0, 2.0])
    metric.update([labels], [preds])
    assert next(iter(metric.get().values())) == pytest.approx(
        {"top5_accuracy": 1.0, "cross_entropy": -math.log(0.7), "f1": 1.0}.get(name, 0.0)
    )
