"""Your own model, data iterator and metric, used from configs/plugin_example.yaml.

mxtrain calls a model factory as ``factory(data_info, **options)`` and an iterator factory as
``factory(context, **options)``, where the options are the other keys of the YAML section
(checked against the function's keyword parameters, so a misspelled key is an error with a
suggestion); a metric class is called as ``cls()`` (``cls(pad_id=...)`` when it takes
``pad_id``). Reference them as ``file.py:attr`` (relative to the config) or
``package.module:attr``. docs/plugins.md lists the whole contract; each piece
of it is marked "contract:" below.

Here: a residual MLP; an iterator that generates the classic "spirals" problem (points on
``arms`` interleaved spiral arms, one class per arm) from a seed, or reads points from an
``.npz``/``.npy`` file (``source``), which is what ``mxtrain score --data`` and
``mxtrain predict --input`` pass; and a metric counting misclassified points. Run it with::

    mxtrain fit configs/plugin_example.yaml
    python configs/plugin_example.py points.npz      # writes 200 labelled points
    mxtrain score runs/plugin_example --data points.npz
    mxtrain predict --checkpoint runs/plugin_example --input points.npz --output arms.jsonl

The run folder keeps a copy of this file (``plugins/plugin_example.py``), which resume,
score and predict load, so later edits here do not change the trained run.
"""

from __future__ import annotations

import sys
from pathlib import Path

import mxnet as mx
import numpy as np

from mxtrain.data.base import DataContext, DataInfo
from mxtrain.errors import DataError

PAD_LABEL = -1  # labels of padding rows (and of every row when predicting): ignored


def residual_mlp(data_info: DataInfo, hidden: int = 64, blocks: int = 2):
    """sym_gen for ``blocks`` residual blocks of two FullyConnected layers each."""

    def sym_gen(bucket_key):
        # contract: return (symbol, data_names, label_names); the names are the iterator's
        # provide_data / provide_label names, the symbol's output is the class softmax.
        data = mx.sym.Variable("data")
        label = mx.sym.Variable("softmax_label")
        x = mx.sym.Activation(mx.sym.FullyConnected(data, num_hidden=hidden, name="inp"), "relu")
        for i in range(blocks):
            h = mx.sym.Activation(
                mx.sym.FullyConnected(x, num_hidden=hidden, name=f"block{i}_a"), "relu"
            )
            x = mx.sym.Activation(
                x + mx.sym.FullyConnected(h, num_hidden=hidden, name=f"block{i}_b"), "relu"
            )
        logits = mx.sym.FullyConnected(x, num_hidden=data_info.num_classes, name="out")
        out = mx.sym.SoftmaxOutput(
            logits, label, use_ignore=True, ignore_label=PAD_LABEL, name="softmax"
        )
        return out, ("data",), ("softmax_label",)

    return sym_gen


