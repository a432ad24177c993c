"""``mxtrain predict`` records for row-wise models: classifiers and regressors.

:mod:`mxtrain.inference.predict` picks these by the data iterator's ``data_info.task``
(``classify``, ``regress``; the ``ndarray`` and ``csv`` iterators report them). One record per
input row, in input order; ``line`` is the row's 1-based number among the input's rows (for a
CSV file: data rows, so the header and blank lines are not counted; for ``.npy``/``.npz``: the
array's first axis).

* ``classify``: ``label`` (the most probable class id) and ``probabilities`` (all classes, in
  class order), or with ``--top-k K`` ``top``: the K most probable ``[label, prob]`` pairs, most
  probable first, instead of ``probabilities``.
* ``regress``: ``value``: a float per row, or a list of K floats for K targets per row.

With ``--top-k`` only the top-k values leave the device, otherwise the whole ``(batch,
classes)`` softmax does (a classifier's class count is small).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from mxtrain.errors import ConfigError
from mxtrain.inference.output import shortest_float32
from mxtrain.inference.predict_loop import predict_batches


def _rows(data_iter: Any) -> int:
    count = getattr(data_iter, "num_rows", None)
    if count is None:
        raise ConfigError(
            "The data iterator does not report how many rows it read (num_rows), so "
            "predictions cannot be aligned with the input rows."
        )
    return int(count)


def _place(seen: np.ndarray, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mask of the batch's real rows, their input rows); each input row comes once."""
    real = index >= 0
    where = index[real]
    if seen[where].any():
        raise RuntimeError(f"input rows {where[seen[where]].tolist()} came twice")
    seen[where] = True
    return real, where


def _check_all(seen: np.ndarray) -> None:
    if not seen.all():
        missing = np.flatnonzero(~seen)
        raise RuntimeError(f"no prediction for input rows {missing[:10].tolist()}")


def _predict_rows(
    opened: Any,
    reduce: Callable[[Any], Any],
    collect: Callable[[np.ndarray, Any], None],
    seen: np.ndarray,
) -> None:
    """Run every batch: ``reduce`` the first output on the device, ``collect`` it into the
    rows of ``seen`` (one batch in flight); every input row must get its prediction."""
    predict_batches(
        opened,
        lambda module, batch: reduce(module.get_outputs()[0]),
        collect,
        unit="the input row of each batch row",
    )
    _check_all(seen)


# --------------------------------------------------------------------------------------------
# Classification
# --------------------------------------------------------------------------------------------


@dataclass
class ClassPredictions:
    """Per input row: the predicted class and its probabilities (or the top-k)."""

    labels: np.ndarray  # int64 [n]
    probs: np.ndarray  # float32 [n, classes], or [n, k] with top_k
    top_labels: np.ndarray | None  # int64 [n, k] with top_k
    top_k: int

    def totals(self) -> tuple[int, int, int, float]:
        return int(self.labels.size), 0, 0, 0.0

    def records(self) -> Iterator[dict[str, Any]]:
        for i in range(self.labels.size):
            record: dict[str, Any] = {"line": i + 1, "label": int(self.labels[i])}
            if self.top_labels is not None:
                record["top"] = [
                    [int(c), shortest_float32(p)]
                    for c, p in zip(self.top_labels[i], self.probs[i], strict=True)
                ]
            else:
                record["probabilities"] = [shortest_float32(p) for p in self.probs[i]]
            yield record

    def csv_header(self) -> list[str]:
        if self.top_labels is not None:
            return ["line", "label", "top"]
        return ["line", "label", *(f"prob_{c}" for c in range(self.probs.shape[1]))]

    def csv_rows(self) -> Iterator[list[Any]]:
        for record in self.records():
            row = [record["line"], record["label"]]
            if self.top_labels is not None:
                row.append(" ".join(f"{c}:{p}" for c, p in record["top"]))
            else:
                row.extend(record["probabilities"])
            yield row

    def to_numpy(self) -> np.ndarray:
        n, width = self.probs.shape
        fields: list[tuple[Any, ...]] = [("line", "<i8"), ("label", "<i8")]
        if self.top_labels is not None:
            fields += [("top_label", "<i8", (width,)), ("top_prob", "<f4", (width,))]
        else:
            fields += [("probabilities", "<f4", (width,))]
        out = np.zeros(n, dtype=fields)
        out["line"] = np.arange(1, n + 1)
        out["label"] = self.labels
        if self.top_labels is not None:
            out["top_label"] = self.top_labels
            out["top_prob"] = self.probs
        else:
            out["probabilities"] = self.probs
        return out


