"""StockMetric: a stock mx.metric.EvalMetric behind mxtrain's metric interface."""

from __future__ import annotations

import mxnet as mx
import pytest

from mxtrain.metrics import StockMetric


def batch(labels: list[int], predicted: list[int]) -> tuple[list, list]:
    probs = mx.nd.one_hot(mx.nd.array(predicted), 3)
    return [mx.nd.array(labels)], [probs]


def test_epoch_and_interval_sums_and_state_round_trip() -> None:
    metric = StockMetric(mx.metric.Accuracy(), "mxnet.metric:Accuracy")
    metric.update(*batch([0, 1, 2, 0], [0, 1, 2, 1]))  # 3 of 4
    assert metric.get_interval() == {"mxnet.metric:Accuracy": 0.75}
    metric.reset_interval()
    metric.update(*batch([0, 1], [1, 1]))  # 1 of 2
    assert metric.get_interval() == {"mxnet.metric:Accuracy": 0.5}
    assert metric.get() == pytest.approx({"mxnet.metric:Accuracy": 4 / 6})
    state = metric.get_state()
    restored = StockMetric(mx.metric.Accuracy(), "mxnet.metric:Accuracy")
    restored.set_state(state)
    assert restored.get() == metric.get()
    assert restored.get_interval() == metric.get_interval()
    metric.reset()
    metric.update(*batch([2], [2]))
    assert metric.get() == {"mxnet.metric:Accuracy": 1.0}
