"""A Gluon block on more than one device: two CPU contexts and a dist_sync job on loopback
train it as one process does (within the rounding bound of the gradients' other summation
order)."""

from __future__ import annotations

from pathlib import Path

import pytest
from float_bounds import assert_params_close, mlp_chain_roundings
from launch_helpers import load_params, mxtrain

# every process a test starts is killed afterwards, even when an assertion failed
pytestmark = pytest.mark.usefixtures("reaper")

BLOCK = """\
from mxnet.gluon import nn


def mlp(data_info, hidden=8):
    net = nn.HybridSequential()
    with net.name_scope():
        net.add(nn.Dense(hidden, activation="relu"), nn.Dense(data_info.num_classes))
    return net
"""

CONFIG = """\
experiment: {{name: {name}, seed: 5, runs_dir: {runs}}}
model: {{name: block.py:mlp}}
data:
  train: {{iterator: ndarray, source: x.npy, labels: y.npy, batch_size: {batch}}}
optimizer: {{name: sgd, learning_rate: 0.2, momentum: 0.9}}
fit: {{num_epoch: 2, log_interval: 2}}
"""


def write(blobs: Path, name: str, batch: int) -> Path:
    (blobs / "block.py").write_text(BLOCK)
    path = blobs / f"{name}.yaml"
    path.write_text(CONFIG.format(name=name, runs=blobs / "runs", batch=batch))
    return path


def test_a_gluon_block_on_two_contexts_and_in_a_dist_sync_job_trains_as_one_process(
    blobs: Path,
) -> None:
    single = mxtrain("fit", write(blobs, "single", 16), "--progress", "quiet")
    assert single.returncode == 0, single.stdout + single.stderr
    two = mxtrain("fit", write(blobs, "two", 16), "--set", "context.count=2", "--progress", "quiet")
    assert two.returncode == 0, two.stdout + two.stderr
    dist = mxtrain(
        "launch", "-n", 2, "-s", 1, write(blobs, "dist", 8), "--set", "kvstore.type=dist_sync",
        "--grace", 3,
    )  # fmt: skip
    assert dist.returncode == 0, dist.stdout + dist.stderr
    runs = blobs / "runs"
    one = load_params(runs / "single/model-0002.params")
    assert "hybridsequential0_dense0_weight" in one
    # 96 rows in batches of 16 for 2 epochs: 12 steps, each summing the gradient in two halves
    bound = 12 * mlp_chain_roundings(6, [8], 3, 16)
    for other in ("two", "dist"):
        assert_params_close(load_params(runs / other / "model-0002.params"), one, roundings=bound,
                            context=other)  # fmt: skip
