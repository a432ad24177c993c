"""onnxruntime for tests, in an environment of its own: its Python 3.11 wheels need
numpy>=1.24.2 while MXNet 1.9.1 needs numpy<1.24. The ``onnxruntime_python`` fixture
(tests/conftest.py) creates it once per test session with pip, from the package index."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

RUN_ONNX = """
import sys, numpy as np, onnxruntime as ort
ort.set_default_logger_severity(3)
session = ort.InferenceSession(sys.argv[1])
inputs = dict(np.load(sys.argv[2]))
np.savez(sys.argv[3], *session.run(None, inputs))
"""


def onnxruntime_environment(folder: Path) -> Path:
    """A virtual environment at ``folder`` with onnxruntime; returns its python. Skips the
    test when it cannot be installed, except under CI=true (the package index is there)."""
    base = getattr(sys, "_base_executable", sys.executable)
    try:
        subprocess.run([base, "-m", "venv", str(folder)], check=True, capture_output=True)
        subprocess.run(
            [str(folder / "bin/python"), "-m", "pip", "install", "-q", "onnxruntime", "numpy"],
            check=True,
            capture_output=True,
            timeout=600,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        reason = getattr(exc, "stderr", b"") or b""
        message = f"onnxruntime could not be installed in its own environment: {reason[-300:]!r}"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI has the package index: this must not pass unseen
        pytest.skip(message)
    return folder / "bin/python"


def run_onnx(python: Path, model: Path, inputs: dict[str, np.ndarray], tmp: Path) -> list:
    np.savez(tmp / "inputs.npz", **inputs)
    script = tmp / "run_onnx.py"
    script.write_text(RUN_ONNX)
    subprocess.run(
        [str(python), str(script), str(model), str(tmp / "inputs.npz"), str(tmp / "out.npz")],
        check=True,
        capture_output=True,
        timeout=300,
    )
    with np.load(tmp / "out.npz") as outputs:
        return [outputs[f"arr_{i}"] for i in range(len(outputs.files))]
