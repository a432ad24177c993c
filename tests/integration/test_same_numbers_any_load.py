"""Same config + same seed + same machine = the same parameters, busy or quiet; and
``mxtrain kernels``, the one way to measure the kept choices again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import params

from mxtrain import kernel_choices
from mxtrain.cli.main import cli
from mxtrain.engine import kernels

#: every choice fit makes by measuring, loss and cell included (they round differently)
AUTO = ("model.loss=auto", "model.cell=auto", "context.large_buffers=auto")


@pytest.fixture(autouse=True)
def measuring_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests measure: the suite's MXTRAIN_MEASURE=0 (tests/conftest.py) is taken away."""
    monkeypatch.delenv(kernels.MEASURE_ENV, raising=False)


def _fit_process(config: Path, name: str, cache: Path) -> None:
    """``mxtrain fit`` in a process of its own with OpenMP left to mxtrain (auto)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    env["MXTRAIN_CACHE_DIR"] = str(cache)
    argv = [sys.executable, "-m", "mxtrain", "fit", str(config), "--name", name]
    for item in AUTO:
        argv += ["--set", item]
    done = subprocess.run(
        [*argv, "--progress", "plain"],
        env=env,
        cwd=config.parent,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _choices(run: Path) -> dict[str, tuple[str, str]]:
    record = json.loads((run / "kernels.json").read_text())
    return {c["key"]: (c["value"], c["source"]) for c in record["choices"]}


def test_a_run_on_a_loaded_machine_and_one_on_a_quiet_one_train_alike(
    tiny_config: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        _fit_process(tiny_config, "loaded", cache)
    finally:
        busy.kill()
        busy.wait(timeout=30)
    loaded = _choices(tmp_path / "runs" / "loaded")
    assert {"context.omp_threads", "model.loss", "model.cell"} <= set(loaded)
    # Mark every kept choice as measured under load, whatever the loop achieved: the
    # condition on which choices used to be measured again once the machine was quiet.
    kept = json.loads((cache / "kernels.json").read_text())
    for problems in kept["machines"].values():
        for entry in problems.values():
            entry["load"] = 2.0
    (cache / "kernels.json").write_text(json.dumps(kept))
    _fit_process(tiny_config, "quiet", cache)
    quiet = _choices(tmp_path / "runs" / "quiet")
    for key, (value, source) in loaded.items():
        assert quiet[key][0] == value, key
        if source in ("measured", "cache"):
            assert quiet[key][1] == "cache", key
    a, b = params(tmp_path / "runs" / "loaded", 2), params(tmp_path / "runs" / "quiet", 2)
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


@pytest.fixture
def fake_measurements(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    """A private cache and measurements whose figures the test sets (no child processes)."""
    monkeypatch.setenv("MXTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(kernels, "busy_cpus", lambda: 0.0)
    loss = {"softmax": 3.0, "log_softmax": 2.0, "softmax_output": 4.0}

    def measure(request: dict) -> dict[str, float]:
        if request["kind"] == "loss":
            return dict(loss)
        if request["kind"] == "cell":
            return {"fused": 1.0, "unfused": 2.0}
        return {request["large_buffers"]: 1.0 if request["large_buffers"] == "release" else 2.0}

    monkeypatch.setattr(kernel_choices, "measure_in_child", measure)
    return loss


def test_kernels_shows_measures_and_forgets(
    tiny_config: Path, tmp_path: Path, fake_measurements: dict[str, float]
) -> None:
    code, out = invoke("kernels")
    assert code == 0, out
    assert "nothing kept for this machine yet" in out
    code, out = invoke("kernels", str(tiny_config), "--set", "model.cell=auto")
    assert code == 0, out
    assert "model.loss=log_softmax (measured: " in out
    assert "model.cell=fused (measured: " in out
    # kept: a second look reads the cache, even though the figures would now say otherwise
    fake_measurements.update(softmax=1.0)
    code, out = invoke("kernels", str(tiny_config), "--set", "model.cell=auto")
    assert "model.loss=log_softmax (cache: " in out
    code, out = invoke("kernels", "--json")
    kept = json.loads(out)["machines"]
    problems = {p for entries in kept.values() for p in entries}
    assert any(p.startswith("model.loss: ") for p in problems)
    # the user asks: measured again now, and fit keeps the new choice from then on
    code, out = invoke("kernels", "--measure", str(tiny_config), "--set", "model.cell=auto")
    assert code == 0, out
    assert "model.loss=softmax (measured: " in out
    code, out = invoke("fit", str(tiny_config), "--name", "after", "--progress", "plain")
    assert code == 0, out
    record = json.loads((tmp_path / "runs" / "after" / "kernels.json").read_text())
    loss = next(c for c in record["choices"] if c["key"] == "model.loss")
    assert (loss["value"], loss["source"]) == ("softmax", "cache")
    # forgetting: everything kept for this machine goes, the next run measures
    code, out = invoke("kernels", "--measure")
    assert code == 0, out
    assert "forgot " in out and "the next `mxtrain fit`" in out
    assert invoke("kernels")[1].count("nothing kept for this machine yet") == 1


def test_kernels_refuses_set_without_a_config(fake_measurements: dict[str, float]) -> None:
    code, out = invoke("kernels", "--set", "model.loss=auto")
    assert code == 2
    assert "--set needs a CONFIG" in out
    assert "Traceback" not in out


def test_kernels_of_a_missing_config_is_a_config_error(
    tmp_path: Path, fake_measurements: dict[str, float]
) -> None:
    code, out = invoke("kernels", str(tmp_path / "missing.yaml"))
    assert code == 2, out
    assert "missing.yaml" in out and "Traceback" not in out
