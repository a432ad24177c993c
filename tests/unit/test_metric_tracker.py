"""The one tracker of a metric's best value (best checkpoint, early stopping, the report's
mark, history) and the rule for which way a metric is better."""

from __future__ import annotations

import math

import pytest

from mxtrain.metric_tracker import MetricTracker, declared_direction, lower_is_better


class _Metric:
    def __init__(self, name: str, lower: object = None) -> None:
        self.name = name
        if lower is not None:
            self.lower_is_better = lower


def test_direction_mode_beats_declaration_beats_name() -> None:
    assert lower_is_better("perplexity") and not lower_is_better("accuracy")
    assert lower_is_better("accuracy", "min") and not lower_is_better("perplexity", "max")
    # a plugin metric that says so is believed, whatever its name
    assert lower_is_better("my_score", "auto", declared=True)
    assert not lower_is_better("loss", "auto", declared=False)
    assert lower_is_better("loss", "max", declared=True) is False


def test_declared_direction_reads_the_metric_reporting_the_name() -> None:
    metrics = [_Metric("accuracy", False), _Metric("edit_distance", True), _Metric("bleu")]
    assert declared_direction(metrics, "edit_distance") is True
    assert declared_direction(metrics, "accuracy") is False
    assert declared_direction(metrics, "bleu") is None  # says nothing: judged by name
    assert declared_direction(metrics, "missing") is None
    assert declared_direction([_Metric("odd", "yes")], "odd") is None  # not a bool: ignored


def test_device_metrics_declare_their_direction() -> None:
    from mxtrain import metrics

    assert metrics.DevicePerplexity.lower_is_better is True
    assert metrics.DeviceCrossEntropy.lower_is_better is True
    assert metrics.DeviceMSE.lower_is_better is True and metrics.DeviceMAE.lower_is_better
    assert metrics.DeviceAccuracy.lower_is_better is False
    assert metrics.DeviceTopKAccuracy.lower_is_better is False
    assert metrics.DeviceF1.lower_is_better is False


@pytest.mark.parametrize("lower", [True, False])
def test_best_so_far_and_patience(lower: bool) -> None:
    sign = 1.0 if lower else -1.0
    tracker = MetricTracker("m", lower, min_delta=0.5, patience=2)
    assert tracker.summary() is None
    assert tracker.update(sign * 10.0, epoch=1)
    assert not tracker.update(sign * 9.8, epoch=2)  # within min_delta: no improvement
    assert tracker.bad == 1 and not tracker.out_of_patience
    assert tracker.update(sign * 9.0, epoch=3) and tracker.bad == 0
    assert not tracker.update(math.nan, epoch=4)  # never a best, counts as no improvement
    assert not tracker.update(sign * math.inf * -1, epoch=5)
    assert tracker.out_of_patience
    assert tracker.summary() == {"metric": "m", "value": sign * 9.0, "epoch": 3}


def test_state_round_trip_resumes_patience() -> None:
    tracker = MetricTracker("loss", True, patience=3)
    for value in (3.0, 2.0, 2.5, 2.6):
        tracker.update(value)
    again = MetricTracker("loss", True, patience=3)
    again.set_state(tracker.get_state())
    assert (again.best, again.bad) == (2.0, 2)
    again.update(2.1)
    assert again.out_of_patience
    fresh = MetricTracker("loss", True)
    fresh.set_state(None)
    assert (fresh.best, fresh.bad, fresh.out_of_patience) == (None, 0, False)
