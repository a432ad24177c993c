"""A hand-made batch for module tests that feed arrays straight to BucketingModule."""

from __future__ import annotations

import mxnet as mx
import numpy as np


class ArrayBatch:
    """One data and one label array as a batch of bucket 1, no padding."""

    def __init__(self, data: np.ndarray, label: np.ndarray) -> None:
        self.data, self.label = [mx.nd.array(data)], [mx.nd.array(label)]
        self.bucket_key = 1
        self.provide_data = [mx.io.DataDesc("data", data.shape)]
        self.provide_label = [mx.io.DataDesc("label", label.shape)]
        self.pad = 0


def initialised_module(sym_gen, devices: int, rows: int, features: int, outputs: int):  # type: ignore[no-untyped-def]
    """A BucketingModule of ``sym_gen`` on ``devices`` CPU contexts, bound to (rows,
    features) data and (rows, outputs) labels, its parameters drawn from U(-1, 1) with seed
    0; returns it with a copy of its starting parameters."""
    from mxtrain.engine.bucketing import BucketingModule

    module = BucketingModule(sym_gen, 1, [mx.cpu(i) for i in range(devices)])
    module.bind([("data", (rows, features))], [("label", (rows, outputs))])
    mx.random.seed(0)
    module.init_params(mx.init.Uniform(1.0))
    start = {k: v.asnumpy() for k, v in module.get_params()[0].items()}
    return module, start
