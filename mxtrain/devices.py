"""Devices and threads: ``context:`` into OpenMP/engine thread settings and MXNet contexts.

Every run uses these, on one device or many; kvstores and distributed runs are distributed.py.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import sys
from typing import Any

from mxtrain import kernel_choices
from mxtrain.config.schema import ContextSection
from mxtrain.engine import kernels
from mxtrain.engine.kernels import busy_cpus
from mxtrain.errors import ConfigError
from mxtrain.option_checks import MAX_THREADS

_LOG = logging.getLogger(__name__)


_THREAD_CHOICES: list[Any] = []


def thread_choices() -> list[Any]:
    """The OpenMP choices (mxtrain.engine.kernels.Choice) the last configure_threads measured
    or read from the cache, for the run folder's kernels.json; empty when none was needed."""
    return list(_THREAD_CHOICES)


def _measured_threads(
    context_cfg: ContextSection, remeasure: bool = False
) -> tuple[int, str, list[Any]] | None:
    """(threads, wait policy, choices) this machine chose (measured once and kept), or None
    when nothing is left to measure: both set in the config or exported, a distributed
    process (its peers on the same machine would measure at once), one usable core, or
    CPU-less settings. ``remeasure``: measure again what this machine kept."""
    omp, policy = context_cfg.omp_threads, getattr(context_cfg, "omp_wait_policy", "auto")
    want_threads = omp == "auto" and "OMP_NUM_THREADS" not in os.environ
    want_policy = policy == "auto" and "OMP_WAIT_POLICY" not in os.environ
    cores = usable_cores()
    if not (want_threads or want_policy) or "DMLC_ROLE" in os.environ:
        return None
    counts = kernels.thread_candidates(cores) if want_threads else [_fixed_threads(omp)]
    if max(counts) < 2 and not want_threads:
        return None  # one thread: no team, no waiting
    waits: tuple[str, ...] = kernels.WAIT_POLICIES
    if not want_policy:
        fixed = policy if policy != "auto" else os.environ["OMP_WAIT_POLICY"].lower()
        waits = (fixed,) if fixed in kernels.WAIT_POLICIES else ("active",)
    facts = kernels.machine_facts("cpu")
    facts.pop("omp_threads")
    facts["usable_cores"] = str(cores)
    machine = kernels.machine_key(facts)
    cache = kernels.KernelCache(kernels.cache_dir() / kernels.CACHE_FILE)
    p = kernel_choices.THREAD_PROBE
    problem = (
        f"{p['rows']} x {p['hidden']} -> {p['classes']} output layer + loss and a 2 x "
        f"{p['hidden']} lstm, one batch"
    )
    key = f"openmp: threads {counts}, wait {list(waits)}, {problem}"

    def measure() -> dict[str, float]:
        return {f"{n} {w}": kernel_choices.measure_threads(n, w) for n in counts for w in waits}

    rule = f"{max(counts) if want_threads else counts[0]} {waits[0]}"
    decision = kernels.decide(cache, machine, key, measure, rule, remeasure=remeasure)
    threads, wait = decision.value.split()
    given = "config" if omp != "auto" else "environment"

    def choice(name: str, value: str, wanted: bool) -> Any:
        if not wanted:
            return kernels.Choice(name, value, given if name.endswith("threads") else "config")
        return kernels.Choice(
            name, value, decision.source, problem, decision.figures, why=decision.why
        )

    choices = [
        choice("context.omp_threads", threads, want_threads),
        choice("context.omp_wait_policy", wait, want_policy),
    ]
    return int(threads), wait, choices


def _fixed_threads(omp: Any) -> int:
    if omp != "auto":
        return int(omp)
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS", "1")))
    except ValueError:
        return 1


