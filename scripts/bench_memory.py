#!/usr/bin/env python
"""Memory against the number of buckets: MXNet's BucketingModule against mxtrain's module.

Each side runs in a fresh process per bucket count, with the same symbol (the model section
of a shipped config: ``configs/ptb_char_lstm.yaml`` for ``--model char``,
``configs/ptb_lstm_sentences.yaml`` for ``--model word``), the same seeded batches and the same OMP
threads. Bucket lengths are spread geometrically from 16 to ``--largest``; every bucket is
bound and trained (forward, backward, Adam update) once in a first pass, largest first, and
once more in a timed second pass, so every bucket is bound at the end: the worst case for
memory. Sides:

``stock``: ``mx.mod.BucketingModule``; ``mxtrain``: mxtrain's module with every bucket kept
bound (``fit.bucket_memory: null``); ``mxtrain-auto``: its default (``fit.bucket_memory:
auto``); ``mxtrain-capped``: ``fit.bucket_memory: --cap``.

Figures per side and count: peak RSS of the process, RSS after the largest bucket's first
update (the largest bucket alone, optimizer state included), and tokens/s over the second
pass (every position is a real token here: padding is reported separately). The padding
column is computed, not measured: the share of padded positions that bucket_sentence's
rules give a heavy-tailed synthetic length sample (lognormal, median 66, p99 about 1,000)
with that many buckets.

    python scripts/bench_memory.py --model char --json memory.json --markdown memory.md
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {
    "char": ROOT / "configs" / "ptb_char_lstm.yaml",
    "word": ROOT / "configs" / "ptb_lstm_sentences.yaml",
}
VOCAB = {"char": 60, "word": 10000}
SIDES = ("stock", "mxtrain", "mxtrain-auto", "mxtrain-capped")


def bucket_lengths(count: int, largest: int) -> list[int]:
    """``count`` lengths from 16 to ``largest``, spread geometrically (fewer if they collide)."""
    import numpy as np

    if count == 1:
        return [largest]
    return sorted({int(np.rint(x)) for x in np.geomspace(min(16, largest), largest, count)})


def rss_now_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """One side, one bucket count, in this (fresh) process."""
    import mxnet as mx
    import numpy as np

    from mxtrain.build import build_sym_gen
    from mxtrain.config import load_config
    from mxtrain.data.base import TASK_LM, DataInfo
    from mxtrain.engine.bucketing import BucketingModule

    config = load_config(CONFIGS[args.model])
    vocab = VOCAB[args.model]
    info = DataInfo(vocab_size=vocab, num_classes=vocab, pad_id=0, task=TASK_LM)
    sym_gen = build_sym_gen(config.model, info, config.base_dir)
    largest, batch = args.largest, args.batch_size
    keys = bucket_lengths(args.count, largest)
    shape = [("data", (batch, largest))], [("softmax_label", (batch, largest))]
    if args.worker == "stock":
        module: Any = mx.mod.BucketingModule(sym_gen, default_bucket_key=largest, context=mx.cpu())
    else:
        cap = {"mxtrain-capped": args.cap, "mxtrain-auto": "auto"}.get(args.worker)
        module = BucketingModule(sym_gen, largest, mx.cpu(), bucket_memory=cap)
    module.bind(*shape)
    mx.random.seed(args.seed)
    module.init_params(mx.init.Xavier(factor_type="in", magnitude=2.34))
    module.init_optimizer(optimizer="adam", optimizer_params={"learning_rate": 0.001})
    rng = np.random.default_rng(args.seed)

    def step(key: int) -> None:
        ids = mx.nd.array(rng.integers(1, vocab, size=(batch, key)))
        labels = mx.nd.array(rng.integers(1, vocab, size=(batch, key)))
        module.forward_backward(
            mx.io.DataBatch(
                [ids],
                [labels],
                bucket_key=key,
                provide_data=[mx.io.DataDesc("data", (batch, key), layout="NT")],
                provide_label=[mx.io.DataDesc("softmax_label", (batch, key), layout="NT")],
            )
        )
        module.update()

    step(largest)
    mx.nd.waitall()
    alone = rss_now_mb()
    for key in keys[:-1]:
        step(key)
    mx.nd.waitall()
    start = time.perf_counter()
    for key in keys:
        step(key)
    mx.nd.waitall()
    seconds = time.perf_counter() - start
    return {
        "side": args.worker,
        "count": len(keys),
        "buckets": keys,
        "rss_largest_alone_mb": alone,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "tokens_per_s": batch * sum(keys) / seconds,
        "rebinds": getattr(module, "rebinds", 0),
    }


def padding_shares(count: int, largest: int, batch: int) -> dict[str, float]:
    """Computed padding of each bucket rule with ``count`` buckets on heavy-tailed lengths:
    length quantiles and the padding rule with full last batches (``last_batch: pad``),
    and the padding rule with short ones (the default)."""
    import numpy as np

    from mxtrain.data.bucket_sentence import auto_buckets, padding_buckets, whole_batch_rows

    rng = np.random.default_rng(7)
    lengths = np.clip(np.rint(np.exp(rng.normal(np.log(66), 1.17, 30000))), 2, largest)
    lengths = lengths.astype(np.int64)

    def computed(buckets: list[int], whole: bool = True) -> float:
        bounds = np.asarray(sorted(buckets))
        lens = np.minimum(lengths, bounds[-1])
        counts = np.bincount(np.searchsorted(bounds, lens), minlength=bounds.size)
        rows = np.ceil(counts / batch) * batch if whole else counts
        return 1.0 - float(lens.sum()) / float((rows * bounds).sum())

    rows = whole_batch_rows(batch, None, int(lengths.max()))
    short = whole_batch_rows(batch, None, int(lengths.max()), last_batch="short")
    return {
        "quantile": computed(auto_buckets(lengths, count)),
        "padding": computed(padding_buckets(lengths, 0.1, count, rows=rows)),
        "padding_short": computed(padding_buckets(lengths, 0.1, count, rows=short), False),
    }


def run_side(side: str, count: int, args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, __file__, "--worker", side, "--count", str(count)]
    for name in ("model", "largest", "batch_size", "cap", "seed"):
        command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.omp_threads), MXNET_SUBGRAPH_VERBOSE="0")
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"{side} with {count} buckets failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def cpu_words() -> str:
    from mxtrain.run.environment import cpu_facts

    facts = cpu_facts()
    return f"{facts['cpu']}, {facts['isa']}, {os.cpu_count()} cores"


def markdown(report: dict[str, Any], level: str = "##") -> str:
    """The Markdown section of one model's report (``level``: its heading's level)."""
    s = report["settings"]
    padding_keys = [
        k for k in ("quantile", "padding", "padding_short") if k in report["rows"][0]["padding"]
    ]
    has_short = "padding_short" in padding_keys
    lines = [
        f"{level} Memory against the number of buckets ({s['model']} LM)",
        "",
        f"`{report['command']}` on {report['machine']} ({report['date']}), OMP_NUM_THREADS="
        f"{s['omp_threads']}, batch {s['batch_size']}, largest bucket {s['largest']}, the model "
        f"of `{Path(CONFIGS[s['model']]).relative_to(ROOT)}`, every bucket bound at the end. "
        "Peak RSS of each process; 'alone' is the RSS after the largest bucket's first update "
        "(the largest bucket and the optimizer state). Padding is computed for a heavy-tailed "
        "length sample, not measured.",
        "",
        "| buckets | stock peak MB | mxtrain unbounded | mxtrain default (auto) | "
        f"mxtrain {s['cap']:g} | tokens/s stock / unbounded / auto / {s['cap']:g} | "
        "padding: quantile / padding rule (full last batches"
        + (" / short ones, the default)" if has_short else ")")
        + " |",
        "|---:|---:|---:|---:|---:|---|---|",
    ]

    def peak(side: dict[str, Any]) -> str:
        ratio = side["peak_rss_mb"] / side["rss_largest_alone_mb"]
        return f"{side['peak_rss_mb']:,.0f} ({ratio:.2f})"

    for row in report["rows"]:
        by = row["sides"]
        speeds = " / ".join(f"{by[side]['tokens_per_s']:,.0f}" for side in SIDES)
        lines.append(
            f"| {row['count']} | {peak(by['stock'])} | {peak(by['mxtrain'])} | "
            f"{peak(by['mxtrain-auto'])} | {peak(by['mxtrain-capped'])} | {speeds} | "
            + " / ".join(f"{row['padding'][k]:.1%}" for k in padding_keys)
            + " |"
        )
    lines += [
        "",
        "Peak RSS in MB, in brackets as a multiple of 'alone'. `auto` bounds the bound "
        "buckets at 5 x the largest bucket's positions, the last column at "
        f"`fit.bucket_memory: {s['cap']:g}`. The tokens/s of this table come from one batch per "
        "bucket and include the bounded sides' rebinding; they show the price of a bound in "
        "the worst order (every batch another bucket), not an epoch's speed.",
        "",
    ]
    return "\n".join(lines)


def measure(args: argparse.Namespace, command: str) -> dict[str, Any]:
    """Every side at every bucket count of ``args.counts``, one fresh process each: the
    report ``markdown`` renders (``command`` is how it was asked for)."""
    rows = []
    for count in (int(c) for c in str(args.counts).split(",")):
        sides: dict[str, Any] = {}
        order = SIDES if count % 2 else tuple(reversed(SIDES))  # alternate who goes first
        for side in order:
            sides[side] = run_side(side, count, args)
            print(
                f"{args.model} {count:>3} buckets  {side:<15} peak "
                f"{sides[side]['peak_rss_mb']:8,.0f} MB  "
                f"alone {sides[side]['rss_largest_alone_mb']:8,.0f} MB  "
                f"{sides[side]['tokens_per_s']:9,.0f} tokens/s",
                flush=True,
            )
        rows.append(
            {
                "count": count,
                "sides": sides,
                "padding": padding_shares(count, args.largest, args.batch_size),
            }
        )
    return {
        "command": command,
        "date": time.strftime("%Y-%m-%d"),
        "machine": cpu_words(),
        "settings": {
            k: getattr(args, k)
            for k in ("model", "largest", "batch_size", "cap", "omp_threads", "seed")
        },
        "rows": rows,
    }


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """This script's options (``argv``: None for the command line)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=sorted(CONFIGS), default="char")
    parser.add_argument("--counts", default="1,8,16,32")
    parser.add_argument("--largest", type=int, default=None, help="default: char 2048, word 80")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--cap", type=float, default=1.0, help="bucket_memory of mxtrain-capped")
    parser.add_argument("--omp-threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--markdown", help="write the Markdown section here")
    parser.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.largest is None:
        args.largest = 2048 if args.model == "char" else 80
    return args


def main() -> None:
    args = arguments()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    report = measure(args, "python scripts/bench_memory.py " + " ".join(sys.argv[1:]))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    text = markdown(report)
    if args.markdown:
        Path(args.markdown).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
