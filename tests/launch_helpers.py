"""Helpers for the end-to-end `mxtrain launch` tests: tiny data, configs, process checks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
LAUNCH_TIMEOUT = 90
# A --grace far beyond what stopping a failed job takes (launch.FAILURE_GRACE, 2 s, then
# SIGKILL, plus the processes' teardown): peers blocked in ps-lite ignore SIGTERM, so a job that
# ends in less than this did not wait out --grace, however slow or busy the machine, and the
# bound also says "does not hang" without timing the machine.
LONG_GRACE = 60

CONFIG = """\
experiment: {{name: dist, seed: 5, runs_dir: {runs}}}
model: {{name: mlp, hidden: [8], activation: relu}}
data:
  train: {train}
optimizer: {{name: sgd, learning_rate: 0.2, momentum: 0.9}}
kvstore: {{type: dist_sync}}
fit: {{num_epoch: {epochs}, log_interval: 2}}
"""


def ndarray_train(folder: Path, batch_size: int) -> str:
    return (
        f"{{iterator: ndarray, source: {folder / 'x.npy'}, labels: {folder / 'y.npy'}, "
        f"batch_size: {batch_size}}}"
    )


def make_blobs(tmp_path: Path) -> Path:
    """96 rows of 6 features in 3 classes as x.npy / y.npy in ``tmp_path``."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, size=96)
    features = rng.normal(size=(96, 6)).astype(np.float32) + labels[:, None]
    np.save(tmp_path / "x.npy", features)
    np.save(tmp_path / "y.npy", labels)
    return tmp_path


def write_config(folder: Path, name: str, train: str, epochs: int = 2) -> Path:
    path = folder / name
    path.write_text(CONFIG.format(runs=folder / "runs", train=train, epochs=epochs))
    return path


def env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment with this checkout first on the import path and one OpenMP
    thread; ``extra`` wins over both."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **(extra or {})}


def mxtrain(
    *args: object,
    timeout: float = LAUNCH_TIMEOUT,
    extra_env: dict[str, str] | None = None,
    cwd: Path = ROOT,
) -> subprocess.CompletedProcess[str]:
    """``python -m mxtrain ARGS`` in a process of its own; a run past ``timeout`` (a hang:
    the bound is generous) is killed and fails the test."""
    return subprocess.run(
        [sys.executable, "-m", "mxtrain", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env(extra_env),
        cwd=cwd,
    )


def load_params(path: Path) -> dict[str, np.ndarray]:
    import mxnet as mx

    return {k.split(":", 1)[-1]: v.asnumpy() for k, v in mx.nd.load(str(path)).items()}


def children_of(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (not yet reaped) counts as gone
    status = Path(f"/proc/{pid}/stat")
    return status.exists() and status.read_text().split()[2] != "Z"


def start_launch(*args: object, extra_env: dict[str, str] | None = None) -> subprocess.Popen:
    """``mxtrain launch ARGS`` in the background (the caller ends it and its children)."""
    return subprocess.Popen(
        [sys.executable, "-m", "mxtrain", "launch", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(extra_env),
        cwd=ROOT,
    )


def wait_for_log(launcher: subprocess.Popen, log: Path, text: str) -> None:
    deadline = time.monotonic() + LAUNCH_TIMEOUT
    while not (log.exists() and text in log.read_text()):
        assert launcher.poll() is None, launcher.communicate()
        assert time.monotonic() < deadline, f"{text!r} never appeared in {log}"
        time.sleep(0.2)


def end_all(launcher: subprocess.Popen, started: list[int]) -> None:
    """Kill, by PID, the launcher and every process it started that is still there."""
    if launcher.poll() is None:
        launcher.kill()
        launcher.communicate()
    for pid in started:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def wait_until_gone(pids: list[int], seconds: float) -> None:
    """Return once none of ``pids`` is alive, or after ``seconds``."""
    deadline = time.monotonic() + seconds
    while [p for p in pids if alive(p)] and time.monotonic() < deadline:
        time.sleep(0.1)


def descendants_of(pid: int) -> list[int]:
    """Every process below ``pid`` (children, grandchildren, ...)."""
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True)
    parents = [tuple(map(int, line.split())) for line in out.stdout.splitlines()]
    found, frontier = [], [pid]
    while frontier:
        below = [p for p, parent in parents if parent in frontier]
        found += below
        frontier = below
    return found


def processes_whose_env(matches: Callable[[list[bytes]], bool]) -> list[int]:
    """Every live process on this machine whose environment (its ``NAME=VALUE`` entries)
    ``matches``, however it was started (directly, by mpirun or by sshd)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if matches(environ) and alive(int(proc.name)):
            found.append(int(proc.name))
    return found


def processes_with_env(entry: str) -> list[int]:
    """Every live process whose environment holds ``entry`` (``NAME=VALUE``)."""
    return processes_whose_env(lambda environ: entry.encode() in environ)


def job_processes(port: str) -> list[int]:
    """Every process of the ps-lite job whose scheduler listens on ``port``."""
    return processes_with_env(f"DMLC_PS_ROOT_PORT={port}")


def process_env(pid: int) -> dict[str, str]:
    """The environment ``pid`` was started with."""
    pairs = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
    return dict(pair.split("=", 1) for pair in pairs if "=" in pair)