def configure_threads(
    context_cfg: ContextSection, *, measure: bool = False, remeasure: bool = False
) -> dict[str, str]:
    """Set OMP/engine threads (and MXNet's verbosity) in the environment before MXNet loads.

    ``auto`` keeps a value the user exported; otherwise ``measure`` (fit) takes the count and
    wait policy this machine chose for good (measured once in child processes and kept:
    :func:`thread_choices` says what; ``remeasure`` measures again). The thread count changes
    float rounding (reductions split across threads), so it never follows the load: two runs
    of one config and seed on one machine compute alike, busy or quiet. Without a measurement
    ``auto`` is the usable cores (the CPU affinity, so ``taskset`` counts), except in a
    distributed process, where several processes of the job may share the machine: there it
    is the cores other processes leave free when it starts (:func:`auto_omp_threads`). An
    explicit number in the config always wins. Returns the values now in force, for the log
    (with how ``auto`` chose, under ``omp_threads_auto``). OpenMP reads the variable once,
    when MXNet loads: a change made after that (a library user who imported mxnet first) is
    logged as a warning, since it would otherwise pass unseen.
    """
    global _THREAD_CHOICES
    before = os.environ.get("OMP_NUM_THREADS")
    if context_cfg.omp_threads == "auto":
        _check_exported_threads(before)
    omp = context_cfg.omp_threads
    policy = getattr(context_cfg, "omp_wait_policy", "auto")
    chosen = ""
    measured = _measured_threads(context_cfg, remeasure) if measure else None
    _THREAD_CHOICES = measured[2] if measured else []
    if policy != "auto":
        os.environ["OMP_WAIT_POLICY"] = policy.upper()
    elif measured and "OMP_WAIT_POLICY" not in os.environ:
        os.environ["OMP_WAIT_POLICY"] = measured[1].upper()
        if measured[1] == "active":
            _wait_for_the_load(measured[0] if omp == "auto" else _fixed_threads(omp))
    if omp != "auto":
        os.environ["OMP_NUM_THREADS"] = str(omp)
    elif "OMP_NUM_THREADS" not in os.environ:
        cores = usable_cores()
        if measured:
            threads = measured[0]
            chosen = f"{cores} usable cores, {threads} chosen for this machine"
        elif "DMLC_ROLE" in os.environ:
            busy = busy_cpus()
            threads = auto_omp_threads(cores, busy)
            chosen = f"distributed process: {cores} usable cores, {busy:.1f} busy with others"
        else:
            threads = cores
            chosen = f"{cores} usable cores"
        os.environ["OMP_NUM_THREADS"] = str(threads)
    # MXNet prints "Subgraph backend MKLDNN is activated" from C++ for every bucket it
    # binds, straight to stderr, which tears progress bars; it carries no information.
    os.environ.setdefault("MXNET_SUBGRAPH_VERBOSE", "0")
    engine = context_cfg.engine_threads
    if engine != "auto":
        os.environ["MXNET_CPU_WORKER_NTHREADS"] = str(engine)
    threads_now = {
        key: os.environ[key]
        for key in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MXNET_CPU_WORKER_NTHREADS")
        if key in os.environ
    }
    if chosen:
        threads_now["omp_threads_auto"] = chosen
    if "mxnet" in sys.modules and os.environ.get("OMP_NUM_THREADS") != before:
        _LOG.warning(
            "OMP_NUM_THREADS=%s does not take effect: MXNet was imported before mxtrain set "
            "its threads, and OpenMP keeps %s. Import mxtrain's entry points before mxnet, or "
            "export OMP_NUM_THREADS before starting Python.",
            os.environ["OMP_NUM_THREADS"],
            f"OMP_NUM_THREADS={before}" if before else "its default (MXNet's: half the cores)",
        )
    return threads_now


#: what configure_threads logs when the load at start turns active waiting passive
LOAD_WAIT_WHY = (
    "{busy:.1f} runnable threads of other processes on {cores} usable cores at start: "
    "{threads} spinning OpenMP threads would take turns with them and wait for each other "
    "(the measured choice, active, is for a quiet machine)"
)


