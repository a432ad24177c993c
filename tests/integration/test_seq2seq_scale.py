"""rnn_seq2seq on parallel_text at scale: two CPU contexts and `dist_sync` with two workers
on loopback against one process, and `fit.bucket_memory` with 2-D (source, target) keys.

The exact statements, and why they are these:
- A worker's part of a bucket is every num_parts-th pair of the epoch's order of that bucket,
  cut into batches; one process with num_parts times the batch size cuts the same order
  into batches that are exactly the union of the workers' k-th batches (the same buckets in
  the same order, every part having the same number of batches). Tested on the iterator.
- So the sum of the workers' (or devices') gradients is the combined batch's gradient,
  summed in another order: the loss head sums over the real labels (no per-executor
  division), and rescale_grad = 1 / (batch x workers) averages.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import random
from pathlib import Path
from typing import Any

import mxnet as mx
import numpy as np
import pytest
from click.testing import CliRunner
from float_bounds import assert_params_close, rnn_chain_roundings
from launch_helpers import load_params, mxtrain

from mxtrain.cli.main import cli
from mxtrain.data.base import DataContext
from mxtrain.data.parallel_text import build_parallel_text_iter
from mxtrain.data.parallel_text_options import ParallelTextOptions
from mxtrain.engine.bucketing import BucketingModule
from mxtrain.models.rnn_seq2seq import build_rnn_seq2seq
from mxtrain.models.seq2seq_options import RnnSeq2SeqOptions

WORDS = list("abcdefg")
PAIRS = 120
EMBED = HIDDEN = 8

SHIPPED_MODEL = "{name: rnn_seq2seq, num_embed: 8, num_hidden: 8, attention: mlp, dropout: 0}"
CONFIG = """\
experiment: {{name: {name}, seed: 4, runs_dir: {runs}}}
model: {model}
data:
  train: {{iterator: parallel_text, source: {folder}/train.src, target: {folder}/train.tgt,
          batch_size: {batch}, buckets: auto, num_buckets: 6}}