def make_spirals(seed: int, rows: int, arms: int, noise: float) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` points (float32 (rows, 2)) and their arms (int64 (rows,))."""
    rng = np.random.default_rng(seed)
    label = rng.integers(0, arms, rows)
    radius = rng.uniform(0.05, 1.0, rows)
    angle = 3.0 * radius + 2.0 * np.pi * label / arms + rng.normal(0, noise, rows)
    points = np.stack([radius * np.cos(angle), radius * np.sin(angle)], 1).astype(np.float32)
    return points, label


def read_points(path: Path, need_labels: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """Points from an ``.npz`` (``data`` and, for scoring, ``label``) or an ``.npy`` (points)."""
    try:
        loaded = np.load(path, allow_pickle=False)  # contract: never unpickle user files
        if isinstance(loaded, np.ndarray):
            points, labels = loaded, None
        else:
            with loaded:
                points = loaded["data"]
                labels = loaded["label"] if "label" in loaded.files else None
    except (OSError, ValueError, KeyError, EOFError) as exc:
        # contract: bad data is a DataError (exit 3) naming the file and what to fix
        raise DataError(
            f"{path}: not a file of spiral points ({exc}).",
            hint="Give an .npz with 'data' (rows, 2) and 'label' (rows,), or an .npy of points.",
        ) from None
    if points.ndim != 2 or points.shape[1] != 2 or points.shape[0] == 0:
        raise DataError(f"{path}: the points have shape {points.shape}, not (rows, 2).")
    if need_labels and labels is None:
        raise DataError(f"{path}: there is no 'label' array to score against.")
    return points.astype(np.float32), labels


class SpiralIter(mx.io.DataIter):
    """Points with their arm as label, in batches; shuffled by (seed, epoch) for training."""

    def __init__(
        self,
        points: np.ndarray,
        labels: np.ndarray | None,
        *,
        arms: int,
        batch_size: int,
        seed: int,
        shuffle: bool,
        source: str,
    ):
        super().__init__(batch_size)
        self.points, self.labels = points, labels
        self.seed, self.shuffle = seed, shuffle
        # contract (predict): num_rows, the number of input rows; source, what was read
        self.num_rows = len(points)
        self.source = source
        self.order = np.arange(self.num_rows)
        self.cursor = 0
        # contract: one bucket key per batch shape; the default is the largest
        self.default_bucket_key = 2
        self.provide_data = [mx.io.DataDesc("data", (batch_size, 2))]
        self.provide_label = [mx.io.DataDesc("softmax_label", (batch_size,))]
        # contract: data_info sizes the model; task "classify" lets predict write labels
        self.data_info = DataInfo(num_classes=arms, pad_id=PAD_LABEL, task="classify")

    def set_epoch(self, epoch: int) -> None:
        """contract (optional): called before each training epoch; order from (seed, epoch)
        so that a resumed run sees the same batches as an uninterrupted one."""
        if self.shuffle:
            self.order = np.random.default_rng((self.seed, epoch)).permutation(self.num_rows)

    def reset(self) -> None:
        self.cursor = 0

    def next(self) -> mx.io.DataBatch:
        if self.cursor >= self.num_rows:
            raise StopIteration
        rows = self.order[self.cursor : self.cursor + self.batch_size]
        self.cursor += self.batch_size
        pad = self.batch_size - len(rows)
        data = np.zeros((self.batch_size, 2), np.float32)
        label = np.full(self.batch_size, PAD_LABEL, np.float32)  # ignored by loss and metrics
        data[: len(rows)] = self.points[rows]
        if self.labels is not None:
            label[: len(rows)] = self.labels[rows]
        # contract (predict): index, the input row of each batch row, -1 for padding rows
        index = np.full(self.batch_size, -1, np.int64)
        index[: len(rows)] = rows
        return mx.io.DataBatch(
            [mx.nd.array(data)],
            [mx.nd.array(label)],
            pad=pad,
            index=index,
            bucket_key=2,
            provide_data=self.provide_data,
            provide_label=self.provide_label,
        )

    def describe(self) -> str:
        """contract (optional): one line for the log."""
        return f"{self.source}: {self.num_rows} points, batches of {self.batch_size}"


def spirals(
    context: DataContext,
    source: str | None = None,
    rows: int = 3000,
    arms: int = 3,
    noise: float = 0.1,
    batch_size: int = 50,
) -> SpiralIter:
    """Generated points (``source: null``; eval uses another seed), or the points of a file.

    contract: ``source`` and ``batch_size`` are the options that ``score --data``,
    ``predict --input`` and ``--batch-size`` replace, so list them in the YAML section. With
    ``context.role == "predict"`` read the file in order, without labels, never shuffled.
    """
    if source is None:
        seed = context.seed + (0 if context.role == "train" else 1000)
        points, labels = make_spirals(seed, rows, arms, noise)
        name = f"spirals(seed={seed})"
    else:
        path = Path(source)
        path = path if path.is_absolute() else context.base_dir / path  # config-relative
        predict = context.role == "predict"
        points, labels = read_points(path, need_labels=not predict)
        labels = None if predict else labels
        name = str(path)
    return SpiralIter(
        points,
        labels,
        arms=arms,
        batch_size=batch_size,
        seed=context.seed,
        shuffle=context.role == "train",
        source=name,
    )


class MisclassifiedPoints:
    """The fraction of points whose most probable arm is wrong (``fit.metrics: [...]``).

    contract: ``name``; ``update(labels, preds)`` with one label and one output array per
    device; ``get()`` / ``get_interval()`` return ``{name: value}`` for the epoch / the log
    interval; ``reset()`` / ``reset_interval()``; ``get_state()`` returns the running sums as
    JSON and ``set_state()`` restores them (a mid-epoch checkpoint saves them). Built-in
    metrics keep their sums on the device; this one reads every batch back, which is simpler
    and fine for small outputs.
    """

    name = "misclassified"

    def __init__(self, pad_id: int | None = PAD_LABEL) -> None:
        self.pad_id = pad_id
        self.epoch = [0.0, 0.0]  # wrong, counted
        self.interval = [0.0, 0.0]

    def update(self, labels, preds) -> None:
        for label, pred in zip(labels, preds, strict=True):
            truth = label.asnumpy().reshape(-1)
            guess = pred.asnumpy().argmax(axis=1)
            real = truth != self.pad_id
            wrong = float((guess[real] != truth[real]).sum())
            for sums in (self.epoch, self.interval):
                sums[0] += wrong
                sums[1] += float(real.sum())

    def _value(self, sums: list[float]) -> dict[str, float]:
        return {self.name: sums[0] / sums[1] if sums[1] else float("nan")}

    def get(self) -> dict[str, float]:
        return self._value(self.epoch)

    def get_interval(self) -> dict[str, float]:
        return self._value(self.interval)

    def reset(self) -> None:
        self.epoch = [0.0, 0.0]
        self.interval = [0.0, 0.0]

    def reset_interval(self) -> None:
        self.interval = [0.0, 0.0]

    def get_state(self) -> dict[str, list[float]]:
        return {"epoch": list(self.epoch), "interval": list(self.interval)}

    def set_state(self, state: dict[str, list[float]]) -> None:
        self.epoch = [float(v) for v in state["epoch"]]
        self.interval = [float(v) for v in state["interval"]]


if __name__ == "__main__":  # python configs/plugin_example.py points.npz [rows] [seed]
    out = Path(sys.argv[1])
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    points, labels = make_spirals(int(sys.argv[3]) if len(sys.argv) > 3 else 7, count, 3, 0.1)
    np.savez(out, data=points, label=labels)
    print(f"wrote {count} labelled points to {out}")
