"""Kvstores and distributed runs: ``kvstore:`` into MXNet objects, data sharding, the
coordinator that makes workers agree on batches and stops, and the watchdog.

Devices and threads, which every run uses, are in devices.py.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mxtrain.config.schema import (
    COMPRESSION_HINT,
    SHARDING_HINT,
    IteratorSection,
    KVStoreSection,
    gradient_compression_problem,
    sharding_problem,
)
from mxtrain.errors import ConfigError, ExitCode

log = logging.getLogger("mxtrain")


# --------------------------------------------------------------------------------------------
# kvstores
# --------------------------------------------------------------------------------------------

DIST_SYNC_TYPES = ("dist_sync", "dist_device_sync")
_DMLC_REQUIRED = ("DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_WORKER")


def is_distributed(kvstore_type: str) -> bool:
    """True for the parameter-server kvstores (``dist_*``)."""
    return kvstore_type.startswith("dist")


def resolve_update_on_kvstore(kvstore_cfg: KVStoreSection) -> bool | None:
    """``kvstore.update_on_kvstore`` as BucketingModule takes it (None: MXNet's choice).

    ``auto`` with a synchronous dist kvstore means false: the servers only sum gradients and
    every worker runs the optimizer itself, so the optimizer state is on the workers (rank 0
    saves it in checkpoints and ``resume`` continues exactly), and the small arrays workers
    use to agree on batch counts and stops pass through the servers unchanged.
    """
    value = kvstore_cfg.update_on_kvstore
    if value == "auto":
        if kvstore_cfg.type in DIST_SYNC_TYPES:
            return False
        if kvstore_cfg.type == "dist_async":
            return True  # asynchronous training only exists as updates on the servers
        if kvstore_cfg.type == "horovod":
            return False
        return None
    return bool(value)


def check_kvstore(kvstore_cfg: KVStoreSection, contexts: list[Any]) -> None:
    """Refuse kvstore settings that cannot work here, saying what to change."""
    kv_type = kvstore_cfg.type
    on_gpu = any(c.device_type == "gpu" for c in contexts)
    if kv_type == "nccl" and not on_gpu:
        raise ConfigError(
            "kvstore.type nccl all-reduces between GPUs, but context.devices is cpu.",
            hint="Use kvstore.type local or device for CPU contexts, or train on GPUs.",
        )
    if kv_type == "horovod":
        try:
            import horovod.mxnet as hvd  # optional dependency: only kvstore.type horovod needs it
        except ImportError:
            raise ConfigError(
                "kvstore.type horovod needs Horovod built with MXNet support, which is not "
                "installed.",
                hint="Build it with `HOROVOD_WITH_MXNET=1 HOROVOD_WITH_GLOO=1 pip install "
                "--no-build-isolation horovod` (docs/scale.md: Horovod), or use a dist_* kvstore "
                "with `mxtrain launch`.",
            ) from None
        hvd.init()
        if hvd.size() > 1:
            # Sharding the data by rank, one writer of the run folder and the workers'
            # agreement on batches and stops exist only for the ps-lite kvstores so far: under
            # horovodrun every process would train on all the data as rank 0.
            raise ConfigError(
                f"kvstore.type horovod with {hvd.size()} processes: mxtrain runs Horovod in "
                "one process only (it does not yet shard the data by Horovod rank or let rank "
                "0 alone write the run folder).",
                hint="Train several processes with kvstore.type dist_sync and `mxtrain launch` "
                "(--launcher mpi or ssh for several machines).",
            )
    if is_distributed(kv_type):
        missing = [k for k in _DMLC_REQUIRED if not os.environ.get(k)]
        if missing:
            raise ConfigError(
                f"kvstore.type {kv_type} needs a parameter-server job, but {', '.join(missing)} "
                "is not set in the environment.",
                hint="Start the job with `mxtrain launch -n WORKERS -s SERVERS CONFIG`, or use "
                "kvstore.type local/device on one machine.",
            )
        if os.environ.get("DMLC_ROLE") != "worker":
            raise ConfigError(
                f"DMLC_ROLE is {os.environ.get('DMLC_ROLE')!r}: only workers train.",
                hint="Servers and the scheduler run `python -c 'import mxnet'`; "
                "`mxtrain launch` starts them for you.",
            )
    problem = gradient_compression_problem(kv_type)
    if kvstore_cfg.gradient_compression is not None and problem is not None:
        raise ConfigError(problem, hint=COMPRESSION_HINT)


def create_kvstore(kvstore_cfg: KVStoreSection, contexts: list[Any]) -> Any:
    """The kvstore to hand to ``BucketingModule.init_optimizer``: an object or a type name.

    A dist kvstore is created here, once per process (a second one hangs): the caller keeps
    it and passes the same object everywhere. Gradient compression is applied here too.
    """
    # deferred: MXNet reads its thread settings when it loads (devices.configure_threads first)
    import mxnet as mx

    check_kvstore(kvstore_cfg, contexts)
    kv_type = kvstore_cfg.type
    compression = kvstore_cfg.gradient_compression
    if not is_distributed(kv_type) and (compression is None or len(contexts) == 1):
        if compression is not None:
            log.warning("kvstore.gradient_compression has no effect with a single device")
        return kv_type  # the module decides whether one device needs a kvstore at all
    kv = mx.kv.create(kv_type)
    if compression is not None:
        kv.set_gradient_compression({"type": compression.type, "threshold": compression.threshold})
    return kv


def shard_data_section(
    section: IteratorSection, rank: int, num_workers: int, where: str, kv_type: str = "dist_sync"
) -> IteratorSection:
    """``data.train`` with ``num_parts``/``part_index`` set for this worker."""
    problem = sharding_problem(kv_type, section.name, section.options)
    if problem is not None:
        raise ConfigError(f"{where}: {problem}", hint=SHARDING_HINT)
    options = section.options
    if options is None or isinstance(options, Mapping):  # None: refused above
        sharded_map = dict(options or {}, num_parts=num_workers, part_index=rank)
        return dataclasses.replace(section, options=sharded_map)
    num_parts = getattr(options, "num_parts")  # noqa: B009 (a field of the shardable dataclass)
    if num_parts not in (1, num_workers):
        log.warning(
            "%s.num_parts %d replaced by the number of workers (%d)",
            where,
            num_parts,
            num_workers,
        )
    sharded = dataclasses.replace(options, num_parts=num_workers, part_index=rank)
    return dataclasses.replace(section, options=sharded)


# --------------------------------------------------------------------------------------------
# agreement between workers, and the watchdog
# --------------------------------------------------------------------------------------------

_COUNT_BITS = 40  # batch counts are exchanged bit by bit (see Coordinator)


class Coordinator:
    """Makes every worker of a dist kvstore take the same decisions at the same moment.

    All methods are collective: every worker calls them in the same order (the fit loop
    does, since workers run the same number of batches). Values travel as float32 arrays
    pushed through the kvstore, which sums them on the servers. Each worker writes only its
    own slots, each slot holding 0 or ``unit``, so the sum is exact even with 2-bit gradient
    compression (``unit`` is its threshold: values of exactly 0 or threshold are quantized
    without loss and leave no residual).
    """

    BATCHES_KEY = "mxtrain:agree:batches"
    FLAGS_KEY = "mxtrain:agree:flags"
    FLAGS = ("stop", "time", "finish")

    def __init__(self, kv: Any, watchdog: Watchdog | None = None, unit: float = 1.0) -> None:
        # deferred: MXNet reads its thread settings when it loads (devices.configure_threads first)
        import mxnet as mx

        self._mx = mx
        self.kv = kv
        self.rank = int(kv.rank)
        self.num_workers = int(kv.num_workers)
        self.unit = float(unit)
        self.watchdog = watchdog
        self._shapes = {
            self.BATCHES_KEY: (self.num_workers, _COUNT_BITS),
            self.FLAGS_KEY: (self.num_workers, len(self.FLAGS)),
        }
        for key, shape in self._shapes.items():  # collective: every worker, same order
            kv.init(key, mx.nd.zeros(shape))

        self._should_stop: Callable[[], bool] = lambda: False
        self._max_time: float | None = None
        self._finish_requested: Callable[[], bool] = lambda: False
        self._stop = False

    def attach(
        self,
        should_stop: Callable[[], bool],
        max_time: float | None,
        finish_requested: Callable[[], bool] | None = None,
    ) -> None:
        """The local stop request (signals), time limit and request to finish early (a
        callback's) that workers must agree on."""
        self._should_stop = should_stop
        self._max_time = max_time
        self._finish_requested = finish_requested or (lambda: False)

    def stop_agreed(self) -> bool:
        """The fit loop's ``should_stop``: true once all workers agreed to stop."""
        return self._stop

    # -- the fit loop's WorkerAgreement ----------------------------------------------------
    def epoch_batches(self, epoch: int, train_iter: Any, limit: int | None) -> int | None:
        """Agree on the smallest batch count of all workers' shards (and ``limit``)."""
        count = getattr(train_iter, "num_batches", None)
        if count is None:  # e.g. image_record shards by bytes: count them by reading once
            count = sum(1 for _ in train_iter)
            train_iter.reset()
            log.info("epoch %d: this worker's shard has %d batches (counted)", epoch, count)
        counts = self.agree_batches(int(count))
        agreed = min(counts)
        if len(set(counts)) > 1:
            log.info(
                "epoch %d: workers have %s batches; every worker trains %d so that no one "
                "waits for a batch that never comes (the rest of the larger shards is skipped)",
                epoch,
                counts,
                agreed,
            )
        return agreed if limit is None else min(agreed, limit)

    def at_interval(self, seconds: float) -> str | None:
        return self._agree(seconds)

    def at_epoch_end(self, seconds: float) -> str | None:
        return self._agree(seconds)

    def _agree(self, seconds: float) -> str | None:
        time_is_up = self._max_time is not None and seconds >= self._max_time
        verdict = self.agree_stop(self._should_stop(), time_is_up, self._finish_requested())
        if verdict == "stop":
            if not self._stop:
                log.warning("all workers stop here (a stop was requested on at least one)")
            self._stop = True
            return None
        return verdict

    def _all_gather(self, key: str, row: list[bool]) -> Any:
        mx = self._mx
        mine = mx.nd.zeros(self._shapes[key])
        mine[self.rank] = mx.nd.array([self.unit if bit else 0.0 for bit in row])
        out = mx.nd.zeros(self._shapes[key])
        self.kv.push(key, mine)
        self.kv.pull(key, out=out)
        table = out.asnumpy() / self.unit  # blocks until every worker has pushed
        if self.watchdog is not None:
            self.watchdog.beat()
        return table > 0.5

    def agree_batches(self, count: int) -> list[int]:
        """Every worker's batch count for this epoch (the loop trains the minimum)."""
        bits = [bool((count >> b) & 1) for b in range(_COUNT_BITS)]
        table = self._all_gather(self.BATCHES_KEY, bits)
        return [sum(1 << b for b in range(_COUNT_BITS) if row[b]) for row in table]

    def agree_stop(
        self, stop_requested: bool, time_is_up: bool, finish_requested: bool = False
    ) -> str | None:
        """``stop`` if any worker was asked to stop, ``max_time`` if any ran out of time,
        ``callback`` if a callback on any worker asked to finish."""
        table = self._all_gather(self.FLAGS_KEY, [stop_requested, time_is_up, finish_requested])
        if table[:, 0].any():
            return "stop"
        if table[:, 1].any():
            return "max_time"
        if table[:, 2].any():
            return "callback"
        return None


class Watchdog:
    """Ends this process with a clear error when no progress was reported for too long.

    A dist_sync worker whose peer died waits forever inside MXNet (a C++ call Python cannot
    interrupt); this thread notices that ``beat()`` was not called for ``seconds`` and exits
    the process with code ``EXIT_CODE``, so ``mxtrain launch`` (or any scheduler) ends the job.
    """

    EXIT_CODE = int(ExitCode.STUCK)  # distinct from the codes of a worker that failed itself

    def __init__(self, seconds: float, *, exit: Callable[[int], Any] = os._exit) -> None:
        self.seconds = float(seconds)
        self._exit = exit
        self._last = time.monotonic()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="mxtrain-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._last = time.monotonic()
        self._thread.start()
        return self

    def beat(self) -> None:
        """Record progress (called at every agreement point: log intervals and epochs)."""
        self._last = time.monotonic()

    def stop(self) -> None:
        self._stopped.set()

    def _watch(self) -> None:
        period = min(1.0, self.seconds / 4)
        while not self._stopped.wait(period):
            idle = time.monotonic() - self._last
            if idle > self.seconds:
                message = (
                    f"error: watchdog: no training progress for {idle:.0f}s "
                    f"(kvstore.watchdog_seconds is {self.seconds:g}); another worker or a "
                    "server has probably died or hangs. Stopping this worker so the job ends "
                    "instead of hanging; see the other processes' logs. If a log interval or "
                    "an evaluation legitimately takes longer, raise kvstore.watchdog_seconds."
                )
                log.error(message)
                print(message, file=sys.stderr, flush=True)
                self._exit(self.EXIT_CODE)
                return


# --------------------------------------------------------------------------------------------
# traffic measurement (scripts/sizing.py)
# --------------------------------------------------------------------------------------------


# struct tcp_info (linux/tcp.h): tcpi_bytes_acked and tcpi_bytes_received, two u64 at 120
_TCP_INFO_BYTES = struct.Struct("=QQ")
_TCP_INFO_BYTES_OFFSET = 120


def _tcp_bytes() -> tuple[int, int]:
    """(payload bytes sent and acknowledged, payload bytes received) over every TCP socket
    this process holds, as the kernel counts them (TCP_INFO; ZeroMQ framing included)."""
    sent = received = 0
    for fd_path in Path("/proc/self/fd").iterdir():
        try:
            if not os.readlink(fd_path).startswith("socket:"):
                continue
            sock = socket.socket(fileno=os.dup(int(fd_path.name)))
        except OSError:
            continue  # closed meanwhile, or not a socket Python can wrap
        with sock:
            if sock.type != socket.SOCK_STREAM or sock.family not in (
                socket.AF_INET,
                socket.AF_INET6,
            ):
                continue
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
        end = _TCP_INFO_BYTES_OFFSET + _TCP_INFO_BYTES.size
        if len(info) >= end:
            acked, got = _TCP_INFO_BYTES.unpack_from(info, _TCP_INFO_BYTES_OFFSET)
            sent, received = sent + acked, received + got
    return sent, received


def measure_push_pull_bytes(
    shapes: list[tuple[int, ...]], updates: int, compression: Mapping[str, Any] | None = None
) -> dict[str, float]:
    """Run as the worker of a ``dist_sync`` job: push a gradient and pull every array of
    ``shapes`` ``updates`` times and return the bytes this process sent and received per
    update: TCP payload as the kernel counts it per socket (ZeroMQ framing included, TCP/IP
    headers not). Linux only.

    One round before the count warms up the connections (and, with 2-bit compression, sends
    MXNet's uncompressed first push), so the figures are the steady state of training.
    """
    # deferred: MXNet reads its thread settings when it loads (devices.configure_threads first)
    import mxnet as mx

    kv = mx.kv.create("dist_sync")
    if compression:
        kv.set_gradient_compression(dict(compression))
    keys = list(range(len(shapes)))
    kv.init(keys, [mx.nd.zeros(shape) for shape in shapes])
    mx.random.seed(0)  # the same gradients every run
    grads = [mx.nd.random.normal(shape=shape) for shape in shapes]
    outs = [mx.nd.zeros(shape) for shape in shapes]

    def one_update() -> None:
        kv.push(keys, grads)
        kv.pull(keys, out=outs)
        mx.nd.waitall()

    one_update()
    sent_before, received_before = _tcp_bytes()
    for _ in range(updates):
        one_update()
    sent_after, received_after = _tcp_bytes()
    return {
        "sent_per_update": (sent_after - sent_before) / updates,
        "received_per_update": (received_after - received_before) / updates,
        "updates": float(updates),
    }
