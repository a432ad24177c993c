#!/usr/bin/env python
"""Sampled softmax against the full softmax: training speed of `mxtrain fit` at large
vocabularies.

For each vocabulary size it writes a synthetic corpus with Zipfian word frequencies (every
word of the vocabulary present, ids in frequency order as mxtrain's vocabularies are), then
trains the default word LM (configs/ptb_lstm.yaml: 2 x 400 LSTM, tied weights, batch 20 x 35)
for a fixed number of batches with the full softmax and with ``model.sampled_softmax: K``,
sides alternating in fresh processes, and reports each side's tokens/s (the epoch record of
metrics.jsonl: binding and the first batches included) and the ratio. Kernel choices are
measured before the timed runs (the cache then holds them), so no run pays for them.

With ``--sparse-embedding`` a third side trains the sampled softmax with
``model.sparse_embedding: true`` (the input embedding's and the output layer's weight
gradients row_sparse, their optimizer updates lazy), and every side unties the weights
(``model.tie_weights: false``), which the sparse gradients need. What stays dense there: the
output bias's gradient and update (vocabulary values) and the recurrent layers.

    python scripts/bench_sampled_softmax.py --vocab 50000,100000 --samples 4096 --json out.json
    python scripts/bench_sampled_softmax.py --vocab 100000 --sparse-embedding \
        --set optimizer.name=adam

``--merge-into BENCHMARKS.json`` keeps the sparse comparison under ``sparse_embedding`` of
that scripts/bench.py report, with its own date, command and machine line; then
``python scripts/bench.py --render BENCHMARKS.json --markdown BENCHMARKS.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "ptb_lstm.yaml"


def write_zipf_corpus(path: Path, vocab: int, tokens: int, seed: int) -> None:
    """``tokens`` words drawn with frequency proportional to 1 / rank, then every word of the
    vocabulary once (so the vocabulary is complete), 20 words to a line."""
    import numpy as np

    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, vocab + 1)
    drawn = rng.choice(vocab, size=tokens, p=weights / weights.sum())
    words = np.concatenate([drawn, rng.permutation(vocab)])
    lines = (" ".join(f"w{w}" for w in words[i : i + 20]) for i in range(0, len(words), 20))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def fit_tokens_per_s(corpus: Path, folder: Path, name: str, sets: list[str], env: dict) -> float:
    argv = [sys.executable, "-m", "mxtrain", "fit", str(CONFIG), "--name", name, "--force"]
    base = [
        f"experiment.runs_dir={folder}",
        f"data.train.source={corpus}",
        "data.eval=null",
        "fit.num_epoch=1",
    ]
    for item in base + sets:
        argv += ["--set", item]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{done.stdout}\n{done.stderr}")
    records = [json.loads(x) for x in (folder / name / "metrics.jsonl").read_text().splitlines()]
    epoch = [r for r in records if r.get("event") == "epoch"][-1]
    return float(epoch["tokens_per_s"])


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from mxtrain.engine.kernels import measuring_off  # imports no MXNet

    env = dict(os.environ, OMP_NUM_THREADS=str(args.omp_threads))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for vocab in args.vocab:
            corpus = folder / f"zipf{vocab}.txt"
            write_zipf_corpus(corpus, vocab, args.tokens, args.seed)
            every_side = list(args.set)
            sides = {"full": ["model.sampled_softmax=0"]}
            sides["sampled"] = [f"model.sampled_softmax={args.samples}"]
            if args.sparse_embedding:
                sides["sampled_sparse"] = [*sides["sampled"], "model.sparse_embedding=true"]
                every_side.append("model.tie_weights=false")
            batches = [f"fit.max_batches_per_epoch={args.batches}", *every_side]
            # kernel choices measured and cached first (nothing to warm where measuring is off)
            for sets in [] if measuring_off() else sides.values():
                warm = [*sets, *every_side, "fit.max_batches_per_epoch=2"]
                fit_tokens_per_s(corpus, folder, "warm", warm, env)
            figures: dict[str, list[float]] = {side: [] for side in sides}
            for round_ in range(args.repeats):
                for side, sets in sides.items():
                    rate = fit_tokens_per_s(corpus, folder, side, [*sets, *batches], env)
                    figures[side].append(rate)
                    print(
                        f"vocab {vocab:,} round {round_ + 1}: {side} {rate:,.0f} tok/s", flush=True
                    )
            full = statistics.median(figures["full"])
            sampled = statistics.median(figures["sampled"])
            row = {
                "vocab": vocab,
                "samples": args.samples,
                "full_tokens_per_s": figures["full"],
                "sampled_tokens_per_s": figures["sampled"],
                "speedup": sampled / full,
            }
            if args.sparse_embedding:
                row["sampled_sparse_tokens_per_s"] = figures["sampled_sparse"]
                row["sparse_speedup"] = statistics.median(figures["sampled_sparse"]) / sampled
            rows.append(row)
    return {
        "model": "configs/ptb_lstm.yaml (2 x 400 LSTM, "
        + ("untied" if args.sparse_embedding else "tied")
        + " weights, batch 20 x 35)"
        + (f" with {', '.join(args.set)}" if args.set else ""),
        "batches": args.batches,
        "omp_threads": args.omp_threads,
        "rows": rows,
    }


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", default="50000,100000", help="vocabulary sizes, commas")
    parser.add_argument("--samples", type=int, default=4096, help="model.sampled_softmax")
    parser.add_argument("--batches", type=int, default=30, help="training batches per run")
    parser.add_argument("--repeats", type=int, default=2, help="rounds of both sides")
    parser.add_argument("--tokens", type=int, default=300_000, help="corpus words (plus vocab)")
    parser.add_argument("--omp-threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--sparse-embedding",
        action="store_true",
        help="a third side: the sampled softmax with model.sparse_embedding (weights untied)",
    )
    parser.add_argument("--json", help="write the report here")
    parser.add_argument(
        "--merge-into",
        metavar="JSON",
        help="with --sparse-embedding: keep the report under 'sparse_embedding' of this "
        "scripts/bench.py report (BENCHMARKS.json)",
    )
    parser.add_argument(
        "--set", action="append", default=[], help="extra `mxtrain fit --set` items (both sides)"
    )
    args = parser.parse_args(argv)
    if args.merge_into and not args.sparse_embedding:
        parser.error("--merge-into keeps the sparse comparison: add --sparse-embedding")
    args.vocab = [int(v) for v in args.vocab.split(",") if v.strip()]
    return args


def main() -> None:
    args = arguments()
    report = measure(args)
    if args.merge_into:
        from bench import machine  # scripts/bench.py: CPU, instruction set and versions

        report["command"] = "python scripts/bench_sampled_softmax.py " + " ".join(sys.argv[1:])
        report["date"] = dt.datetime.now().isoformat(timespec="seconds")
        report["machine"] = machine()
        merged = json.loads(Path(args.merge_into).read_text())
        merged["sparse_embedding"] = report
        Path(args.merge_into).write_text(json.dumps(merged, indent=2) + "\n")
    for row in report["rows"]:
        print(
            f"vocab {row['vocab']:,}: full {statistics.median(row['full_tokens_per_s']):,.0f} "
            f"tok/s, sampled ({row['samples']:,}) "
            f"{statistics.median(row['sampled_tokens_per_s']):,.0f} tok/s: "
            f"{row['speedup']:.2f}x"
        )
        if "sparse_speedup" in row:
            print(
                f"  with sparse_embedding "
                f"{statistics.median(row['sampled_sparse_tokens_per_s']):,.0f} tok/s: "
                f"{row['sparse_speedup']:.2f}x the sampled softmax alone"
            )
    print("RESULT " + json.dumps(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
