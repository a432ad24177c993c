"""Kernel choices measured on the machine, not assumed.

Which of several equivalent computations is fastest depends on the CPU: oneDNN in MXNet
1.9.1 has an AVX-512 kernel for log_softmax's backward but only a reference loop on AVX2, so
the loss formulation that wins on one EPYC loses on the next. Each ``auto`` below becomes the
fastest candidate of a short measurement on the run's own shapes and first device:

* ``model.loss`` (language models): ``softmax``, ``log_softmax`` or ``softmax_output``, timed
  as output layer + loss, forward and backward;
* ``model.cell`` (language models): the fused RNN operator or one cell per layer and step;
* ``context.large_buffers`` (CPU): ``reuse`` keeps freed memory in the process (glibc's mallopt:
  no mmap, no trimming, one malloc arena) so that a buffer of tens of MB allocated every batch
  is not page-faulted in again each time; ``release`` is glibc's default. The single arena
  matters for buffers over 64 MB: a thread of its own arena (every MXNet worker thread) can
  only grow it by 64 MB heaps, so glibc maps anything larger afresh, mmap disabled or not;
  oneDNN's softmax backward allocates a buffer of the logits' size each batch (MXNet 1.9.1
  writes its in-place result through a temporary), 75 MB for 1,888 x 10,000 logits: 29 ms
  instead of 7 on a Zen 5 EPYC, one thread. The arena limit binds only threads that have not
  allocated yet, so :func:`prepare_allocator` sets it before MXNet starts its threads.

This module times the graphs it is handed (:func:`measure_graphs`) and keeps the choices; it
knows no model: mxtrain.kernel_choices builds the graphs and is the measuring process's entry
point. Each measurement runs in a process of its own (:func:`run_in_child`), once per machine
(CPU model, instruction set, MXNet and mxtrain versions, OpenMP threads, device) and problem
shape, and the choice is kept, outside the run folder, in
``$MXTRAIN_CACHE_DIR/kernels.json`` (default ``$XDG_CACHE_HOME/mxtrain``, else
``~/.cache/mxtrain``). A kept choice is never measured again because the load changed: the
candidates differ in float rounding, so two runs of one config and seed on one machine must
compute with the same ones (:func:`decide`). Only ``mxtrain kernels --measure`` or a new
machine key measures again. The run folder's config.yaml records the resolved values (so
resume, score and predict rebuild the same graph) and ``kernels.json`` the figures behind them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from mxtrain import __version__
from mxtrain.engine import allocator
from mxtrain.run.environment import cpu_facts

#: 2: model.loss one_pass's loss became a copy (models/given_gradient.py), so the figures
#: kept for it were measured on another graph; a file of another version is measured anew
CACHE_VERSION = 2
CACHE_FILE = "kernels.json"
#: timed repetitions of each candidate after WARMUP untimed ones; the median counts
REPEATS = 5
WARMUP = 2
#: the longest sequence the recurrent-layer measurement unrolls (the unfused graph binds one
#: cell per step: longer only costs binding time)
CELL_STEPS = 35
BUFFER_POLICIES = ("reuse", "release")
#: other processes' busy CPUs from which a measurement counts as taken under load (it is
#: kept all the same, with a warning)
LOADED_CPUS = 0.5
#: glibc's defaults, restored by ``release``
_GLIBC_MMAP_MAX, _GLIBC_TRIM_THRESHOLD = 65536, 128 * 1024

log = logging.getLogger("mxtrain")


@dataclasses.dataclass
class Choice:
    """One resolved setting: ``key`` (config key), ``value``, where it came from (``config``:
    set explicitly; ``measured``; ``cache``: measured earlier on this machine; ``fallback``:
    not measured, with ``why``) and the figures behind a measurement (ms per candidate)."""

    key: str
    value: str
    source: str
    problem: str = ""
    figures_ms: dict[str, float] = dataclasses.field(default_factory=dict)
    why: str = ""

    def describe(self) -> str:
        """One log line."""
        text = f"{self.key}={self.value} ({self.source}"
        if self.figures_ms:
            ms = ", ".join(f"{k} {v:.1f} ms" for k, v in self.figures_ms.items())
            text += f": {ms} per {self.problem}"
        if self.why:
            text += f"; {self.why}"
        return text + ")"


def cache_dir() -> Path:
    """Where measurements are cached (see the module docstring)."""
    explicit = os.environ.get("MXTRAIN_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mxtrain"


def machine_facts(device: str) -> dict[str, str]:
    """What a kept choice is valid for: CPU model, instruction set, MXNet and mxtrain
    versions, OpenMP threads, device (and oneDNN's ISA cap when DNNL_MAX_CPU_ISA sets one)."""
    facts = cpu_facts()
    cap = os.environ.get("DNNL_MAX_CPU_ISA") or os.environ.get("MKLDNN_MAX_CPU_ISA")
    return {
        "cpu": facts["cpu"],
        "isa": facts["isa"] + (f", oneDNN capped at {cap}" if cap else ""),
        "mxnet": _mxnet_version(),
        "mxtrain": __version__,
        "omp_threads": os.environ.get("OMP_NUM_THREADS", "default"),
        "device": device,
    }


def _mxnet_version() -> str:
    """The installed MXNet's version, without importing it (threads are set before that)."""
    for name in ("mxnet", "mxnet-mkl", "mxnet-cu112", "mxnet-cu117", "mxnet-cu110"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def machine_key(facts: dict[str, str]) -> str:
    """The cache key of ``machine_facts``."""
    return " | ".join(f"{k}={facts[k]}" for k in sorted(facts))


class CacheUnwritable(OSError):
    """The kernel cache's folder or lock file cannot be created: no choice can be kept."""


class KernelCache:
    """The JSON file of kept choices: ``{machine key: {problem: {value, figures_ms, ...}}}``.

    A missing, unreadable or foreign file is an empty cache (logged). Readers and writers
    of one machine's choices take :meth:`locked` first, so two runs starting at once agree on
    one measurement instead of each keeping its own.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[str, dict[str, Any]] = {}
        self.reload()

    def reload(self) -> None:
        """Read the file again (another process may have written it)."""
        self.entries = {}
        try:
            data = json.loads(self.path.read_text())
            if isinstance(data, dict) and data.get("version") == CACHE_VERSION:
                self.entries = {
                    k: v for k, v in data.get("machines", {}).items() if isinstance(v, dict)
                }
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as exc:
            log.warning("kernel cache %s is not readable (%s): measuring again", self.path, exc)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the cache's lock file (``kernels.json.lock``, an advisory flock) and read the
        file afresh. Raises CacheUnwritable when the folder or lock file cannot be created."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle = open(self.path.with_name(self.path.name + ".lock"), "a")  # noqa: SIM115
        except OSError as exc:
            raise CacheUnwritable(f"{self.path}: {exc.strerror or exc}") from exc
        with handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                self.reload()
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def get(self, machine: str, problem: str) -> dict[str, Any] | None:
        """The kept entry, or None."""
        entry = self.entries.get(machine, {}).get(problem)
        if isinstance(entry, dict) and isinstance(entry.get("value"), str):
            return entry
        return None

    def put(
        self,
        machine: str,
        problem: str,
        value: str,
        figures: dict[str, float],
        load: float = 0.0,
        why: str = "",
    ) -> None:
        """Keep a choice (``load``: other processes' busy CPUs while it was measured; ``why``:
        why it is a fallback rather than the fastest) and write the file."""
        entry: dict[str, Any] = {
            "value": value,
            "figures_ms": figures,
            "measured": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "load": round(load, 2),
        }
        if why:
            entry["why"] = why
        self.entries.setdefault(machine, {})[problem] = entry
        self._write()

    def forget(self, machine: str) -> int:
        """Drop every choice kept for ``machine``; returns how many there were."""
        dropped = len(self.entries.pop(machine, {}))
        if dropped:
            self._write()
        return dropped

    def _write(self) -> None:
        """Write the file atomically (a cache, not a run's record: no fsync)."""
        text = json.dumps({"version": CACHE_VERSION, "machines": self.entries}, indent=1)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(text + "\n")
            os.replace(tmp, self.path)
        except OSError as exc:
            raise CacheUnwritable(f"{self.path}: {exc.strerror or exc}") from exc


def fastest(figures: dict[str, float]) -> str:
    """The candidate with the smallest time."""
    return min(figures, key=figures.__getitem__)


@dataclasses.dataclass
class Decision:
    """A choice for one problem on this machine: ``value``, the figures behind it, and where
    it came from (``cache``: kept from an earlier run; ``measured``: now; ``fallback``: not
    measured, ``why`` says why)."""

    value: str
    figures: dict[str, float]
    source: str
    why: str = ""


#: how a user asks for a kept choice to be measured again
MEASURE_AGAIN = "`mxtrain kernels --measure CONFIG`"

#: ``MXTRAIN_MEASURE=0`` in the environment: no ``auto`` is measured or read from the cache;
#: each takes its fallback (smoke runs and CI, where every job would start from a fresh cache)
MEASURE_ENV = "MXTRAIN_MEASURE"


def measuring_off() -> bool:
    """Whether the environment turned measuring off (``MXTRAIN_MEASURE=0``)."""
    return os.environ.get(MEASURE_ENV, "").strip().lower() in ("0", "off", "no", "false")


def decide(
    cache: KernelCache,
    machine: str,
    key: str,
    measure: Callable[[], dict[str, float]],
    fallback: str,
    *,
    remeasure: bool = False,
) -> Decision:
    """The choice for ``key`` on ``machine``: the one kept from an earlier run, else the
    fastest of ``measure()`` (run now and kept).

    A kept choice is never measured again because the machine's load changed: the candidates
    round differently, and two runs of one config and seed on one machine must compute alike.
    Only ``remeasure`` (the user asked) or a new machine key (another CPU, MXNet or mxtrain)
    measures again. A measurement taken under load is kept all the same, with a warning. A
    failed measurement keeps ``fallback`` (the failure is the machine's answer until the user
    measures again). A cache that cannot be written gives ``fallback`` without measuring:
    a choice no later run could see would differ from run to run. With measuring off
    (:func:`measuring_off`) the cache is not read either: ``fallback``, whatever was kept.
    """
    if measuring_off():
        why = f"{MEASURE_ENV}=0 in the environment: not measured"
        return Decision(fallback, {}, "fallback", why)
    try:
        with cache.locked():
            entry = cache.get(machine, key)
            if entry is not None and not remeasure:
                return _kept(entry, key)
            log.info("measuring %s on this machine (the choice is kept)", key)
            before = busy_cpus()
            try:
                figures = measure()
            except (RuntimeError, ValueError, OSError) as exc:
                why = f"the measurement failed ({exc})"
                log.warning(
                    "%s: %s; using %s, kept for this machine (%s tries again)",
                    key,
                    why,
                    fallback,
                    MEASURE_AGAIN,
                )
                cache.put(machine, key, fallback, {}, why=why)
                return Decision(fallback, {}, "fallback", why)
            load = max(before, busy_cpus())
            if load >= LOADED_CPUS:
                log.warning(
                    "%s was measured while other processes kept %.1f CPUs busy: the choice "
                    "is kept all the same, so that every run on this machine computes alike; "
                    "%s on a quiet machine measures again",
                    key,
                    load,
                    MEASURE_AGAIN,
                )
            value = fastest(figures)
            cache.put(machine, key, value, figures, load)
            return Decision(value, figures, "measured")
    except CacheUnwritable as exc:
        why = (
            f"could not write the kernel cache ({exc}), so a measured choice could not be "
            "kept for the next run; set MXTRAIN_CACHE_DIR to a writable folder"
        )
        log.warning("%s: %s; using %s", key, why, fallback)
        return Decision(fallback, {}, "fallback", why)


def _kept(entry: dict[str, Any], key: str) -> Decision:
    """The Decision of a kept cache entry."""
    figures = {str(k): float(v) for k, v in (entry.get("figures_ms") or {}).items()}
    if float(entry.get("load") or 0.0) >= LOADED_CPUS:
        log.info(
            "%s: kept from a measurement taken under load (%s measures again)", key, MEASURE_AGAIN
        )
    return Decision(str(entry["value"]), figures, "cache", str(entry.get("why") or ""))


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


def median_ms(step: Callable[[], None], repeats: int = REPEATS, warmup: int = WARMUP) -> float:
    """Median wall time of ``step()`` (which must wait for its results) in milliseconds."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def bind_random(
    symbol: Any,
    ctx: Any,
    shapes: Mapping[str, tuple[int, ...]],
    classes: int = 2,
    no_gradient: Sequence[str] = (),
) -> Any:
    """An executor of ``symbol`` bound on ``ctx`` for training, its inputs drawn from a fixed
    seed: uniform in [-0.1, 0.1), ``softmax_label`` (no gradient) in 1..classes-1 (0 is the
    padding id the loss ignores); ``no_gradient``: further inputs without a gradient."""
    import mxnet as mx  # deferred: MXNet must load after the OpenMP settings are in place
    import numpy as np

    fixed = {"softmax_label", *no_gradient}
    req = {n: "null" if n in fixed else "write" for n in symbol.list_arguments()}
    executor = symbol.simple_bind(ctx, grad_req=req, **shapes)
    rng = np.random.default_rng(0)
    for name, array in executor.arg_dict.items():
        if name == "softmax_label":
            array[:] = mx.nd.array(rng.integers(1, max(2, classes), array.shape))
        else:
            array[:] = mx.nd.array(rng.uniform(-0.1, 0.1, array.shape))
    return executor


def waited(step: Callable[[], object]) -> Callable[[], None]:
    """``step`` followed by a wait for all its results (what :func:`median_ms` times)."""
    import mxnet as mx  # deferred: MXNet must load after the OpenMP settings are in place

    def run() -> None:
        step()
        mx.nd.waitall()

    return run


def train_step(
    symbol: Any, ctx: Any, shapes: Mapping[str, tuple[int, ...]], classes: int = 2
) -> Callable[[], None]:
    """The forward+backward step of ``symbol`` on random inputs (:func:`bind_random`)."""
    executor = bind_random(symbol, ctx, shapes, classes)
    return waited(lambda: (executor.forward(is_train=True), executor.backward()))


#: a graph to time: ``() -> (symbol, input shapes)``, built only when its turn comes
GraphBuilder = Callable[[], tuple[Any, Mapping[str, tuple[int, ...]]]]


def measure_graphs(
    ctx: Any, graphs: Mapping[str, GraphBuilder], classes: int = 2
) -> dict[str, float]:
    """ms per forward+backward of each graph (median, rounded to 0.01 ms), one after the
    other: a graph is built, bound and timed before the next one is built."""
    figures = {}
    for name, build in graphs.items():
        symbol, shapes = build()
        figures[name] = round(median_ms(train_step(symbol, ctx, shapes, classes)), 2)
    return figures


def prepare_allocator(policy: str) -> bool:
    """Before MXNet starts its threads: one malloc arena for a ``large_buffers`` policy that
    is or may become ``reuse`` (``auto``). Harmless if ``release`` is chosen later: the
    threads then share glibc's main arena, which only costs lock contention that MXNet's
    planned memory does not cause. Returns whether it could."""
    if policy not in ("auto", "reuse"):
        return False
    mallopt = allocator.mallopt()
    return bool(mallopt and mallopt(allocator.M_ARENA_MAX, 1))


def set_large_buffers(policy: str) -> bool:
    """Apply a ``context.large_buffers`` policy to this process's allocator (glibc only);
    returns whether it could."""
    if policy not in BUFFER_POLICIES:
        raise ValueError(f"large_buffers must be one of {BUFFER_POLICIES}, not {policy!r}")
    mallopt = allocator.mallopt()
    if mallopt is None:
        return False
    if policy == "reuse":
        ok = (
            prepare_allocator(policy)
            and mallopt(allocator.M_MMAP_MAX, 0)
            and mallopt(allocator.M_TRIM_THRESHOLD, 2**31 - 1)
        )
    else:
        ok = mallopt(allocator.M_MMAP_MAX, _GLIBC_MMAP_MAX) and mallopt(
            allocator.M_TRIM_THRESHOLD, _GLIBC_TRIM_THRESHOLD
        )
    return bool(ok)


#: how long one measuring process may take before it counts as failed
CHILD_TIMEOUT_S = 600


def run_in_child(
    entry: str, request: Mapping[str, Any], env: Mapping[str, str] | None = None
) -> dict[str, float]:
    """Run one measurement in a fresh Python process, ``python -m entry REQUEST`` (the entry
    module prints its figures as JSON on its last line), and return its figures. A process
    of its own because measuring in the training process slowed the training after it by
    13-18% (an epoch of the default word LM on a Zen 5 EPYC), because the allocator policy
    must be in force before the first large buffer, and because OpenMP reads its settings
    (``env``) once, at start. Raises RuntimeError with the child's last words when it fails."""
    command = [sys.executable, "-m", entry, json.dumps(dict(request))]
    try:
        done = subprocess.run(
            command,
            env={**os.environ, **(env or {})},
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"no result within {CHILD_TIMEOUT_S} s") from exc
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"exit code {done.returncode}: {last}")
    figures = json.loads(lines[-1])
    return {str(k): float(v) for k, v in figures.items()}


WAIT_POLICIES = ("active", "passive")


def thread_candidates(cores: int) -> list[int]:
    """OpenMP thread counts worth measuring on ``cores`` usable cores: powers of two and
    the core count itself."""
    counts = {cores}
    n = 1
    while n < cores:
        counts.add(n)
        n *= 2
    return sorted(counts)
