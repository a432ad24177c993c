"""Metrics accumulated on the device, read back only when asked.

MXNet's stock metrics call ``asnumpy()`` on every batch, which stalls the asynchronous
engine. These keep running sums as NDArrays on each prediction's own device (``+=`` is just
another queued operation) and synchronise only in ``get()`` / ``get_interval()``.
Each metric keeps two sets of sums, updated together: the epoch's (``get``/``reset``) and
the log interval's (``get_interval``/``reset_interval``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import mxnet as mx
import numpy as np

from mxtrain.errors import ConfigError

_Sums = dict[tuple[str, int], list[Any]]  # device -> [numerator, denominator] float64 NDArrays


class _AccumulatingMetric:
    """What the device metrics share: per-device epoch and interval accumulators (their
    contents are each metric's own), state restored from a checkpoint, and the resets."""

    name = "metric"
    #: whether smaller values are better (mxtrain.metric_tracker); None: judged by name
    lower_is_better: bool | None = None

    def __init__(self, pad_id: int | None = 0, *, name: str | None = None) -> None:
        self.pad_id = pad_id
        if name is not None:
            self.name = name
        self._epoch: dict[tuple[str, int], Any] = {}
        self._interval: dict[tuple[str, int], Any] = {}
        # Sums restored from a checkpoint, folded into the first device's sums at its next
        # update so that a resumed run adds in the same order as an uninterrupted one.
        self._restored: dict[str, Any] = {}

    def update(self, labels: Sequence[Any], preds: Sequence[Any]) -> None:
        raise NotImplementedError

    def update_dict(self, label_dict: Mapping[str, Any], pred_dict: Mapping[str, Any]) -> None:
        """``update`` with the label and output dicts stock modules pass around."""
        self.update(list(label_dict.values()), list(pred_dict.values()))

    def reset(self) -> None:
        """Start a new epoch (the interval too)."""
        self._epoch = {}
        self._interval = {}
        self._restored = {}

    def reset_interval(self) -> None:
        """Start a new log interval; the epoch's accumulators go on."""
        self._interval = {}
        self._restored.pop("interval", None)


class _DeviceMetric(_AccumulatingMetric):
    """Sums of a per-position numerator over non-padding positions, per device."""

    def _batch(self, label: Any, pred: Any) -> tuple[Any, Any]:
        """(numerator, denominator) of one batch as 1-element NDArrays on pred's device."""
        raise NotImplementedError

    def _value(self, numerator: float, denominator: float) -> float:
        raise NotImplementedError

    def _mask(self, label: Any) -> Any:
        if self.pad_id is None:
            return mx.nd.ones_like(label)
        return label != self.pad_id

    def update(self, labels: Sequence[Any], preds: Sequence[Any]) -> None:
        """Add one batch: labels (B, T) or (B,), preds (B*T, C) probabilities; per device."""
        preds = _predictions(self.name, labels, preds)
        for label, pred in zip(labels, preds, strict=True):
            ctx = pred.context
            # a no-op when the label already lives on the prediction's device
            label = label.as_in_context(ctx).reshape((-1,))
            numerator, denominator = self._batch(label, pred)
            numerator = numerator.astype(np.float64)
            denominator = denominator.astype(np.float64)
            key = (ctx.device_type, ctx.device_id)
            for which, sums in (("epoch", self._epoch), ("interval", self._interval)):
                slot = sums.get(key)
                if slot is None:
                    slot = sums[key] = [numerator.copy(), denominator.copy()]
                    restored = self._restored.pop(which, None)
                    if restored is not None:
                        slot[0] = mx.nd.array([restored[0]], ctx=ctx, dtype=np.float64)
                        slot[1] = mx.nd.array([restored[1]], ctx=ctx, dtype=np.float64)
                        slot[0] += numerator
                        slot[1] += denominator
                else:
                    slot[0] += numerator
                    slot[1] += denominator

    def _read(self, sums: _Sums, which: str) -> tuple[float, float]:
        numerator = sum(float(slot[0].asscalar()) for slot in sums.values())
        denominator = sum(float(slot[1].asscalar()) for slot in sums.values())
        pending = self._restored.get(which)
        if pending is not None:
            numerator += pending[0]
            denominator += pending[1]
        return numerator, denominator

    def get_state(self) -> dict[str, list[float]]:
        """The running sums as JSON-able floats, for a checkpoint (synchronises)."""
        return {
            "epoch": list(self._read(self._epoch, "epoch")),
            "interval": list(self._read(self._interval, "interval")),
        }

    def set_state(self, state: Mapping[str, Sequence[float]]) -> None:
        """Restore sums saved by ``get_state`` (replaces the current ones)."""
        self._epoch = {}
        self._interval = {}
        self._restored = {
            which: (float(state[which][0]), float(state[which][1]))
            for which in ("epoch", "interval")
        }

    def get(self) -> dict[str, float]:
        """The value since ``reset()`` (synchronises with the devices)."""
        return {self.name: self._value(*self._read(self._epoch, "epoch"))}

    def get_interval(self) -> dict[str, float]:
        """The value since ``reset_interval()`` (synchronises with the devices)."""
        return {self.name: self._value(*self._read(self._interval, "interval"))}

    @property
    def total_tokens(self) -> int:
        """Non-padding positions counted since ``reset()`` (synchronises)."""
        return round(self._read(self._epoch, "epoch")[1])


def _predictions(name: str, labels: Sequence[Any], preds: Sequence[Any]) -> Sequence[Any]:
    """The outputs that pair with ``labels``: the first ones. Models put their predictions
    first and extra outputs (a separate training loss, ...) after them."""
    if len(preds) < len(labels):
        raise ValueError(f"{name}: {len(labels)} labels but {len(preds)} predictions")
    return preds[: len(labels)]


#: what -log(max(p, 1e-10)) is at most: the perplexity metrics' cap on one position's loss
_NLL_CAP = -math.log(1e-10)


class DevicePerplexity(_DeviceMetric):
    """exp(mean negative log-likelihood) over labels that are not ``pad_id``.

    Equals ``mx.metric.Perplexity(ignore_label=pad_id)``: nll = -log(max(p, 1e-10)).
    Predictions are probabilities (..., C), or each position's -log p(label) shaped like the
    labels (a model's loss output: training then need not compute the probabilities).
    """

    name = "perplexity"
    lower_is_better = True
    #: fed the loss output instead of probabilities when every metric of a run reads it
    reads_loss = True

    def _batch(self, label: Any, pred: Any) -> tuple[Any, Any]:
        mask = self._mask(label)
        if pred.ndim == 1 and pred.size == label.size:  # -log p(label) per position
            nll = pred.reshape((-1,))
            if nll.dtype != np.float32:
                nll = nll.astype(np.float32)
            nll = mx.nd.minimum(nll, _NLL_CAP) * mask
            return mx.nd.sum(nll), mx.nd.sum(mask)
        prob = mx.nd.pick(pred.reshape((-1, pred.shape[-1])), label, axis=-1)
        if prob.dtype != np.float32:
            prob = prob.astype(np.float32)
        nll = -mx.nd.log(mx.nd.maximum(prob, 1e-10)) * mask
        return mx.nd.sum(nll), mx.nd.sum(mask)

    def _value(self, numerator: float, denominator: float) -> float:
        return math.exp(numerator / denominator) if denominator > 0 else math.nan


class DeviceAccuracy(_DeviceMetric):
    """Fraction of labels that are not ``pad_id`` whose arg-max prediction equals them.

    Predictions are probabilities (..., C), or class ids shaped like the labels.
    """

    name = "accuracy"
    lower_is_better = False

    def _batch(self, label: Any, pred: Any) -> tuple[Any, Any]:
        if pred.size == label.size:
            guess = pred.reshape((-1,))
        else:
            guess = mx.nd.argmax(pred.reshape((-1, pred.shape[-1])), axis=-1)
        mask = self._mask(label)
        correct = (guess == label.astype(guess.dtype)) * mask
        return mx.nd.sum(correct), mx.nd.sum(mask)

    def _value(self, numerator: float, denominator: float) -> float:
        return numerator / denominator if denominator > 0 else math.nan


class DeviceCrossEntropy(DevicePerplexity):
    """Mean negative log-likelihood (natural log) of the label over non-``pad_id`` labels.

    The log of the perplexity: ``-log(max(p, 1e-10))`` averaged. Lower is better.
    """

    name = "cross_entropy"

    def _value(self, numerator: float, denominator: float) -> float:
        return numerator / denominator if denominator > 0 else math.nan


class DeviceTopKAccuracy(_DeviceMetric):
    """Fraction of non-``pad_id`` labels among the ``k`` most probable classes (default 5).

    With ``k`` at least the number of classes every label counts as a hit. Registered as
    ``top5_accuracy``; the name follows ``k``.
    """

    lower_is_better = False

    def __init__(self, pad_id: int | None = 0, *, k: int = 5, name: str | None = None) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive integer, not {k!r}")
        super().__init__(pad_id, name=name or f"top{k}_accuracy")
        self.k = k

    def _batch(self, label: Any, pred: Any) -> tuple[Any, Any]:
        probs = pred.reshape((-1, pred.shape[-1]))
        k = min(self.k, int(probs.shape[-1]))
        top = mx.nd.topk(probs, k=k, ret_typ="indices", axis=-1)
        wanted = label.reshape((-1, 1)).astype(top.dtype)
        hit = mx.nd.sum(mx.nd.broadcast_equal(top, wanted), axis=1)
        mask = self._mask(label)
        return mx.nd.sum(hit * mask), mx.nd.sum(mask)

    def _value(self, numerator: float, denominator: float) -> float:
        return numerator / denominator if denominator > 0 else math.nan


class _DeviceRegression(_DeviceMetric):
    """Sums over real-valued targets; NaN targets (padding rows) are skipped.

    ``pad_id`` is accepted, for the same call as the other metrics, and ignored: a regression
    iterator marks padding with NaN targets. Predictions must have as many values as targets.
    """

    lower_is_better = True

    def __init__(self, pad_id: int | None = None, *, name: str | None = None) -> None:
        super().__init__(None, name=name)

    def _error(self, label: Any, pred: Any) -> tuple[Any, Any]:
        """(prediction - target, 1 for a real target) in float64, 0 at NaN targets."""
        if pred.size != label.size:
            raise ValueError(
                f"{self.name}: {pred.size} predictions for {label.size} targets; a regression "
                "metric needs one prediction per target"
            )
        target = label.astype(np.float64)
        real = target == target
        diff = pred.reshape((-1,)).astype(np.float64) - target
        return mx.nd.where(real, diff, mx.nd.zeros_like(diff)), real


class DeviceMAE(_DeviceRegression):
    """Mean absolute error over all targets of non-padding rows."""

    name = "mae"

    def _batch(self, label: Any, pred: Any) -> tuple[Any, Any]:
        diff, real = self._error(label, pred)
        return mx.nd.sum(mx.nd.abs(diff)), mx.nd.sum(real)

    def _value(self, numerator: float, denominator: float) -> float:
        return numerator / denominator if denominator > 0 else math.nan


class DeviceMSE(_DeviceRegression):
    """Mean squared error over all targets of non-padding rows."""

    name = "mse"

    def _batch(self, label: Any, pred: Any) -> tuple[Any, Any]:
        diff, real = self._error(label, pred)
        return mx.nd.sum(diff * diff), mx.nd.sum(real)

    def _value(self, numerator: float, denominator: float) -> float:
        return numerator / denominator if denominator > 0 else math.nan


class DeviceRMSE(DeviceMSE):
    """Square root of the mean squared error (over the whole epoch or interval)."""

    name = "rmse"

    def _value(self, numerator: float, denominator: float) -> float:
        return math.sqrt(numerator / denominator) if denominator > 0 else math.nan


_Counts = dict[tuple[str, int], Any]  # device -> (3, classes) float64 NDArray: TP, FP, FN


class DeviceF1(_AccumulatingMetric):
    """Macro-averaged F1 over classes, from per-class TP/FP/FN counted on the device.

    Per class c, ``F1_c = 2 TP / (2 TP + FP + FN)`` (the predicted class is the arg-max);
    the value is the mean over the classes that occur among the labels or the predictions
    (as scikit-learn's ``f1_score(average="macro")``). Labels equal to ``pad_id`` are skipped.
    Same interface as the other device metrics; the state is the (3, classes) counts.
    """

    name = "f1"
    lower_is_better = False

    def _batch(self, label: Any, pred: Any) -> Any:
        classes = int(pred.shape[-1])
        guess = mx.nd.argmax(pred.reshape((-1, classes)), axis=-1)
        mask = mx.nd.ones_like(label) if self.pad_id is None else label != self.pad_id
        mask = mask.reshape((-1, 1))
        predicted = mx.nd.one_hot(guess, classes) * mask
        actual = mx.nd.one_hot(label, classes) * mask
        tp = mx.nd.sum(predicted * actual, axis=0)
        counts = mx.nd.stack(
            tp, mx.nd.sum(predicted, axis=0) - tp, mx.nd.sum(actual, axis=0) - tp, axis=0
        )
        return counts.astype(np.float64)

    def update(self, labels: Sequence[Any], preds: Sequence[Any]) -> None:
        """Add one batch: labels (B,) or (B, T), preds (B*T, C) probabilities; per device."""
        preds = _predictions(self.name, labels, preds)
        for label, pred in zip(labels, preds, strict=True):
            ctx = pred.context
            counts = self._batch(label.as_in_context(ctx).reshape((-1,)), pred)
            key = (ctx.device_type, ctx.device_id)
            for which, sums in (("epoch", self._epoch), ("interval", self._interval)):
                slot = sums.get(key)
                if slot is None:
                    slot = sums[key] = counts.copy()
                    restored = self._restored.pop(which, None)
                    if restored is not None:
                        slot = sums[key] = mx.nd.array(restored, ctx=ctx, dtype=np.float64)
                        slot += counts
                else:
                    slot += counts

    def _read(self, sums: _Counts, which: str) -> np.ndarray | None:
        total: np.ndarray | None = None
        for slot in sums.values():
            host = slot.asnumpy()
            total = host if total is None else total + host
        pending = self._restored.get(which)
        if pending is not None:
            total = pending if total is None else total + pending
        return total

    @staticmethod
    def _value(counts: np.ndarray | None) -> float:
        if counts is None:
            return math.nan
        tp, fp, fn = counts
        denominator = 2 * tp + fp + fn
        present = denominator > 0
        if not present.any():
            return math.nan
        return float(np.mean(2 * tp[present] / denominator[present]))

    def get(self) -> dict[str, float]:
        """The value since ``reset()`` (synchronises with the devices)."""
        return {self.name: self._value(self._read(self._epoch, "epoch"))}

    def get_interval(self) -> dict[str, float]:
        """The value since ``reset_interval()`` (synchronises with the devices)."""
        return {self.name: self._value(self._read(self._interval, "interval"))}

    def get_state(self) -> dict[str, list[list[float]] | None]:
        """The counts as JSON-able lists (None before the first batch), for a checkpoint."""
        out: dict[str, list[list[float]] | None] = {}
        for which, sums in (("epoch", self._epoch), ("interval", self._interval)):
            counts = self._read(sums, which)
            out[which] = None if counts is None else counts.tolist()
        return out

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore counts saved by ``get_state`` (replaces the current ones)."""
        self._epoch = {}
        self._interval = {}
        self._restored = {
            which: np.asarray(state[which], dtype=np.float64)
            for which in ("epoch", "interval")
            if state.get(which) is not None
        }


class StockMetric:
    """Adapter that lets a stock ``mx.metric.EvalMetric`` serve as an mxtrain metric.

    Stock metrics keep a "local" and a "global" sum: the global one is the epoch's
    (``get``/``reset``), the local one the log interval's (``get_interval``/``reset_interval``).
    They read predictions back on every batch (slower than the device metrics) and count
    padding rows like any other, so the built-ins are preferred where one fits.

    A single-valued metric is reported under ``name``, the ``fit.metrics`` entry that asked
    for it (``mxnet.metric:Accuracy``), so ``checkpoint.best_metric`` and
    ``fit.early_stopping.metric`` find it and it never shadows a built-in of the same name;
    a composite one under the names it gives.
    """

    _STATE = ("sum_metric", "num_inst", "global_sum_metric", "global_num_inst")

    def __init__(self, metric: Any, name: str) -> None:
        self.metric = metric
        self.name = name

    def _as_dict(self, names: Any, values: Any) -> dict[str, float]:
        if isinstance(names, str):
            return {self.name: float(values)}
        return {str(n): float(v) for n, v in zip(names, values, strict=True)}

    def update(self, labels: Sequence[Any], preds: Sequence[Any]) -> None:
        """Add one batch (lists of NDArrays, one per device), as stock metrics take it.

        A stock metric that cannot read this model's outputs (F1 or MAE on a language
        model's (tokens, vocabulary) probabilities) is the config's mistake: a ConfigError
        naming it and the shapes, not an internal error."""
        try:
            self.metric.update(list(labels), list(preds))
        except (ValueError, AssertionError, IndexError, TypeError, mx.base.MXNetError) as exc:
            shapes = ", ".join(
                f"labels {tuple(label.shape)} / predictions {tuple(pred.shape)}"
                for label, pred in zip(labels, preds, strict=False)
            )
            raise ConfigError(
                f"fit.metrics: the stock metric {self.name!r} cannot score this model's "
                f"outputs ({shapes}): {type(exc).__name__}: {exc}.",
                hint="Use a built-in metric that fits the task (mxtrain list metrics), or a "
                "stock metric made for these shapes.",
            ) from exc

    def get(self) -> dict[str, float]:
        return self._as_dict(*self.metric.get_global())

    def get_interval(self) -> dict[str, float]:
        return self._as_dict(*self.metric.get())

    def reset(self) -> None:
        self.metric.reset()

    def reset_interval(self) -> None:
        self.metric.reset_local()

    def get_state(self) -> dict[str, float]:
        """The running sums and counts (for a checkpoint)."""
        return {key: float(getattr(self.metric, key, 0)) for key in self._STATE}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore what ``get_state`` returned."""
        for key in self._STATE:
            if key in state:
                value = state[key]
                setattr(self.metric, key, int(value) if key.endswith("num_inst") else value)
