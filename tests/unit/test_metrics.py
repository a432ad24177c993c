"""Device-side metrics: equal to MXNet's stock ones, interval/epoch sums, no per-batch sync."""

from __future__ import annotations

import json
import math

import mxnet as mx
import numpy as np
import pytest
from float_bounds import FLOAT32_U

from mxtrain.metrics import DeviceAccuracy, DevicePerplexity
from mxtrain.registry import METRICS


def _random_batches(count: int, seed: int = 0, vocab: int = 9):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        batch, length = 3, int(rng.integers(2, 6))
        probs = rng.random((batch * length, vocab)).astype(np.float32)
        probs[0, :] = 0.0  # a zero probability exercises the 1e-10 floor
        probs[0, 0] = 1.0
        probs /= probs.sum(axis=1, keepdims=True)
        labels = rng.integers(0, vocab, (batch, length)).astype(np.float32)
        labels[0, 0] = 3  # the row whose probability of 3 is zero
        labels[-1, -2:] = 0  # padding
        out.append((mx.nd.array(labels), mx.nd.array(probs)))
    return out


@pytest.mark.parametrize("pad_id", [0, None])
def test_perplexity_equals_stock(pad_id) -> None:
    ours = DevicePerplexity(pad_id=pad_id)
    stock = mx.metric.Perplexity(ignore_label=pad_id)
    for labels, probs in _random_batches(5):
        ours.update([labels], [probs])
        stock.update([labels], [probs])
    assert ours.get()["perplexity"] == pytest.approx(stock.get()[1], rel=1e-6)


@pytest.mark.parametrize("pad_id", [0, None])
def test_perplexity_from_the_loss_output_equals_from_probabilities(pad_id) -> None:
    """A model's per-position -log p(label) gives the perplexity the probabilities give
    (the 1e-10 floor becomes a cap of -log(1e-10); padding positions are skipped)."""
    from mxtrain.metrics import DeviceCrossEntropy

    for cls in (DevicePerplexity, DeviceCrossEntropy):
        from_probs, from_loss = cls(pad_id=pad_id), cls(pad_id=pad_id)
        for labels, probs in _random_batches(4):
            flat = labels.asnumpy().reshape(-1).astype(int)
            picked = probs.asnumpy()[np.arange(flat.size), flat]
            with np.errstate(divide="ignore"):
                nll = -np.log(picked)  # inf where the probability is 0
            from_probs.update([labels], [probs])
            from_loss.update([labels], [mx.nd.array(nll)])
        # each side rounds -log p to float32 (|log p| <= -log(1e-10) = 23 with the floor, a
        # couple of roundings u each); exp makes that absolute error a relative one
        rel = 4 * FLOAT32_U * -math.log(1e-10)
        assert from_loss.get()[cls.name] == pytest.approx(from_probs.get()[cls.name], rel=rel)
        assert cls.reads_loss


def test_accuracy_by_hand() -> None:
    labels = mx.nd.array([[1, 2, 0], [2, 2, 1]])
    probs = mx.nd.array(
        [
            [0.1, 0.8, 0.1],  # 1: right
            [0.1, 0.8, 0.1],  # 2: wrong
            [0.9, 0.0, 0.1],  # pad: ignored although "right"
            [0.0, 0.2, 0.8],  # 2: right
            [0.0, 0.2, 0.8],  # 2: right
            [0.5, 0.1, 0.4],  # 1: wrong
        ]
    )
    metric = DeviceAccuracy(pad_id=0)
    metric.update([labels], [probs])
    assert metric.get() == {"accuracy": pytest.approx(3 / 5)}
    assert metric.total_tokens == 5
    everything = DeviceAccuracy(pad_id=None)
    everything.update([labels], [probs])
    assert everything.get()["accuracy"] == pytest.approx(4 / 6)
    # class ids instead of probabilities
    ids = DeviceAccuracy()
    ids.update([mx.nd.array([1, 2, 0])], [mx.nd.array([1, 1, 0])])
    assert ids.get()["accuracy"] == pytest.approx(1 / 2)


