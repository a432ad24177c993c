"""scripts/bench.py runs both sides and agrees on the numerics (not a timing test)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "scripts" / "bench.py"


def test_bench_runs_both_sides_with_identical_numerics(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--sentences", "400", "--batches", "6", "--warmup", "3",
         "--repeats", "1", "--omp-threads", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    (round_,) = report["rounds"]
    for side in ("stock", "mxtrain"):
        assert round_[side]["train_tokens_per_s"] > 0 and round_[side]["peak_rss_mb"] > 0
    # the same symbol, data and seeds: the training perplexity must agree
    assert abs(report["ratios"]["train_metric"]["median"] - 1.0) < 1e-6
    assert "train_tokens_per_s" in proc.stdout
