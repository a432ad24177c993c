"""BatchNorm moving statistics read right after a batch are that batch's, not the one before.

MXNet 1.9.1's oneDNN BatchNorm updates its moving mean/variance in the backward pass without
telling the engine it writes them (apache/mxnet#18610), so a copy pushed right after
``forward_backward`` read the previous values: checkpoints were one batch stale.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

from typing import Any

import mxnet as mx
import numpy as np

from mxtrain.engine.bucketing import BucketingModule

ROWS, WIDTH = 1024, 256  # big enough that the backward is still running when we read


def sym_gen(key: int) -> tuple[Any, tuple[str, ...], tuple[str, ...]]:
    hidden = mx.sym.FullyConnected(mx.sym.Variable("data"), num_hidden=WIDTH, name="fc1")
    hidden = mx.sym.BatchNorm(hidden, name="bn")
    out = mx.sym.FullyConnected(mx.sym.tanh(hidden), num_hidden=WIDTH, name="fc2")
    return mx.sym.LinearRegressionOutput(out, name="lro"), ("data",), ("lro_label",)


def test_the_backward_pass_is_what_moves_the_statistics() -> None:
    """The mechanism, checked directly: forward alone leaves them, backward changes them."""
    symbol, _, _ = sym_gen(1)
    ex = symbol.simple_bind(mx.cpu(), data=(8, 4), lro_label=(8, WIDTH))
    for array in ex.arg_dict.values():
        array[:] = mx.nd.random.normal(shape=array.shape)
    before = ex.aux_dict["bn_moving_mean"].asnumpy().copy()
    ex.forward(is_train=True)
    mx.nd.waitall()
    after_forward = ex.aux_dict["bn_moving_mean"].asnumpy().copy()
    ex.backward()
    mx.nd.waitall()
    after_backward = ex.aux_dict["bn_moving_mean"].asnumpy()
    assert np.array_equal(before, after_forward)
    assert not np.array_equal(after_forward, after_backward)


def test_get_params_right_after_a_batch_sees_its_statistics() -> None:
    mx.random.seed(0)
    mod = BucketingModule(sym_gen, 1)
    mod.bind([("data", (ROWS, WIDTH))], [("lro_label", (ROWS, WIDTH))])
    mod.init_params(mx.init.Xavier())
    mod.init_optimizer(None, "sgd", {"learning_rate": 0.01})
    batch = mx.io.DataBatch(
        [mx.nd.random.normal(shape=(ROWS, WIDTH))], [mx.nd.random.normal(shape=(ROWS, WIDTH))]
    )
    stale = 0
    for _ in range(5):
        mod.forward_backward(batch)
        mod.update()
        early = mod.get_params()[1]["bn_moving_mean"].asnumpy()
        mx.nd.waitall()
        settled = mod.get_params()[1]["bn_moving_mean"].asnumpy()
        stale += not np.array_equal(early, settled)
    assert stale == 0
