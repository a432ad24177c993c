"""Your own model and data iterator, used from configs/plugin_example.yaml.

mxtrain calls a model factory as ``factory(data_info, **options)`` and an iterator factory as
``factory(context, **options)``, where the options are the other keys of the YAML section
(checked against the function's keyword parameters, so a misspelled key is an error with a
suggestion). Reference them as ``file.py:attr`` (relative to the config) or
``package.module:attr``.

Here: a residual MLP and an iterator that generates the classic "spirals" problem (points on
``arms`` interleaved spiral arms, one class per arm) from a seed, so the example needs no data
files. Run it with ``mxtrain fit configs/plugin_example.yaml``.
"""

from __future__ import annotations

import mxnet as mx
import numpy as np

from mxtrain.data.base import DataContext, DataInfo


def residual_mlp(data_info: DataInfo, hidden: int = 64, blocks: int = 2):
    """sym_gen for ``blocks`` residual blocks of two FullyConnected layers each."""

    def sym_gen(bucket_key):
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
        out = mx.sym.SoftmaxOutput(logits, label, use_ignore=True, ignore_label=-1, name="softmax")
        return out, ("data",), ("softmax_label",)

    return sym_gen


class SpiralIter(mx.io.DataIter):
    """Points on interleaved spiral arms; the label is the arm. Seeded, so runs repeat."""

    def __init__(self, seed: int, rows: int, arms: int, noise: float, batch_size: int):
        super().__init__(batch_size)
        rng = np.random.default_rng(seed)
        label = rng.integers(0, arms, rows)
        radius = rng.uniform(0.05, 1.0, rows)
        angle = 3.0 * radius + 2.0 * np.pi * label / arms + rng.normal(0, noise, rows)
        self.data = np.stack([radius * np.cos(angle), radius * np.sin(angle)], 1)
        self.label = label.astype(np.float32)
        self.seed = seed
        self.order = np.arange(rows)
        self.cursor = 0
        self.default_bucket_key = 2  # one bucket: the number of features
        self.provide_data = [mx.io.DataDesc("data", (batch_size, 2))]
        self.provide_label = [mx.io.DataDesc("softmax_label", (batch_size,))]
        self.data_info = DataInfo(num_classes=arms, pad_id=-1, task="classify")
        self.num_batches = -(-rows // batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Shuffle from (seed, epoch) so a resumed run sees the same order."""
        self.order = np.random.default_rng((self.seed, epoch)).permutation(len(self.label))

    def reset(self) -> None:
        self.cursor = 0

    def next(self) -> mx.io.DataBatch:
        if self.cursor >= len(self.order):
            raise StopIteration
        rows = self.order[self.cursor : self.cursor + self.batch_size]
        self.cursor += self.batch_size
        pad = self.batch_size - len(rows)
        data = np.zeros((self.batch_size, 2), np.float32)
        label = np.full(self.batch_size, -1, np.float32)  # -1: ignored by loss and metrics
        data[: len(rows)] = self.data[rows]
        label[: len(rows)] = self.label[rows]
        return mx.io.DataBatch(
            [mx.nd.array(data)],
            [mx.nd.array(label)],
            pad=pad,
            bucket_key=2,
            provide_data=self.provide_data,
            provide_label=self.provide_label,
        )


def spirals(
    context: DataContext,
    rows: int = 3000,
    arms: int = 3,
    noise: float = 0.1,
    batch_size: int = 50,
) -> SpiralIter:
    """Train and eval data from different seeds (eval points are new points)."""
    seed = context.seed + (0 if context.role == "train" else 1000)
    return SpiralIter(seed, rows, arms, noise, batch_size)
