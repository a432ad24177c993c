#!/usr/bin/env python
"""The LM's output layer in the formulations MXNet offers, against the GEMM peak.

The output layer is 4.0 of the 5.28 MFLOP a token of the default word LM costs forward. This
times, on (batch * time) x hidden -> classes, forward and forward+backward of

* ``fc``: FullyConnected on the (batch * time, hidden) rows (what lstm_lm builds);
* ``fc_3d``: FullyConnected(flatten=False) on (batch, time, hidden), no reshape;
* ``dot_t``: dot(x, weight, transpose_b=True) + broadcast bias;
* ``fc_time_major``: FullyConnected on time-major rows (swapaxes first, as a TNC graph would);

and the float32 GEMM peak (FullyConnected 2,048 square) in the same process, so every
GFLOP/s figure has its ceiling beside it. Run it once per instruction set: oneDNN honours
``DNNL_MAX_CPU_ISA`` (e.g. AVX2 on an AVX-512 machine), which is how BENCHMARKS.md shows the
AVX2 kernels on a machine that has AVX-512.

    python scripts/bench_output_layer.py --json out.json
    DNNL_MAX_CPU_ISA=AVX2 python scripts/bench_output_layer.py
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import mxnet as mx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mxtrain.engine.kernels import bind_random, median_ms, waited  # after sys.path: this checkout

#: rounds over every formulation; each one's best round counts
ROUNDS = 3


def _median_ms(step: Any, repeats: int) -> float:
    """Median ms of ``step`` and a wait for its results (mxtrain.engine.kernels' timing)."""
    return median_ms(waited(step), repeats)


def _executor(symbol: Any, shapes: dict[str, tuple[int, ...]]) -> Any:
    return bind_random(symbol, mx.cpu(), shapes)


def formulations(batch: int, steps: int, hidden: int, classes: int) -> dict[str, Any]:
    """name -> (symbol, input shapes); every output is (rows, classes) logits."""
    x = mx.sym.Variable("x")
    weight, bias = mx.sym.Variable("pred_weight"), mx.sym.Variable("pred_bias")
    rows = (batch * steps, hidden)
    fc = mx.sym.FullyConnected(x, weight=weight, bias=bias, num_hidden=classes, name="pred")
    fc_3d = mx.sym.FullyConnected(
        x, weight=weight, bias=bias, num_hidden=classes, flatten=False, name="pred"
    )
    dot = mx.sym.broadcast_add(mx.sym.dot(x, weight, transpose_b=True), bias.reshape((1, -1)))
    time_major = mx.sym.reshape(mx.sym.swapaxes(x, dim1=0, dim2=1), shape=(-1, hidden))
    fc_tm = mx.sym.FullyConnected(
        time_major, weight=weight, bias=bias, num_hidden=classes, name="pred"
    )
    return {
        "fc": (fc, {"x": rows}),
        "fc_3d": (fc_3d, {"x": (batch, steps, hidden)}),
        "dot_t": (dot, {"x": rows, "pred_weight": (classes, hidden), "pred_bias": (classes,)}),
        "fc_time_major": (fc_tm, {"x": (batch, steps, hidden)}),
    }


def measure(batch: int, steps: int, hidden: int, classes: int, repeats: int) -> dict[str, Any]:
    """GFLOP/s of every formulation (forward; forward+backward) and the GEMM peak."""
    flop = 2.0 * batch * steps * hidden * classes  # one product; backward is two more
    out: dict[str, Any] = {"shape": [batch * steps, hidden, classes], "formulations": {}}
    executors = {
        name: _executor(mx.sym.MakeLoss(symbol), shapes)
        for name, (symbol, shapes) in formulations(batch, steps, hidden, classes).items()
    }
    # rounds over all formulations, best round kept: none is favoured by going first
    forward: dict[str, list[float]] = {name: [] for name in executors}
    both: dict[str, list[float]] = {name: [] for name in executors}
    for _ in range(ROUNDS):
        for name, ex in executors.items():
            forward[name].append(_median_ms(lambda e=ex: e.forward(is_train=False), repeats))
            both[name].append(
                _median_ms(lambda e=ex: (e.forward(is_train=True), e.backward()), repeats)
            )
    for name in executors:
        fwd, train = min(forward[name]), min(both[name])
        out["formulations"][name] = {
            "forward_ms": round(fwd, 2),
            "forward_gflops": round(flop / fwd / 1e6, 1),
            "train_ms": round(train, 2),
            "train_gflops": round(3 * flop / train / 1e6, 1),
        }
    n = 2048
    square = mx.sym.FullyConnected(mx.sym.Variable("x"), num_hidden=n, no_bias=True)
    executor = _executor(square, {"x": (n, n)})
    peak_ms = min(_median_ms(lambda: executor.forward(is_train=False), repeats) for _ in range(2))
    out["gemm_peak_gflops"] = round(2.0 * n**3 / peak_ms / 1e6, 1)
    out["isa_cap"] = os.environ.get("DNNL_MAX_CPU_ISA") or "none"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=35)
    parser.add_argument("--hidden", type=int, default=200)
    parser.add_argument("--classes", type=int, default=10000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    result = measure(args.batch, args.steps, args.hidden, args.classes, args.repeats)
    peak = result["gemm_peak_gflops"]
    print(f"oneDNN ISA cap: {result['isa_cap']}; GEMM peak {peak:,.0f} GFLOP/s")
    for name, row in result["formulations"].items():
        print(
            f"{name:<15} forward {row['forward_ms']:6.1f} ms {row['forward_gflops']:6.1f} "
            f"GFLOP/s ({row['forward_gflops'] / peak:.0%})   forward+backward "
            f"{row['train_ms']:6.1f} ms {row['train_gflops']:6.1f} GFLOP/s "
            f"({row['train_gflops'] / peak:.0%})"
        )
    print("RESULT " + json.dumps(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