def predict_classes(opened: Any, top_k: int) -> ClassPredictions:
    """Run a classifier's predict iterator through its module; rows in input order."""
    # deferred: MXNet reads its thread settings when it loads (devices.configure_threads first)
    import mxnet as mx

    info = opened.data_iter.data_info
    classes = int(info.num_classes or 0)
    if classes < 1:
        raise ConfigError("The data iterator does not report num_classes for this classifier.")
    if top_k > classes:
        raise ConfigError(
            f"--top-k {top_k} asks for more classes than the model has ({classes}).",
            hint=f"Use --top-k {classes} or less (0: all probabilities).",
        )
    n = _rows(opened.data_iter)
    width = top_k or classes
    labels = np.full(n, -1, dtype=np.int64)
    probs = np.full((n, width), np.nan, dtype=np.float32)
    top_labels = np.full((n, width), -1, dtype=np.int64) if top_k else None
    seen = np.zeros(n, dtype=bool)

    def reduce(out: Any) -> tuple[Any, ...]:
        if out.ndim != 2 or out.shape[1] != classes:
            raise ConfigError(
                f"The model's output has shape {out.shape}; a classifier must output "
                f"(batch, {classes}) probabilities.",
                hint="mxtrain predict reads the model as a classifier because its data "
                "iterator says task 'classify'.",
            )
        best = mx.nd.argmax(out, axis=1)
        if top_k:
            values, ids = mx.nd.topk(out, k=top_k, ret_typ="both", axis=1)
            return best, values, ids
        return best, out.copy(), None  # a copy: the next forward overwrites the output

    def collect(index: np.ndarray, parts: tuple[Any, ...]) -> None:
        best, values, ids = parts
        real, where = _place(seen, index)
        labels[where] = np.rint(best.asnumpy()[real]).astype(np.int64)
        probs[where] = values.asnumpy()[real]
        if top_labels is not None:
            top_labels[where] = np.rint(ids.asnumpy()[real]).astype(np.int64)

    _predict_rows(opened, reduce, collect, seen)
    return ClassPredictions(labels, probs, top_labels, top_k)


# --------------------------------------------------------------------------------------------
# Regression
# --------------------------------------------------------------------------------------------


@dataclass
class ValuePredictions:
    """Per input row: the predicted value(s)."""

    values: np.ndarray  # float32 [n] or [n, K]

    def totals(self) -> tuple[int, int, int, float]:
        return int(self.values.shape[0]), 0, 0, 0.0

    def _value(self, i: int) -> float | list[float] | None:
        row = self.values[i]
        if row.ndim == 0:
            value = shortest_float32(row)
            return value if math.isfinite(value) else None
        return [shortest_float32(v) for v in row]

    def records(self) -> Iterator[dict[str, Any]]:
        for i in range(self.values.shape[0]):
            yield {"line": i + 1, "value": self._value(i)}

    def csv_header(self) -> list[str]:
        if self.values.ndim == 1:
            return ["line", "value"]
        return ["line", *(f"value_{k}" for k in range(self.values.shape[1]))]

    def csv_rows(self) -> Iterator[list[Any]]:
        for record in self.records():
            value = record["value"]
            yield [record["line"], *(value if isinstance(value, list) else [value])]

    def to_numpy(self) -> np.ndarray:
        n = self.values.shape[0]
        shape = tuple(self.values.shape[1:])
        value: tuple[Any, ...] = ("value", "<f4", shape) if shape else ("value", "<f4")
        out = np.zeros(n, dtype=[("line", "<i8"), value])
        out["line"] = np.arange(1, n + 1)
        out["value"] = self.values
        return out


def predict_values(opened: Any, top_k: int) -> ValuePredictions:
    """Run a regressor's predict iterator through its module; rows in input order."""
    if top_k:
        raise ConfigError(
            "--top-k lists the most probable classes of a classifier; this model is a "
            "regressor (task 'regress').",
            hint="Leave --top-k out.",
        )
    info = opened.data_iter.data_info
    shape = tuple(getattr(info, "label_shape", ()) or ())
    n = _rows(opened.data_iter)
    values = np.full((n, *shape), np.nan, dtype=np.float32)
    seen = np.zeros(n, dtype=bool)

    def reduce(out: Any) -> Any:
        if tuple(out.shape[1:]) != shape:
            want = f"(batch, {', '.join(map(str, shape))})" if shape else "(batch,)"
            raise ConfigError(
                f"The model's output has shape {out.shape}; a regressor of this data must "
                f"output {want} values."
            )
        return out.copy()  # the next forward overwrites the output itself

    def collect(index: np.ndarray, out: Any) -> None:
        real, where = _place(seen, index)
        values[where] = out.asnumpy()[real]

    _predict_rows(opened, reduce, collect, seen)
    return ValuePredictions(values)
