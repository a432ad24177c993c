"""Data parallel on several CPU contexts: the same parameters as one context, same batch."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

from pathlib import Path
from typing import Any

import mxnet as mx
import numpy as np
import pytest
from click.testing import CliRunner
from float_bounds import assert_params_close, mlp_chain_roundings

from mxtrain.cli.main import cli
from mxtrain.engine.bucketing import BucketingModule

BATCH = 8
STEPS = 6


def mlp_sym_gen(key: int) -> tuple[Any, tuple[str, ...], tuple[str, ...]]:
    data = mx.sym.Variable("data")
    hidden = mx.sym.Activation(mx.sym.FullyConnected(data, num_hidden=6, name="fc1"), "relu")
    out = mx.sym.FullyConnected(hidden, num_hidden=3, name="fc2")
    return mx.sym.SoftmaxOutput(out, name="softmax"), ("data",), ("softmax_label",)


def train(contexts: list[Any], kvstore: str, update_on_kvstore: bool | None) -> dict[str, Any]:
    rng = np.random.RandomState(0)
    mod = BucketingModule(mlp_sym_gen, 0, contexts)
    mod.bind([("data", (BATCH, 5))], [("softmax_label", (BATCH,))])
    mx.random.seed(3)
    mod.init_params(mx.init.Xavier())
    mod.init_optimizer(
        kvstore=kvstore,
        optimizer="sgd",
        optimizer_params={"learning_rate": 0.5, "momentum": 0.9, "wd": 1e-3},
        update_on_kvstore=update_on_kvstore,
    )
    for _ in range(STEPS):
        batch = mx.io.DataBatch(
            [mx.nd.array(rng.normal(size=(BATCH, 5)))],
            [mx.nd.array(rng.randint(0, 3, size=BATCH))],
        )
        mod.forward_backward(batch)
        mod.update()
    arg, _ = mod.get_params()
    return {k: v.asnumpy() for k, v in arg.items()}


# Two contexts sum each half batch's gradient, then the halves: another order than one
# context's sum over the batch, at every step; a step's chain of roundings times the steps.
MODULE_ROUNDINGS = STEPS * mlp_chain_roundings(5, [6], 3, BATCH)


@pytest.mark.parametrize(
    ("kvstore", "update_on_kvstore"),
    [("local", None), ("local", False), ("device", None), ("device", False)],
)
def test_two_cpu_contexts_equal_one(kvstore: str, update_on_kvstore: bool | None) -> None:
    one = train([mx.cpu(0)], kvstore, update_on_kvstore)
    two = train([mx.cpu(0), mx.cpu(1)], kvstore, update_on_kvstore)
    assert_params_close(two, one, roundings=MODULE_ROUNDINGS)


def test_two_contexts_with_a_different_batch_do_differ() -> None:
    """The comparison above can fail: a different update is outside its bound."""
    one = train([mx.cpu(0)], "local", None)
    global BATCH
    saved, BATCH = BATCH, 4
    try:
        other = train([mx.cpu(0), mx.cpu(1)], "local", None)
    finally:
        BATCH = saved
    with pytest.raises(AssertionError):
        assert_params_close(other, one, roundings=MODULE_ROUNDINGS)


CONFIG = """\
experiment: {{name: md, seed: 2, runs_dir: {runs}}}
model: {{name: mlp, hidden: [8], activation: relu}}
data:
  train: {{iterator: ndarray, source: {x}, labels: {y}, batch_size: 12}}
optimizer: {{name: sgd, learning_rate: 0.3, momentum: 0.9}}
fit: {{num_epoch: 2, log_interval: 50}}
"""


@pytest.mark.parametrize("kvstore", ["local", "device"])
def test_fit_with_context_count_2_equals_count_1(tmp_path: Path, kvstore: str) -> None:
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 3, size=60)
    np.save(tmp_path / "x.npy", (rng.normal(size=(60, 4)) + labels[:, None]).astype(np.float32))
    np.save(tmp_path / "y.npy", labels)
    config = tmp_path / "md.yaml"
    config.write_text(
        CONFIG.format(runs=tmp_path / "runs", x=tmp_path / "x.npy", y=tmp_path / "y.npy")
    )
    runner = CliRunner()
    params = {}
    for count in (1, 2):
        result = runner.invoke(
            cli,
            ["fit", str(config), "--name", f"c{count}", "--progress", "quiet",
             "--set", f"context.count={count}", "--set", f"kvstore.type={kvstore}"],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        loaded = mx.nd.load(str(tmp_path / "runs" / f"c{count}" / "model-0002.params"))
        params[count] = {k: v.asnumpy() for k, v in loaded.items()}
    # 60 rows in batches of 12 for 2 epochs: 10 steps, each summing the gradient in halves
    assert_params_close(params[2], params[1], roundings=10 * mlp_chain_roundings(4, [8], 3, 12))
