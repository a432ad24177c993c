"""Devices and threads: ``context:`` into OpenMP/engine thread settings and MXNet contexts.

Every run uses these, on one device or many; kvstores and distributed runs are distributed.py.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from mxtrain.errors import ConfigError

_LOG = logging.getLogger(__name__)


def configure_threads(context_cfg: Any) -> dict[str, str]:
    """Set OMP/engine threads (and MXNet's verbosity) in the environment before MXNet loads.

    ``auto`` keeps a value the user exported; otherwise it takes the cores this process may
    run on, less those other processes keep busy right now (:func:`auto_omp_threads`). An
    explicit number in the config always wins. Returns the values now in force, for the log
    (with how ``auto`` chose, under ``omp_threads_auto``). OpenMP reads the variable once,
    when MXNet loads: a change made after that (a library user who imported mxnet first)
    is logged as a warning, since it would otherwise pass unseen.
    """
    before = os.environ.get("OMP_NUM_THREADS")
    omp = context_cfg.omp_threads
    chosen = ""
    if omp != "auto":
        os.environ["OMP_NUM_THREADS"] = str(omp)
    elif "OMP_NUM_THREADS" not in os.environ:
        cores, busy = usable_cores(), busy_cpus()
        os.environ["OMP_NUM_THREADS"] = str(auto_omp_threads(cores, busy))
        chosen = f"{cores} usable cores, {busy:.1f} busy with other processes"
    # MXNet prints "Subgraph backend MKLDNN is activated" from C++ for every bucket it
    # binds, straight to stderr, which tears progress bars; it carries no information.
    os.environ.setdefault("MXNET_SUBGRAPH_VERBOSE", "0")
    engine = context_cfg.engine_threads
    if engine != "auto":
        os.environ["MXNET_CPU_WORKER_NTHREADS"] = str(engine)
    threads = {
        key: os.environ[key]
        for key in ("OMP_NUM_THREADS", "MXNET_CPU_WORKER_NTHREADS")
        if key in os.environ
    }
    if chosen:
        threads["omp_threads_auto"] = chosen
    if "mxnet" in sys.modules and os.environ.get("OMP_NUM_THREADS") != before:
        _LOG.warning(
            "OMP_NUM_THREADS=%s does not take effect: MXNet was imported before mxtrain set "
            "its threads, and OpenMP keeps %s. Import mxtrain's entry points before mxnet, or "
            "export OMP_NUM_THREADS before starting Python.",
            os.environ["OMP_NUM_THREADS"],
            f"OMP_NUM_THREADS={before}" if before else "its default (MXNet's: half the cores)",
        )
    return threads


def auto_omp_threads(cores: int, busy: float) -> int:
    """OpenMP threads for ``cores`` usable cores of which ``busy`` run other work.

    Measured on a 2-core AMD EPYC (AVX2) with 4 CPU-bound processes beside it, 3 epochs of
    ``lenet`` took 37 s with 2 threads and 26 s with 1, a PTB LSTM sample 86 s and 67 s (an
    OpenMP team waits for its slowest, descheduled thread); idle, 2 threads were faster
    (7.3 s against 10.5 s, 15 s against 25 s). The wait policy (OMP_WAIT_POLICY=PASSIVE)
    changed neither by more than the noise. So: the free cores, at least one.
    """
    return max(1, min(cores, cores - round(busy)))


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, e.g. under taskset), else all."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def busy_cpus(samples: int = 5, interval: float = 0.02) -> float:
    """Runnable threads of other processes now, averaged over a few readings of Linux's
    /proc/loadavg (0 where it cannot be read). The 1-minute load average would still count
    a job that ended seconds ago."""
    readings = []
    for i in range(samples):
        try:
            running = int(Path("/proc/loadavg").read_text().split()[3].split("/")[0])
        except (OSError, ValueError, IndexError):
            return 0.0
        readings.append(max(0, running - 1))  # the thread reading it is this process
        if i + 1 < samples:
            time.sleep(interval)
    return sum(readings) / len(readings)


def build_contexts(context_cfg: Any) -> list[Any]:
    """The list of ``mx.Context`` the config asks for, with clear errors for impossible ones."""
    import mxnet as mx

    if context_cfg.devices == "cpu":
        if context_cfg.ids:
            return [mx.cpu(i) for i in context_cfg.ids]
        return [mx.cpu(i) for i in range(context_cfg.count or 1)]
    ids = list(context_cfg.ids) if context_cfg.ids else [0]
    try:
        visible = mx.context.num_gpus()
    except mx.base.MXNetError:
        visible = 0
    if visible == 0:
        features = getattr(mx, "runtime", None)
        cuda = bool(features and features.Features().is_enabled("CUDA"))
        if not cuda:
            raise ConfigError(
                "context.devices is 'gpu' but the installed MXNet is a CPU-only build.",
                hint="Install the GPU wheel matching your CUDA version instead of 'mxnet' "
                "(for example `pip install mxnet-cu112==1.9.1` for CUDA 11.2), or set "
                "context.devices: cpu.",
            )
        raise ConfigError(
            "context.devices is 'gpu' but no GPU is visible to MXNet.",
            hint="Check the driver with nvidia-smi and CUDA_VISIBLE_DEVICES, or set "
            "context.devices: cpu.",
        )
    too_high = [i for i in ids if i >= visible]
    if too_high:
        raise ConfigError(
            f"context.ids asks for GPU {too_high[0]} but only {visible} GPU(s) are visible "
            f"(ids 0..{visible - 1}; CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}).",
            hint="Use ids below the number of visible GPUs.",
        )
    return [mx.gpu(i) for i in ids]