optimizer: {{name: sgd, learning_rate: 0.5}}
kvstore: {{type: {kvstore}}}
fit: {{num_epoch: {epochs}, log_interval: 100}}
"""


def write_pairs(folder: Path, count: int = PAIRS, seed: int = 1) -> Path:
    """Reversal pairs of 1 to 7 words."""
    rng = random.Random(seed)
    sources = [[rng.choice(WORDS) for _ in range(rng.randint(1, 7))] for _ in range(count)]
    (folder / "train.src").write_text("".join(" ".join(s) + "\n" for s in sources))
    (folder / "train.tgt").write_text("".join(" ".join(s[::-1]) + "\n" for s in sources))
    return folder


def write_config(folder: Path, name: str, *, model: str, batch: int, kvstore: str = "local",
                 epochs: int = 1) -> Path:  # fmt: skip
    path = folder / f"{name}.yaml"
    path.write_text(CONFIG.format(name=name, runs=folder / "runs", folder=folder, model=model,
                                  batch=batch, kvstore=kvstore, epochs=epochs))  # fmt: skip
    return path


def steps_roundings(steps: int, batch: int) -> int:
    """A training step's chain of roundings (the bidirectional encoder over at most 7
    source positions, the decoder over at most 8 target positions, attention over the 7
    source positions at each, the output layer), times the steps."""
    encoder = rnn_chain_roundings(7, batch, 0, num_embed=EMBED, num_hidden=HIDDEN,
                                  num_layers=1, directions=2)  # fmt: skip
    decoder = rnn_chain_roundings(8, batch, len(WORDS) + 4, num_embed=EMBED, num_hidden=HIDDEN,
                                  num_layers=1)  # fmt: skip
    return steps * (encoder + decoder + 8 * 7 * 2 * HIDDEN)


# -- sharding: the workers' batches are the combined batch's ---------------------------------


def parallel_iter(folder: Path, batch: int, parts: int = 1, part: int = 0, **kw: Any) -> Any:
    kw.setdefault("num_buckets", 6)
    options = ParallelTextOptions(source="train.src", target="train.tgt", batch_size=batch,
                                  num_parts=parts, part_index=part, **kw)  # fmt: skip
    return build_parallel_text_iter(options, DataContext(role="train", seed=4, base_dir=folder))


@pytest.mark.parametrize("last_batch", ["short", "pad"])
def test_the_workers_batches_are_the_combined_batches_split(
    tmp_path: Path, last_batch: str
) -> None:
    folder = write_pairs(tmp_path)
    one = parallel_iter(folder, 8, last_batch=last_batch)
    workers = [parallel_iter(folder, 4, 2, p, last_batch=last_batch) for p in (0, 1)]
    assert len(one.buckets) > 3  # a 2-D grid of buckets, several batches each
    for epoch in (0, 1, 2):
        batches = []
        for it in (one, *workers):
            it.set_epoch(epoch)
            it.reset()
            batches.append([(b.bucket_key, [int(i) for i in b.index if i >= 0]) for b in it])
        assert len(batches[0]) == len(batches[1]) == len(batches[2])
        for combined, *halves in zip(*batches, strict=True):
            assert combined[0] == halves[0][0] == halves[1][0]  # the same bucket
            assert sorted(combined[1]) == sorted(halves[0][1] + halves[1][1])


# -- two CPU contexts --------------------------------------------------------------------------


def fit_params(config: Path, name: str, *sets: str) -> dict[str, np.ndarray]:
    args = [a for s in sets for a in ("--set", s)]
    result = CliRunner().invoke(cli, ["fit", str(config), "--name", name, "--progress", "quiet",
                                      *args])  # fmt: skip
    assert result.exit_code == 0, result.output
    return load_params(config.parent / "runs" / name / "model-0001.params")


def test_two_cpu_contexts_equal_one(tmp_path: Path) -> None:
    folder = write_pairs(tmp_path)
    config = write_config(folder, "md", model=SHIPPED_MODEL, batch=8)
    one = fit_params(config, "one", "context.count=1")
    two = fit_params(config, "two", "context.count=2")
    # each step sums two halves' gradients where one context sums the batch: another order
    assert_params_close(two, one, roundings=steps_roundings(PAIRS // 8 + 6, 8))


# -- dist_sync on loopback -----------------------------------------------------------------------


@pytest.mark.usefixtures("reaper")  # every process the launch started is killed afterwards
def test_dist_sync_two_workers_equal_one_process_with_the_combined_batch(tmp_path: Path) -> None:
    folder = write_pairs(tmp_path)
    model = SHIPPED_MODEL
    dist = write_config(folder, "dist", model=model, batch=4, kvstore="dist_sync", epochs=2)
    # `mxtrain launch` sets DMLC_PS_ROOT_URI and DMLC_NODE_HOST to 127.0.0.1 for every role;
    # a hang is killed by mxtrain()'s timeout and fails the test
    done = mxtrain("launch", "-n", 2, "-s", 1, dist, "--grace", 3)
    assert done.returncode == 0, done.stdout + done.stderr
    single = write_config(folder, "single", model=model, batch=8, epochs=2)
    alone = mxtrain("fit", single, "--progress", "quiet")
    assert alone.returncode == 0, alone.stderr
    runs = folder / "runs"
    for epoch in (1, 2):
        # the server sums the workers' gradients where one process sums the batch
        assert_params_close(
            load_params(runs / "dist" / f"model-000{epoch}.params"),
            load_params(runs / "single" / f"model-000{epoch}.params"),
            roundings=steps_roundings(epoch * (PAIRS // 8 + 6), 8),
            context=f"epoch {epoch}",
        )
    assert "[worker 0]" in done.stdout and "[worker 1]" in done.stdout


# -- bucket memory with 2-D keys --------------------------------------------------------------


def train_module(it: Any, bucket_memory: float | None, epochs: int = 2) -> BucketingModule:
    options = RnnSeq2SeqOptions(num_embed=EMBED, num_hidden=HIDDEN, attention="mlp", dropout=0.0)
    sym_gen = build_rnn_seq2seq(options, it.data_info)
    module = BucketingModule(sym_gen, it.default_bucket_key, [mx.cpu()],
                             bucket_memory=bucket_memory)  # fmt: skip
    module.bind(it.provide_data, it.provide_label)
    mx.random.seed(2)
    module.init_params(mx.init.Xavier())
    module.init_optimizer(optimizer="adam", optimizer_params={"learning_rate": 0.01})
    # the default bucket's input positions: source and decoder inputs of its batch
    default = it.batch_size * sum(it.default_bucket_key)
    budget = None if bucket_memory is None else int(bucket_memory * default)
    for epoch in range(epochs):
        it.set_epoch(epoch)
        it.reset()
        for batch in it:
            module.prepare(batch)
            module.forward_backward(batch)
            module.update()
            if budget is not None:
                assert module.bound_positions <= budget, batch.bucket_key
    return module


#: a 3 x 3 grid of (source, target) buckets
GRID = [(s, t) for s in (2, 4, 7) for t in (3, 6, 9)]


def test_bucket_memory_bounds_a_2d_bucket_grid_and_changes_no_number(tmp_path: Path) -> None:
    folder = write_pairs(tmp_path, count=200)
    rng = random.Random(3)  # targets of their own lengths: every bucket of the grid is used
    targets = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8))) for _ in range(200)]
    (folder / "train.tgt").write_text("".join(f"{t}\n" for t in targets))
    # every batch full (last_batch: pad): a short batch is bound as a reshape of its bucket's
    # executors, which the pool counts at both sizes (its own positions and the bucket's)
    it = parallel_iter(folder, 8, buckets=GRID, last_batch="pad")
    keys = it.buckets
    assert sorted(keys) == sorted(GRID) and it.num_batches > 2 * len(keys)
    # the default bucket is the largest (S, T), elementwise, and one of the buckets
    assert it.default_bucket_key == (max(s for s, _ in keys), max(t for _, t in keys))
    assert it.default_bucket_key in keys
    free = train_module(it, None)
    bounded = train_module(it, 1.0)
    assert len(free.bucket_keys) == len(keys)  # unbounded: every bucket stays bound
    assert bounded.rebinds > 0  # buckets were unbound and bound again
    got, want = bounded.get_params()[0], free.get_params()[0]
    assert sorted(got) == sorted(want)
    for name, value in want.items():  # rebinding changes no number
        assert np.array_equal(got[name].asnumpy(), value.asnumpy()), name


def test_fit_with_bucket_memory_trains_the_same_seq2seq_run(tmp_path: Path) -> None:
    folder = write_pairs(tmp_path)
    config = write_config(folder, "bm", model=SHIPPED_MODEL, batch=8, epochs=2)
    free = fit_params(config, "free", "fit.bucket_memory=null", "optimizer.name=adam",
                      "optimizer.learning_rate=0.01")  # fmt: skip
    result = CliRunner().invoke(cli, ["fit", str(config), "--name", "bound", "--progress",
                                      "plain", "--set", "fit.bucket_memory=1.0", "--set",
                                      "optimizer.name=adam", "--set",
                                      "optimizer.learning_rate=0.01"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "buckets rebound (fit.bucket_memory)" in result.output
    bound = load_params(folder / "runs" / "bound" / "model-0001.params")
    assert sorted(bound) == sorted(free)
    for name, value in free.items():
        assert np.array_equal(bound[name], value), name
