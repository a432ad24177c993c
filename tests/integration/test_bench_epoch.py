"""scripts/bench.py's whole-epoch comparisons (quiet and beside a busy process) and memory
tables, and scripts/bench_memory.py; the step comparisons are test_bench.py's (two files, so
that two pytest workers share the benchmarks). Not a timing test: figures are only checked
for being measured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from test_bench import BENCH, run_bench


def test_bench_runs_whole_epochs_quiet_and_loaded_and_the_memory_tables(tmp_path: Path) -> None:
    # 160 sentences: 20 batches of 8 an epoch, four epochs in all (two beside a busy process)
    report, text, _ = run_bench(tmp_path, "epoch,loaded,memory", sentences=160)
    # a whole epoch each, the same number of batches on both sides' own iterators' data
    epoch = report["comparisons"]["epoch"]["rounds"][0]
    assert set(epoch) == {"epoch-stock-omp", "epoch-mxtrain"}
    for figures in epoch.values():
        assert figures["train_tokens_per_s"] > 0 and figures["train_batches"] > 0
    # mxtrain's side keeps what fit estimated before its first batch, and its choices
    ours = epoch["epoch-mxtrain"]
    assert ours["estimated_peak_mb"] > 0 and ours["bucket_bound"].startswith("bucket_memory")
    assert {"model.loss", "context.large_buffers"} <= set(ours["choices"])
    # the full epoch beside a busy process, both sides in the same conditions
    loaded = report["comparisons"]["loaded"]["rounds"][0]
    assert set(loaded) == {"loaded-epoch-stock-omp", "loaded-epoch-mxtrain"}
    for side, figures in loaded.items():
        assert figures["train_tokens_per_s"] > 0, (side, figures)
    assert [section["settings"]["model"] for section in report["memory"]] == ["char", "word"]
    assert "**The same epoch beside a CPU-bound process**" in text
    assert "a full epoch as a user runs it" in text and "## Memory" in text
    assert "Memory against the number of buckets (char LM)" in text


def test_bench_memory_runs_every_side_and_reports_the_cap(tmp_path: Path) -> None:
    script = BENCH.parent / "bench_memory.py"
    out, md = tmp_path / "memory.json", tmp_path / "memory.md"
    proc = subprocess.run(
        [sys.executable, str(script), "--model", "char", "--counts", "1,3", "--largest", "24",
         "--batch-size", "4", "--omp-threads", "1", "--json", str(out), "--markdown", str(md)],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert [row["count"] for row in report["rows"]] == [1, 3]
    for row in report["rows"]:
        assert set(row["sides"]) == {"stock", "mxtrain", "mxtrain-auto", "mxtrain-capped"}
        for figures in row["sides"].values():
            assert figures["peak_rss_mb"] > 0 and figures["tokens_per_s"] > 0
            assert figures["rss_largest_alone_mb"] > 0
        assert all(0 <= share < 1 for share in row["padding"].values())
    three = report["rows"][1]["sides"]
    assert three["mxtrain-capped"]["rebinds"] > 0 and three["mxtrain"]["rebinds"] == 0
    assert "| 3 |" in md.read_text()


def test_the_rss_section_tells_each_sides_peak_against_stock() -> None:
    """The ``rss`` comparison's table, from a report of known figures."""
    sys.path.insert(0, str(BENCH.parent))
    from bench_report import _rss_section

    def side(rss: float, speed: float, **more) -> dict:
        return {"peak_rss_mb": rss, "train_tokens_per_s": speed, **more}

    rounds = [
        {
            "epoch-stock-omp": side(900, 100),
            "epoch-mxtrain+release+softmax": side(945, 120, estimated_peak_mb=930),
            "epoch-mxtrain": side(
                1800, 150, estimated_peak_mb=1200,
                choices={"model.loss": "one_pass", "context.large_buffers": "reuse"},
            ),
        }
        for _ in range(3)
    ]  # fmt: skip
    text = "\n".join(_rss_section({"comparisons": {"rss": {"rounds": rounds}}}))
    assert "| stock `BucketingModule.fit` (as in `epoch`) | 900 | 1.00 | 1.00 | - | - |" in text
    assert "| 945 | 1.05 | 1.20 | 930 | - |" in text
    assert "| mxtrain as `auto` chose | 1,800 | 2.00 | 1.50 | 1,200 | loss one_pass, " in text
