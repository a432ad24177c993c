"""Fuzz findings about sizes, end to end: ``python -m mxtrain`` and the click commands end in
a documented exit code with a one-paragraph message, never a traceback, a native crash or a
hang."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def mxtrain(*args: object, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -m mxtrain ARGS`` with this checkout first on the import path; a run past
    ``timeout`` (a hang: the bound is generous) is killed and fails the test."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "mxtrain", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def assert_clean_refusal(result: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    assert result.returncode == code, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    for word in words:
        assert word in result.stderr, result.stderr


# -- K1 ------------------------------------------------------------------------------------------


def test_twenty_thousand_overrides_end_cleanly(tiny_config: Path) -> None:
    valid = [f"--set=fit.num_epoch={i}" for i in range(1, 20_001)]
    result = mxtrain("check", tiny_config, *valid, cwd=tiny_config.parent, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "num_epoch: 20000" in result.stdout
    unknown = [f"--set=model.k{i}=1" for i in range(20_000)]
    result = mxtrain("check", tiny_config, *unknown, cwd=tiny_config.parent, timeout=60)
    assert_clean_refusal(result, 2, "--set model.k0=1: unknown key 'model.k0'")
