"""A real terminal: `mxtrain fit --progress rich` inside tmux renders bars without torn lines.

The pane is captured while training runs. A bar line must be a whole bar (never a log line
spliced into it), bars sit only below all log lines (the live display is at the bottom, log
lines print above it), and once training ends no bar is left on screen.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from conftest import TINY_CONFIG, write_corpus

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")

BAR_GLYPHS = "━╺╸"
BAR_LINE = re.compile(
    r"^epoch [1-3]/3 [━╺╸ ]+ \d+/\d+ \d+:\d\d:\d\d eta (\d+:\d\d:\d\d|-:--:--)"
    r"( [\d,]+ samples/s [\d,]+ tok/s perplexity=[\d.]+)?\s*$"
)
FIT_EXITED = re.compile(r"^fit exited with \d+\s*$", re.MULTILINE)
LOG_LINE = re.compile(r"^(\[\d\d:\d\d:\d\d\])?\s+(INFO|WARNING)\s")


def tmux(socket: str, *args: str) -> str:
    done = subprocess.run(
        ["tmux", "-L", socket, *args], capture_output=True, text=True, timeout=20, check=False
    )
    return done.stdout


def test_rich_progress_in_tmux_has_no_torn_lines(tmp_path: Path) -> None:
    # Enough batches for the bars to be on screen for a few seconds, and evaluations inside
    # each epoch so that log lines print while a bar is live.
    write_corpus(tmp_path / "train.txt", 1500, seed=1)
    write_corpus(tmp_path / "valid.txt", 30, seed=2)
    config = TINY_CONFIG.format(runs_dir=tmp_path / "runs").replace(
        "num_epoch: 2", "num_epoch: 3\n  eval_interval: 60"
    )
    (tmp_path / "tiny.yaml").write_text(config.replace("log_interval: 5", "log_interval: 4"))
    done_marker = tmp_path / "exit_code"
    command = (
        f"cd {shlex.quote(str(tmp_path))} && OMP_NUM_THREADS=1 "
        f"{shlex.quote(sys.executable)} -m mxtrain fit tiny.yaml --progress rich; "
        f"code=$?; echo $code > {shlex.quote(str(done_marker))}; "
        'echo "fit exited with $code"; sleep 60'
    )
    socket = f"mxtrain-test-{uuid.uuid4().hex[:12]}"  # a private tmux server
    captures: list[str] = []
    try:
        tmux(socket, "new-session", "-d", "-x", "120", "-y", "30")
        tmux(socket, "send-keys", command, "Enter")
        deadline = time.monotonic() + 180
        while not done_marker.exists() and time.monotonic() < deadline:
            captures.append(tmux(socket, "capture-pane", "-p"))
            time.sleep(0.15)
        # The pane shows fit's last output once it shows the line echoed after fit (the
        # terminal keeps the order): poll for it rather than guess how long tmux takes.
        final = ""
        while not FIT_EXITED.search(final) and time.monotonic() < deadline + 60:
            final = tmux(socket, "capture-pane", "-p", "-S", "-200")
            time.sleep(0.15)
    finally:
        tmux(socket, "kill-server")
    assert done_marker.exists(), "fit did not finish in time:\n" + (captures or [""])[-1]
    assert done_marker.read_text().strip() == "0", final
    assert FIT_EXITED.search(final), "the pane never showed fit's end:\n" + final

    with_bars = [c for c in captures if any(g in c for g in BAR_GLYPHS)]
    assert with_bars, "no progress bar was ever on screen"
    for screen in with_bars:
        lines = [line for line in screen.splitlines() if line.strip()]
        bar_rows = [i for i, line in enumerate(lines) if any(g in line for g in BAR_GLYPHS)]
        for i in bar_rows:
            assert BAR_LINE.match(lines[i]), f"torn or malformed bar line: {lines[i]!r}"
        log_rows = [i for i, line in enumerate(lines) if LOG_LINE.match(line)]
        assert not log_rows or max(log_rows) < min(bar_rows), "a log line below a live bar"

    # After training: no bar left behind, each epoch's table row and eval lines present.
    assert not any(g in final for g in BAR_GLYPHS), final
    rows = [line for line in final.splitlines() if re.match(r"^[1-3]/3\s+[\d.]+\s+[\d.]+", line)]
    assert [row.split()[0] for row in rows] == ["1/3", "2/3", "3/3"], final
    assert final.count("train perplexity") == 1
    assert len(re.findall(r"epoch \d batch \d+ eval ", final)) == 9  # 3 per epoch, in full
