"""Facts about the environment a run trained in: versions, machine, threads, git commit.

Recorded in run.json (``environment``) and logged at the start of every ``fit`` and
``resume``, so a run can be explained months later ("which MXNet? how many threads? which
commit of my code?"). Collecting them never fails a run: a fact that cannot be read is left
out.
"""

from __future__ import annotations

import logging
import os
import platform
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from functools import cache
from importlib.metadata import version
from pathlib import Path
from typing import Any

from mxtrain import __version__

log = logging.getLogger("mxtrain")

#: Environment variables that change how MXNet and its math libraries run.
ENV_PREFIXES = ("OMP_", "MXNET_", "OPENBLAS_", "MKL_", "KMP_", "DMLC_")
ENV_NAMES = ("CUDA_VISIBLE_DEVICES",)

#: MXNet build features worth knowing when comparing speed or results between machines.
MXNET_FEATURES = (
    "CUDA",
    "CUDNN",
    "NCCL",
    "MKLDNN",
    "OPENMP",
    "BLAS_OPEN",
    "BLAS_MKL",
    "DIST_KVSTORE",
)

GIT_TIMEOUT_S = 5.0


def relevant_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The thread and library settings among the environment variables, sorted by name."""
    environ = os.environ if environ is None else environ
    return {
        name: environ[name]
        for name in sorted(environ)
        if name.startswith(ENV_PREFIXES) or name in ENV_NAMES
    }


def git_state(folder: Path, *, timeout: float = GIT_TIMEOUT_S) -> dict[str, Any] | None:
    """``{"commit", "dirty", "root"}`` of the git work tree holding ``folder``, or None.

    None when git is not installed, ``folder`` is not inside a work tree, or git does not
    answer within ``timeout`` seconds. ``dirty`` (tracked files modified) is None when only
    the status check timed out, e.g. in a very large repository.
    """

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(folder), *args],
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "--verify", "HEAD")
    if not commit:
        return None
    root = git("rev-parse", "--show-toplevel")
    # Untracked files are left out: build outputs and run folders would make every tree dirty.
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": None if status is None else bool(status), "root": root}


def _package_version(name: str) -> str | None:
    try:
        return version(name)
    except Exception:  # a missing or broken distribution is just an unknown version
        return None


def versions() -> dict[str, str]:
    """mxtrain's, MXNet's, NumPy's and Python's versions (every checkpoint records them;
    imports MXNet: call after threads are set)."""
    # deferred: MXNet reads its thread settings when it loads (devices.configure_threads first)
    import mxnet as mx
    import numpy  # deferred: imported with MXNet, after the thread settings

    return {
        "mxtrain": __version__,
        "mxnet": mx.__version__,
        "numpy": numpy.__version__,
        "python": platform.python_version(),
    }


def _mxnet_features() -> list[str] | None:
    """The build features of :data:`MXNET_FEATURES` this MXNet has (None: it cannot say)."""
    # deferred: MXNet reads its thread settings when it loads (devices.configure_threads first)
    import mxnet as mx

    try:
        features = mx.runtime.Features()
        return [f for f in MXNET_FEATURES if features.is_enabled(f)]
    except Exception:  # older or unusual builds without the runtime features API
        return None


def run_json_facts() -> dict[str, Any]:
    """The facts run.json keeps at its top level since its first version (``mxtrain runs`` and
    ``show`` read them there; the full set is under ``environment``)."""
    return {
        "mxtrain": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "argv": sys.argv,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "MXNET_CPU_WORKER_NTHREADS": os.environ.get("MXNET_CPU_WORKER_NTHREADS"),
    }


@cache
def _first_cpu() -> dict[str, str]:
    """The first CPU's entries of /proc/cpuinfo (empty where it cannot be read)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    first: dict[str, str] = {}
    for line in lines:
        key, _, value = line.partition(":")
        first.setdefault(key.strip(), value.strip())
    return first


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (``avx2``, ``avx512_vnni``, ...); empty where unknown."""
    return frozenset(_first_cpu().get("flags", "").split())


def cpu_facts() -> dict[str, str]:
    """The CPU model and the widest vector instruction set MXNet's kernels can use (AVX-512,
    AVX2 or neither): what decides which kernels win, so every figure names them."""
    first = _first_cpu()
    model = first.get("model name") or platform.processor() or "unknown"
    if "cpu family" in first and "model" in first:  # virtual machines often name no model
        model += f" (family {first['cpu family']}, model {first['model']})"
    flags = cpu_flags()
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return {"cpu": model, "isa": isa}


def collect(
    *,
    contexts: Sequence[Any] = (),
    seed: int | None = None,
    threads: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> dict[str, Any]:
    """Every environment fact, JSON-able; ``git`` is present only inside a git work tree."""
    facts: dict[str, Any] = versions()
    features = _mxnet_features()
    if features is not None:
        facts["mxnet_features"] = features
    facts.update(
        platform=platform.platform(),
        hostname=socket.gethostname(),
        cpu_count=os.cpu_count(),
        **cpu_facts(),
        contexts=[str(c) for c in contexts],
        threads=dict(threads or {}),
        env=relevant_env(),
        seed=seed,
        cwd=str(cwd or Path.cwd()),
    )
    rich_version = _package_version("rich")
    if rich_version:
        facts["rich"] = rich_version
    git = git_state(cwd or Path.cwd())
    if git is not None:
        facts["git"] = git
    return facts


def describe(facts: Mapping[str, Any]) -> str:
    """One line for the log: versions, devices, threads, seed and commit."""
    parts = [
        f"mxtrain {facts.get('mxtrain')}",
        f"MXNet {facts.get('mxnet', '?')}",
        f"numpy {facts.get('numpy')}",
        f"Python {facts.get('python')}",
        str(facts.get("platform")),
        f"{facts.get('cpu_count')} CPUs ({facts.get('cpu', '?')}, {facts.get('isa', '?')})",
    ]
    if facts.get("contexts"):
        parts.append("contexts " + ",".join(facts["contexts"]))
    threads = facts.get("threads") or {}
    if threads:
        parts.append(" ".join(f"{k}={v}" for k, v in threads.items()))
    parts.append(f"seed {facts.get('seed')}")
    git = facts.get("git")
    if git:
        dirty = {True: " (dirty)", False: "", None: " (dirty: unknown)"}[git.get("dirty")]
        parts.append(f"git {str(git.get('commit'))[:12]}{dirty}")
    return ", ".join(parts)


def log_facts(facts: Mapping[str, Any], *, logger: logging.Logger = log) -> None:
    """One INFO summary line, then every fact at DEBUG level (the run's train.log keeps both)."""
    logger.info("environment: %s", describe(facts))
    for key, value in facts.items():
        if isinstance(value, Mapping):
            for sub_key, sub_value in value.items():
                logger.debug("environment %s.%s = %s", key, sub_key, sub_value)
        else:
            logger.debug("environment %s = %s", key, value)