def test_interval_and_epoch_sums() -> None:
    batches = _random_batches(3, seed=1)
    metric = DevicePerplexity()
    for labels, probs in batches[:2]:
        metric.update([labels], [probs])
    metric.reset_interval()
    metric.update([batches[2][0]], [batches[2][1]])

    last_only = DevicePerplexity()
    last_only.update([batches[2][0]], [batches[2][1]])
    everything = DevicePerplexity()
    for labels, probs in batches:
        everything.update([labels], [probs])
    assert metric.get_interval() == pytest.approx(last_only.get())
    assert metric.get() == pytest.approx(everything.get())
    assert (
        metric.total_tokens
        == everything.total_tokens
        == sum(int((b[0].asnumpy() != 0).sum()) for b in batches)
    )

    metric.reset()
    assert math.isnan(metric.get()["perplexity"])
    assert math.isnan(metric.get_interval()["perplexity"])


def test_several_devices_and_update_dict() -> None:
    (l1, p1), (l2, p2) = _random_batches(2, seed=2)
    metric = DevicePerplexity()
    # two CPU "devices": each prediction's sums stay on its own context
    metric.update([l1, l2], [p1.as_in_context(mx.cpu(0)), p2.as_in_context(mx.cpu(1))])
    assert sorted(metric._epoch) == [("cpu", 0), ("cpu", 1)]
    stock = mx.metric.Perplexity(ignore_label=0)
    stock.update([l1, l2], [p1, p2])
    assert metric.get()["perplexity"] == pytest.approx(stock.get()[1], rel=1e-6)

    by_dict = DevicePerplexity()
    by_dict.update_dict({"softmax_label": l1}, {"softmax_output": p1})
    single = DevicePerplexity()
    single.update([l1], [p1])
    assert by_dict.get() == single.get()

    with pytest.raises(ValueError, match="2 labels but 1"):
        metric.update([l1, l2], [p1])


def test_update_does_not_synchronise(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("update() must not copy to the host")

    batches = _random_batches(2, seed=3)
    perplexity, accuracy = DevicePerplexity(), DeviceAccuracy()
    monkeypatch.setattr(mx.nd.NDArray, "asnumpy", refuse)
    monkeypatch.setattr(mx.nd.NDArray, "asscalar", refuse)
    for labels, probs in batches:
        perplexity.update([labels], [probs])
        accuracy.update([labels], [probs])
    monkeypatch.undo()
    assert perplexity.get()["perplexity"] > 1
    assert 0 <= accuracy.get()["accuracy"] <= 1


def test_registered_metrics_take_pad_id() -> None:
    for name, cls in (("perplexity", DevicePerplexity), ("accuracy", DeviceAccuracy)):
        factory = METRICS.get(name).load()
        assert factory is cls
        metric = factory(pad_id=2)
        assert metric.name == name and metric.pad_id == 2
    assert DevicePerplexity(name="ppl").get().keys() == {"ppl"}


def test_state_round_trip_continues_exactly() -> None:
    """A metric restored from get_state() and fed the rest gives the uninterrupted value."""
    rng = np.random.default_rng(7)
    batches = []
    for _ in range(6):
        label = mx.nd.array(rng.integers(0, 5, (3, 4)))
        pred = mx.nd.softmax(mx.nd.array(rng.normal(size=(12, 5))))
        batches.append(([label], [pred]))
    straight = DevicePerplexity(pad_id=0)
    for labels, preds in batches:
        straight.update(labels, preds)
    first = DevicePerplexity(pad_id=0)
    for labels, preds in batches[:3]:
        first.update(labels, preds)
    state = json.loads(json.dumps(first.get_state()))  # through JSON, as in a checkpoint
    resumed = DevicePerplexity(pad_id=0)
    resumed.set_state(state)
    assert resumed.get() == first.get()
    for labels, preds in batches[3:]:
        resumed.update(labels, preds)
    assert resumed.get() == straight.get()
    assert resumed.get_interval() == straight.get_interval()