def _wait_for_the_load(threads: int) -> None:
    """Sleeping (passive) OpenMP threads when the machine is busy at start: a team that
    spins while other processes hold its cores waits for its descheduled members (100x
    slower steps were measured so), and the wait policy changes no result, unlike the
    thread count, which stays as chosen. The choice replaces the measured one in
    :func:`thread_choices` (source ``load``); config.yaml keeps ``auto``, so a resume decides
    again for its own start."""
    cores = usable_cores()
    if threads < 2:
        return  # no team: nothing waits
    busy = busy_cpus()  # an average of a few readings: a half is one thread most of the time
    if math.floor(busy + 0.5) + threads <= cores:
        return
    why = LOAD_WAIT_WHY.format(busy=busy, cores=cores, threads=threads)
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    _THREAD_CHOICES[:] = [
        kernels.Choice(c.key, "passive", "load", why=why)
        if c.key == "context.omp_wait_policy"
        else c
        for c in _THREAD_CHOICES
    ]
    _LOG.info("OMP_WAIT_POLICY=PASSIVE: %s", why)


def chosen_for_the_load() -> bool:
    """Whether the wait policy in force was chosen for the load at start."""
    return any(c.key == "context.omp_wait_policy" and c.source == "load" for c in _THREAD_CHOICES)


def prepare_process(
    context_cfg: ContextSection, *, measure: bool = False
) -> tuple[dict[str, str], ContextSection]:
    """Put a run's process settings in force before MXNet loads: the OpenMP and engine
    threads (:func:`configure_threads`) and the allocator's arenas for ``large_buffers``.
    Returns the thread settings now in force and ``context_cfg`` with them instead of
    ``auto`` (:func:`with_threads_in_force`)."""
    threads = configure_threads(context_cfg, measure=measure)
    settled = with_threads_in_force(context_cfg)
    kernels.prepare_allocator(settled.large_buffers)  # before MXNet starts its threads
    return threads, settled


def with_threads_in_force(context_cfg: ContextSection) -> ContextSection:
    """``context_cfg`` with the OpenMP settings now in force instead of ``auto``: config.yaml
    records them, so a resume runs the same thread count (and float rounding)."""
    changes: dict[str, Any] = {}
    if context_cfg.omp_threads == "auto" and os.environ.get("OMP_NUM_THREADS", "").isdigit():
        changes["omp_threads"] = int(os.environ["OMP_NUM_THREADS"])
    wait = os.environ.get("OMP_WAIT_POLICY", "").lower()
    if (
        context_cfg.omp_wait_policy == "auto"
        and wait in ("active", "passive")
        and not chosen_for_the_load()  # a resume decides for its own start
    ):
        changes["omp_wait_policy"] = wait
    return dataclasses.replace(context_cfg, **changes) if changes else context_cfg


def _check_exported_threads(exported: str | None) -> None:
    """An exported OMP_NUM_THREADS that ``omp_threads: auto`` would keep must be a count the
    config could hold too (a larger one crashes MXNet natively); OpenMP's own forms (lists
    such as ``4,2``) pass unchecked."""
    if exported is not None and exported.strip().isdigit() and int(exported) > MAX_THREADS:
        raise ConfigError(
            f"OMP_NUM_THREADS={exported} (exported) asks for more than the {MAX_THREADS:,} "
            "threads mxtrain allows: more threads than the largest machines have cores only "
            "add switching, and MXNet crashes when it cannot start them.",
            hint="Export a smaller OMP_NUM_THREADS, unset it (omp_threads: auto then takes the "
            "count measured for this machine), or set context.omp_threads.",
        )


def auto_omp_threads(cores: int, busy: float) -> int:
    """OpenMP threads for a distributed process on ``cores`` usable cores of which ``busy``
    run other work (several processes of one job may share a machine).

    Measured on a 2-core AMD EPYC (AVX2) with 4 CPU-bound processes beside it, 3 epochs of
    ``lenet`` took 37 s with 2 threads and 26 s with 1 (an OpenMP team waits for its
    slowest, descheduled thread); idle, 2 threads were faster (7.3 s against 10.5 s). So:
    the free cores, at least one.
    """
    return max(1, min(cores, cores - round(busy)))


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, e.g. under taskset), else all."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def build_contexts(context_cfg: ContextSection) -> list[Any]:
    """The list of ``mx.Context`` the config asks for, with clear errors for impossible ones."""
    # deferred: MXNet reads its thread settings when it loads (devices.configure_threads first)
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
