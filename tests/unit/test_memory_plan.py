"""The training memory estimate (mxtrain.memory_plan): which fused RNN operators a graph
has, what their buckets keep, the plan's arithmetic and what the machine has left."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mxtrain import memory_plan
from mxtrain.memory_plan import FusedRnn, MemoryPlan, fused_rnns, key_positions


def _rnn_symbol(mode: str, layers: int, bidirectional: bool, embed: int, units: int):
    import mxnet as mx

    data = mx.sym.var("data")
    embedded = mx.sym.Embedding(data, input_dim=30, output_dim=embed, name="embed")
    states = {"state": mx.sym.var("begin_h")}
    if mode == "lstm":
        states["state_cell"] = mx.sym.var("begin_c")
    out = mx.sym.RNN(
        mx.sym.transpose(embedded, axes=(1, 0, 2)),
        state_size=units,
        num_layers=layers,
        mode=mode,
        bidirectional=bidirectional,
        name="encoder",
        **states,
    )
    return mx.sym.FullyConnected(mx.sym.reshape(out, shape=(-1, units)), num_hidden=30)


@pytest.mark.parametrize(
    ("mode", "layers", "bidirectional", "gates"),
    [("lstm", 2, False, 4), ("gru", 1, True, 3), ("rnn_tanh", 3, False, 1)],
)
def test_fused_rnns_reads_each_operator_at_the_buckets_shapes(
    mode: str, layers: int, bidirectional: bool, gates: int
) -> None:
    symbol = _rnn_symbol(mode, layers, bidirectional, embed=24, units=16)
    (rnn,) = fused_rnns(symbol, {"data": (8, 50)})
    directions = 2 if bidirectional else 1
    assert (rnn.name, rnn.mode, rnn.layers, rnn.directions) == ("encoder", mode, layers, directions)
    assert (rnn.steps, rnn.rows, rnn.inputs, rnn.units) == (50, 8, 24, 16)
    # MXNet's packed parameters: per layer and direction, gates x units x (input + units)
    # weights and two biases of gates x units
    first = gates * 16 * (24 + 16 + 2)
    further = gates * 16 * (16 * directions + 16 + 2)
    assert rnn.weights == directions * (first + (layers - 1) * further)


def test_a_graph_without_fused_rnn_keeps_nothing_of_its_own() -> None:
    import mxnet as mx

    dense = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=4)
    assert fused_rnns(dense, {"data": (3, 5)}) == []
    assert memory_plan.bucket_kept_bytes(dense, {"data": (3, 5)}) == (0, 0)


def test_the_workspace_grows_with_the_buckets_positions_the_weights_do_not() -> None:
    base = FusedRnn("r", "lstm", 2, 1, 64, steps=10, rows=4, inputs=32, weights=1000)
    longer = FusedRnn("r", "lstm", 2, 1, 64, steps=30, rows=8, inputs=32, weights=1000)
    assert longer.workspace_bytes() == 6 * base.workspace_bytes()
    assert longer.weight_copy_bytes() == base.weight_copy_bytes()
    wider = FusedRnn("r", "lstm", 2, 1, 64, steps=10, rows=4, inputs=256, weights=1000)
    assert wider.workspace_bytes() > base.workspace_bytes()
    gru = FusedRnn("r", "gru", 2, 1, 64, steps=10, rows=4, inputs=32, weights=1000)
    both_ways = FusedRnn("r", "lstm", 2, 2, 64, steps=10, rows=4, inputs=32, weights=1000)
    assert gru.workspace_bytes() < base.workspace_bytes() < both_ways.workspace_bytes()


#: runs in a fresh process whose large blocks are mmapped (freed at once), so resident
#: memory follows what the bucket allocates
_MEASURE = textwrap.dedent(
    """
    import json, sys
    import mxnet as mx, numpy as np
    sys.path.insert(0, {tests!r})
    from test_memory_plan import _rnn_symbol
    from mxtrain.memory_plan import bucket_kept_bytes, resident_memory

    symbol = mx.sym.SoftmaxOutput(_rnn_symbol("lstm", 2, False, 32, 64), name="softmax")
    shapes = {{"data": (16, 200), "softmax_label": (3200,)}}
    fixed = ("data", "softmax_label", "begin_h", "begin_c")
    req = {{n: "null" if n in fixed else "write" for n in symbol.list_arguments()}}

    def run(executor):
        executor.arg_dict["data"][:] = np.random.randint(0, 30, (16, 200))
        executor.forward(is_train=True)
        executor.backward()
        mx.nd.waitall()

    default = symbol.simple_bind(mx.cpu(), grad_req=req, **shapes)
    run(default)
    before = resident_memory()
    second = symbol.simple_bind(mx.cpu(), grad_req=req, shared_exec=default, **shapes)
    run(second)
    print(json.dumps([resident_memory() - before, sum(bucket_kept_bytes(symbol, shapes))]))
    """
)


def test_the_estimate_is_what_a_second_bucket_of_a_fused_lstm_keeps() -> None:
    """Measured: a second bucket bound beside the default one, sharing its memory pool,
    keeps the fused RNN's workspace and weight copies; the estimate is within the spread of
    the measurements it was fitted to (about 10%), with room for allocator rounding."""
    import json
    import os

    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MALLOC_MMAP_THRESHOLD_": "65536",
        "MALLOC_TRIM_THRESHOLD_": "0",
    }
    script = _MEASURE.format(tests=str(Path(__file__).parent))
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    measured, estimated = json.loads(done.stdout.strip().splitlines()[-1])
    assert 0.75 * measured <= estimated <= 1.35 * measured, (measured, estimated)


def test_the_plan_adds_what_the_bound_keeps_bound() -> None:
    plan = MemoryPlan(
        resident=100, shared=50, kept_largest=1000, kept_each=2, all_buckets=3.5, buckets=6,
        available=10_000,
    )  # fmt: skip
    assert plan.peak(None) == 100 + 50 + 3500 + 12
    assert plan.peak(1.0) == 100 + 50 + 1000 + 12
    assert plan.peak(5.0) == plan.peak(None)  # a bound above every bucket keeps them all
    assert plan.growth(2.0) == 50 + 2000 + 12
    # within 0.5 of 10,000 after the shared memory and weight copies: 4.938 buckets -> 3.5 cap
    assert plan.largest_factor_within(0.5, 5.0) == pytest.approx((5000 - 62) / 1000)
    assert plan.largest_factor_within(0.1, 5.0) is None  # 1,000 - 62 < one largest bucket
    unknown = MemoryPlan(100, 50, 1000, 2, 3.5, 6, available=None)
    assert unknown.largest_factor_within(0.8, 5.0) is None


def test_key_positions_counts_both_sides_of_a_pair() -> None:
    assert key_positions(35) == 35
    assert key_positions((12, 9)) == 21


def test_available_memory_is_the_smaller_of_the_system_and_the_cgroup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    limit, usage = tmp_path / "memory.max", tmp_path / "memory.current"
    limit.write_text("1073741824\n")
    usage.write_text("268435456\n")
    monkeypatch.setattr(memory_plan, "_CGROUP_FILES", ((str(limit), str(usage)),))
    monkeypatch.setattr(memory_plan, "_mem_available", lambda: 8 * 2**30)
    assert memory_plan.available_memory() == 768 * 2**20
    limit.write_text("max\n")
    assert memory_plan.available_memory() == 8 * 2**30
    monkeypatch.setattr(memory_plan, "_CGROUP_FILES", ((str(tmp_path / "none"), str(usage)),))
    assert memory_plan.available_memory() == 8 * 2**30
