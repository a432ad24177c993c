"""The "Hooks from Python" example of docs/plugins.md runs as written (on a tiny config)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MARK = "<!-- example: library-hooks -->"


def _example() -> str:
    text = (ROOT / "docs" / "plugins.md").read_text(encoding="utf-8")
    after = text.split(MARK, 1)[1]
    match = re.match(r"\s*```python\n(.*?)```", after, re.S)
    assert match, f"docs/plugins.md: no python block after {MARK}"
    return match.group(1)


def test_docs_hook_example_sees_every_interval(
    tiny_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = _example()
    assert '"configs/ptb_lstm.yaml"' in code
    namespace: dict[str, object] = {}
    exec(
        compile(code.replace('"configs/ptb_lstm.yaml"', repr(str(tiny_config))), "doc", "exec"),
        namespace,
    )
    rates = namespace["throughput"].rates  # type: ignore[attr-defined]
    # the tiny config: 120 sentences in batches of 8 (15 batches), log_interval 5, 2 epochs
    assert len(rates) >= 2
    assert all(rate is not None and rate > 0 for rate in rates)
    assert "intervals, last" in capsys.readouterr().out
    assert (tiny_config.parent / "runs" / "timed" / "metrics.jsonl").exists()
