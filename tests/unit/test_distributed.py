"""Contexts, kvstore checks, worker agreement, the watchdog and launch command building."""

from __future__ import annotations

import os
import sys
import threading
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from mxtrain import devices, distributed
from mxtrain.config.loader import load_config
from mxtrain.config.schema import ContextSection, KVStoreSection
from mxtrain.errors import ConfigError, MxtrainError
from mxtrain.launch import (
    Cluster,
    JobSpec,
    LaunchError,
    ProcessSpec,
    _forwarded_env,
    check_hosts_reach_scheduler,
    check_ssh_options,
    describe_mpi_failure,
    local_processes,
    mpi_processes,
    mpi_rank_from_env,
    parse_mpi_rank_lines,
    parse_rank_line,
    rank_line,
    read_hosts,
    read_mpi_hostfile,
    ssh_processes,
)

DMLC = {
    "DMLC_ROLE",
    "DMLC_PS_ROOT_URI",
    "DMLC_PS_ROOT_PORT",
    "DMLC_NUM_WORKER",
    "DMLC_NUM_SERVER",
    "DMLC_NODE_HOST",
}


# --- contexts ---------------------------------------------------------------------------------


def test_gpu_on_the_cpu_build_names_the_gpu_wheel() -> None:
    with pytest.raises(ConfigError) as err:
        devices.build_contexts(ContextSection(devices="gpu", ids=(0,)))
    assert "CPU-only build" in str(err.value) and "pip install mxnet-cu112==1.9.1" in str(err.value)


def test_gpu_id_beyond_the_visible_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    import mxnet as mx

    monkeypatch.setattr(mx.context, "num_gpus", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    with pytest.raises(ConfigError) as err:
        devices.build_contexts(ContextSection(devices="gpu", ids=(0, 2)))
    assert "GPU 2" in str(err.value) and "only 2 GPU(s)" in str(err.value)
    assert "CUDA_VISIBLE_DEVICES=4,5" in str(err.value)
    gpus = devices.build_contexts(ContextSection(devices="gpu", ids=(1, 0)))
    assert [c.device_id for c in gpus] == [1, 0] and gpus[0].device_type == "gpu"


def test_cpu_contexts_from_count_and_ids() -> None:
    assert len(devices.build_contexts(ContextSection(count=3))) == 3
    ids = devices.build_contexts(ContextSection(ids=(2, 5)))
    assert [c.device_id for c in ids] == [2, 5]


def test_fit_asking_for_a_gpu_fails_cleanly(tiny_config: Path) -> None:
    from mxtrain.cli.main import cli

    result = CliRunner().invoke(cli, ["fit", str(tiny_config), "--set", "context.devices=gpu"])
    assert result.exit_code == 2
    assert "mxnet-cu112" in result.output and "Traceback" not in result.output
    assert not (tiny_config.parent / "runs" / "tiny").exists()


# --- kvstore settings ---------------------------------------------------------------------------


def test_schema_rules_for_kvstore() -> None:
    with pytest.raises(Exception, match="1bit is not available"):
        KVStoreSection(type="device", gradient_compression=_compression("1bit", 0.5))
    with pytest.raises(Exception, match="greater than 0"):
        KVStoreSection(type="device", gradient_compression=_compression("2bit", 0.0))
    with pytest.raises(Exception, match="must therefore only sum"):
        KVStoreSection(type="dist_sync", update_on_kvstore=True)
    with pytest.raises(Exception, match="asynchronous"):
        KVStoreSection(type="dist_async", update_on_kvstore=False)
    assert distributed.resolve_update_on_kvstore(KVStoreSection(type="dist_sync")) is False
    assert distributed.resolve_update_on_kvstore(KVStoreSection(type="dist_async")) is True
    assert distributed.resolve_update_on_kvstore(KVStoreSection(type="device")) is None
    assert distributed.resolve_update_on_kvstore(KVStoreSection(update_on_kvstore=False)) is False


def _compression(kind: str, threshold: float) -> Any:
    from mxtrain.config.schema import GradientCompressionSection

    return GradientCompressionSection(type=kind, threshold=threshold)  # type: ignore[arg-type]


def test_gradient_compression_config_error_has_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "model: {name: mlp}\ndata:\n  train: {iterator: ndarray, source: x.npy}\n"
        "kvstore:\n  type: device\n  gradient_compression: {type: 2bit, threshold: -1}\n"
    )
    with pytest.raises(ConfigError, match=r"c\.yaml:6: kvstore\.gradient_compression\.threshold"):
        load_config(path)


def test_impossible_kvstores_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import mxnet as mx

    cpus = [mx.cpu(0), mx.cpu(1)]
    with pytest.raises(ConfigError, match="nccl all-reduces between GPUs"):
        distributed.check_kvstore(KVStoreSection(type="nccl"), cpus)
    monkeypatch.setitem(sys.modules, "horovod", None)
    monkeypatch.setitem(sys.modules, "horovod.mxnet", None)
    with pytest.raises(ConfigError, match=r"HOROVOD_WITH_MXNET=1 HOROVOD_WITH_GLOO=1"):
        distributed.check_kvstore(KVStoreSection(type="horovod"), cpus)
    # under horovodrun with several processes: refused (mxtrain is not rank-aware there yet)
    fake = types.ModuleType("horovod.mxnet")
    fake.init = lambda: None  # type: ignore[attr-defined]
    fake.size = lambda: 2  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "horovod", types.ModuleType("horovod"))
    monkeypatch.setitem(sys.modules, "horovod.mxnet", fake)
    with pytest.raises(ConfigError, match=r"horovod with 2 processes.*mxtrain launch"):
        distributed.check_kvstore(KVStoreSection(type="horovod"), cpus)
    fake.size = lambda: 1  # type: ignore[attr-defined]
    distributed.check_kvstore(KVStoreSection(type="horovod"), cpus)  # one process: fine
    for key in DMLC:
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ConfigError, match="mxtrain launch -n WORKERS"):
        distributed.check_kvstore(KVStoreSection(type="dist_sync"), cpus)
    with pytest.raises(ConfigError, match="only for the device and dist"):
        distributed.check_kvstore(
            KVStoreSection(type="local", gradient_compression=_compression("2bit", 0.5)), cpus
        )


def test_device_kvstore_gets_gradient_compression() -> None:
    import mxnet as mx

    cfg = KVStoreSection(type="device", gradient_compression=_compression("2bit", 0.5))
    kv = distributed.create_kvstore(cfg, [mx.cpu(0), mx.cpu(1)])
    kv.init("w", mx.nd.zeros((3,)))
    out = mx.nd.zeros((3,))
    grads = [mx.nd.array([0.7, 0.2, -0.9], ctx=mx.cpu(0)), mx.nd.array([0.0] * 3, ctx=mx.cpu(1))]
    kv.pushpull("w", grads, out=out)
    assert out.asnumpy().tolist() == [0.5, 0.0, -0.5]  # quantized to +-threshold or 0
    assert distributed.create_kvstore(KVStoreSection(type="device"), [mx.cpu(0)]) == "device"


# --- data sharding ------------------------------------------------------------------------------


def test_shard_data_section_sets_parts_or_explains() -> None:
    from mxtrain.config.schema import IteratorSection
    from mxtrain.data.array_options import NDArrayOptions

    section = IteratorSection(name="ndarray", options=NDArrayOptions(source="x.npy"))
    sharded = distributed.shard_data_section(section, 1, 3, "data.train")
    assert (sharded.options.num_parts, sharded.options.part_index) == (3, 1)
    plugin = IteratorSection(name="p.py:make", options={"num_parts": 1, "path": "a"})
    assert distributed.shard_data_section(plugin, 2, 4, "data.train").options == {
        "num_parts": 4,
        "part_index": 2,
        "path": "a",
    }
    other = IteratorSection(name="p.py:make", options={"path": "a"})
    with pytest.raises(ConfigError, match="cannot be sharded"):
        distributed.shard_data_section(other, 0, 2, "data.train")


# --- agreement between workers --------------------------------------------------------------


@dataclass
class FakeServers:
    """Sums what the workers push, like ps-lite servers without an optimizer."""

    num_workers: int
    pushed: dict[str, list[np.ndarray]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.barrier = threading.Barrier(self.num_workers)
        self.lock = threading.Lock()


class FakeKV:
    def __init__(self, servers: FakeServers, rank: int) -> None:
        self.servers, self.rank, self.num_workers = servers, rank, servers.num_workers

    def init(self, key: str, value: Any) -> None:
        assert isinstance(key, str)  # one kvstore cannot mix int and str keys

    def push(self, key: str, value: Any) -> None:
        with self.servers.lock:
            self.servers.pushed.setdefault(key, []).append(value.asnumpy())

    def pull(self, key: str, out: Any) -> None:
        self.servers.barrier.wait(5)
        out[:] = sum(self.servers.pushed[key])
        self.servers.barrier.wait(5)
        with self.servers.lock:
            self.servers.pushed.pop(key, None)


def run_workers(calls: list[Any], unit: float = 1.0) -> list[Any]:
    servers = FakeServers(len(calls))
    coordinators = [
        distributed.Coordinator(FakeKV(servers, r), unit=unit) for r in range(len(calls))
    ]
    results: list[Any] = [None] * len(calls)

    def work(rank: int) -> None:
        results[rank] = calls[rank](coordinators[rank])

    threads = [threading.Thread(target=work, args=(r,)) for r in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return results


class Shard:
    def __init__(self, batches: int, known: bool = True) -> None:
        self.items = list(range(batches))
        if known:
            self.num_batches = batches
        self.resets = 0

    def __iter__(self) -> Any:
        return iter(self.items)

    def reset(self) -> None:
        self.resets += 1


@pytest.mark.parametrize("unit", [1.0, 0.5])
def test_workers_agree_on_the_smallest_batch_count(unit: float) -> None:
    shards = [Shard(37), Shard(1234567), Shard(36, known=False)]
    results = run_workers([lambda c, s=s: c.epoch_batches(1, s, None) for s in shards], unit=unit)
    assert results == [36, 36, 36]
    assert shards[2].resets == 1  # counted by reading, then rewound
    limited = run_workers([lambda c: c.epoch_batches(1, Shard(50), 20)] * 2)
    assert limited == [20, 20]


def test_one_workers_stop_request_stops_everyone() -> None:
    requested = [False, True]

    def worker(rank: int) -> Any:
        def call(c: distributed.Coordinator) -> Any:
            c.attach(lambda: requested[rank], max_time=100.0)
            return c.at_interval(5.0), c.stop_agreed()

        return call

    assert run_workers([worker(0), worker(1)]) == [(None, True), (None, True)]

    def timed(seconds: float) -> Any:
        def call(c: distributed.Coordinator) -> Any:
            c.attach(lambda: False, max_time=10.0)
            return c.at_epoch_end(seconds), c.stop_agreed()

        return call

    assert run_workers([timed(3.0), timed(11.0)]) == [("max_time", False)] * 2
    assert run_workers([timed(3.0), timed(4.0)]) == [(None, False)] * 2


def test_watchdog_exits_when_progress_stops_and_not_before() -> None:
    """Bounds that hold on a slow or busy machine: beats 0.1 s apart keep a 2 s watchdog
    quiet (a thread would have to stall 1.9 s), and once they stop it exits no sooner than
    2 s after the last beat and, generously, within 60 s (instead of sleeping a fixed time
    and expecting the watchdog thread to have run by then)."""
    exits: list[tuple[int, float]] = []
    dog = distributed.Watchdog(2.0, exit=lambda code: exits.append((code, time.monotonic())))
    dog.start()
    for _ in range(5):
        time.sleep(0.1)
        last_beat = time.monotonic()  # taken before beat(): the watchdog's is no earlier
        dog.beat()
    assert exits == []
    deadline = time.monotonic() + 60
    while not exits and time.monotonic() < deadline:
        time.sleep(0.05)
    dog.stop()
    assert [code for code, _ in exits] == [distributed.Watchdog.EXIT_CODE]
    assert exits[0][1] - last_beat > 2.0


# --- launch commands ----------------------------------------------------------------------------


def job(**kw: Any) -> JobSpec:
    return JobSpec(2, 1, ["fit", "cfg.yaml", "--set", "a=b c"], python="py", workdir="/w d", **kw)


def test_local_processes_set_every_dmlc_variable_on_localhost() -> None:
    specs = local_processes(job(forward_env={"X": "1"}), port=9123)
    assert [s.label for s in specs] == ["scheduler", "server 0", "worker #0", "worker #1"]
    assert [s.launch_index for s in specs] == [None, None, 0, 1]
    assert [s.log_name for s in specs[1:]] == [
        "server-0.log",
        "worker-launch-0.log",
        "worker-launch-1.log",
    ]
    for spec in specs:
        assert set(spec.env) >= DMLC
        assert spec.env["DMLC_PS_ROOT_URI"] == spec.env["DMLC_NODE_HOST"] == "127.0.0.1"
        assert spec.env["DMLC_PS_ROOT_PORT"] == "9123" and spec.env["X"] == "1"
        assert (spec.env["DMLC_NUM_WORKER"], spec.env["DMLC_NUM_SERVER"]) == ("2", "1")
    assert specs[1].env["DMLC_ROLE"] == "server"
    assert specs[1].argv == ["py", "-c", "import mxtrain, mxnet"]
    assert specs[3].argv[:4] == ["py", "-m", "mxtrain", "fit"]
    assert specs[3].argv[-2:] == ["--progress", "plain"]


def test_ssh_commands_round_robin_with_quoted_environment() -> None:
    specs = ssh_processes(job(forward_env={"OMP_NUM_THREADS": "4"}), ["h1", "h2"], "10.0.0.9", 9000)
    assert specs[0].label == "scheduler" and specs[0].env["DMLC_PS_ROOT_URI"] == "10.0.0.9"
    hosts = [s.argv[s.argv.index("BatchMode=yes") + 1] for s in specs[1:]]
    assert hosts == ["h1", "h2", "h1"]
    assert [(s.label, s.launch_index) for s in specs[1:]] == [
        ("server 0", None),
        ("worker #0", 0),
        ("worker #1", 1),
    ]
    remote = specs[3].argv[-1]
    assert remote.startswith("cd '/w d' && exec env ")
    assert all(spec.relay_signals for spec in specs[1:]) and not specs[0].relay_signals
    for part in ("DMLC_ROLE=worker", "DMLC_NODE_HOST=h1", "DMLC_PS_ROOT_URI=10.0.0.9",
                 "DMLC_PS_ROOT_PORT=9000", "OMP_NUM_THREADS=4"):  # fmt: skip
        assert part in remote
    # the remote relay (grace 10 s) runs the worker and passes on signals written to ssh
    assert remote.endswith(
        "py -m mxtrain.launch --relay 10 -- py -m mxtrain fit cfg.yaml --set 'a=b c' "
        "--progress plain"
    )


def test_mpi_commands_forward_the_environment() -> None:
    specs = mpi_processes(job(), "hosts.txt", "10.0.0.9", 9000)
    assert [s.label for s in specs] == ["scheduler", "servers", "workers"]
    assert all(s.launch_index is None for s in specs)  # one stream for all ranks: no relabel
    workers = specs[2].argv
    assert workers[:5] == ["mpirun", "-np", "2", "--hostfile", "hosts.txt"]
    assert "DMLC_ROLE=worker" in workers and workers[workers.index("DMLC_ROLE=worker") - 1] == "-x"
    assert "DMLC_PS_ROOT_URI=10.0.0.9" in workers
    assert not any(a.startswith("DMLC_NODE_HOST") for a in workers)
    # each process mpirun starts dies with it (it is not the launcher's child)
    guard = workers.index("--die-with-parent")
    assert workers[guard - 2 : guard + 2] == ["-m", "mxtrain.launch", "--die-with-parent", "--"]
    assert workers[guard + 2 :][:4] == ["py", "-m", "mxtrain", "fit"]


def test_mpi_on_a_loopback_scheduler_keeps_every_node_on_loopback() -> None:
    specs = mpi_processes(job(), None, "127.0.0.1", 9000)
    for spec in specs[1:]:
        assert "DMLC_NODE_HOST=127.0.0.1" in spec.argv
        assert "--hostfile" not in spec.argv


def test_ssh_options_and_user_at_host() -> None:
    specs = ssh_processes(job(), ["me@10.0.0.5"], "10.0.0.9", 9000, ["Port=2222", "User=x"])
    argv = specs[1].argv
    assert argv[:5] == ["ssh", "-o", "StrictHostKeyChecking=no", "-o", "BatchMode=yes"]
    assert argv[5:10] == ["-o", "Port=2222", "-o", "User=x", "me@10.0.0.5"]
    assert "DMLC_NODE_HOST=10.0.0.5" in argv[-1]  # the address, not ssh's user@ prefix
    check_ssh_options(["Port=2222", "IdentityFile=/k"])
    for bad in ("Port", "=2", "Port=", "-p=2"):
        with pytest.raises(ConfigError, match="KEY=VALUE"):
            check_ssh_options([bad])


def test_a_loopback_scheduler_refuses_other_hosts(tmp_path: Path) -> None:
    check_hosts_reach_scheduler(["127.0.0.1", "localhost", "me@127.0.0.2"], "127.0.0.1", "x")
    check_hosts_reach_scheduler(["node1"], "10.0.0.9", "x")  # a routable scheduler: fine
    with pytest.raises(ConfigError, match="--hosts h names node1, ::2") as caught:
        check_hosts_reach_scheduler(["127.0.0.1", "node1", "::2"], "::1", "--hosts h")
    assert "--scheduler-host" in caught.value.hint
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# OpenMPI\nnode1 slots=4 max_slots=8\nnode2\n")
    assert read_mpi_hostfile(hostfile) == ["node1", "node2"]


def test_rank_lines_carry_the_mpi_rank_and_mpirun_reports_are_read() -> None:
    line = rank_line(1, 2, mpi_rank=0)
    assert parse_rank_line(line) == 1 and parse_mpi_rank_lines(line) == [(1, 0)]
    assert parse_mpi_rank_lines(rank_line(1, 2)) == []
    # two workers' lines run together in mpirun's shared stream (seen on one core)
    merged = rank_line(0, 2, mpi_rank=0) + rank_line(1, 2, mpi_rank=1)
    assert parse_mpi_rank_lines(merged) == [(0, 0), (1, 1)]
    assert mpi_rank_from_env({"OMPI_COMM_WORLD_RANK": "3"}) == 3
    assert mpi_rank_from_env({"PMI_RANK": "2"}) == 2 and mpi_rank_from_env({}) is None
    killed = [
        "---",
        "mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed).",
    ]
    report = describe_mpi_failure(killed, {1: 0})
    assert report is not None and report.signalled
    assert report.text == "worker rank 0 (MPI rank 1) on node vm was killed by SIGKILL"
    report = describe_mpi_failure(killed, {})
    assert report is not None
    assert report.text.startswith("the worker of MPI rank 1 (its ps-lite rank was not known yet)")
    failed = [
        "mpirun detected that one or more processes exited with non-zero status, thus causing",
        "the job to be terminated. The first process to do so was:",
        "",
        "  Process name: [[41779,1],0]",
        "  Exit code:    2",
    ]
    report = describe_mpi_failure(failed, {0: 1})
    assert report is not None and not report.signalled
    assert report.text == "worker rank 1 (MPI rank 0) exited with code 2"
    assert describe_mpi_failure(["just output"], {}) is None


def test_hosts_file_and_env_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("# cluster\nnode1\n\nnode2  # fast\n")
    assert read_hosts(hosts) == ["node1", "node2"]
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(ConfigError, match="lists no host"):
        read_hosts(tmp_path / "empty")
    monkeypatch.setenv("MY_VAR", "7")
    monkeypatch.delenv("NOT_SET_HERE", raising=False)
    assert _forwarded_env(["MY_VAR", "B=x=y"]) == {"MY_VAR": "7", "B": "x=y"}
    with pytest.raises(ConfigError, match="not set here"):
        _forwarded_env(["NOT_SET_HERE"])
    with pytest.raises(ConfigError, match="NAME or NAME=VALUE"):
        _forwarded_env(["=3"])


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_cluster_stops_everyone_when_one_fails(tmp_path: Path) -> None:
    specs = [
        ProcessSpec("scheduler", _python("import time; time.sleep(60)")),
        ProcessSpec("worker 0", _python("import time; time.sleep(60)")),
        ProcessSpec("worker 1", _python("print('loading'); print('bad data'); exit(3)")),
    ]
    lines: list[str] = []
    started = time.monotonic()
    cluster = Cluster(specs, tmp_path / "logs", grace=1.0, echo=lines.append)
    with pytest.raises(LaunchError) as err, cluster:
        cluster.wait()
    # does not wait for the survivors' 60 s sleeps (generous: a loaded machine starts slowly)
    assert time.monotonic() - started < 30
    assert err.value.exit_code == 3
    assert "worker 1 exited with code 3" in str(err.value) and "bad data" in str(err.value)
    assert "[worker 1] bad data" in lines
    assert (tmp_path / "logs" / "worker-1.log").read_text() == "loading\nbad data\n"
    for pid in cluster.pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert isinstance(err.value, MxtrainError)


def test_cluster_sigterm_survivor_is_killed_after_grace(tmp_path: Path) -> None:
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    specs = [
        ProcessSpec("server 0", _python(stubborn)),
        ProcessSpec(
            "worker #0",
            _python("import os, signal; os.kill(os.getpid(), signal.SIGKILL)"),
            launch_index=0,
        ),
    ]
    cluster = Cluster(specs, tmp_path, grace=0.5, echo=lambda line: None)
    expected = r"worker launch #0 \(its rank was not known yet\) was killed by SIGKILL"
    with pytest.raises(LaunchError, match=expected), cluster:
        cluster.wait()
    assert all(r.process.returncode is not None for r in cluster.running)


def test_rank_lines_round_trip_and_nothing_else_parses() -> None:
    assert parse_rank_line(rank_line(3, 8)) == 3
    assert parse_rank_line(rank_line(0, 1) + "\r") == 0  # as it arrives through ssh
    for other in (
        "",
        "distributed worker rank 1 of 2 (kvstore dist_sync)",
        "2024-01-01 INFO mxtrain: worker rank 1 of 2",
        "mxtrain: worker rank one of 2",
        "mxtrain: worker rank 1 of 2 and more",
    ):
        assert parse_rank_line(other) is None, other


def _announcing(rank: int, before: str, after: str, exit_code: int = 0) -> list[str]:
    return _python(
        f"import sys; print({before!r}); print({rank_line(rank, 2)!r}, file=sys.stderr); "
        f"print({after!r}); sys.exit({exit_code})"
    )


def test_workers_are_relabelled_and_logged_by_the_rank_they_announce(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    # a resumed job reuses the log folder: what earlier launches wrote must stay
    (logs / "worker-launch-0.log").write_text("an earlier launch\n")
    (logs / "worker-rank-1.log").write_text("rank 1 before\n")
    specs = [
        ProcessSpec("worker #0", _announcing(1, "loading", "training"), launch_index=0),
        ProcessSpec("worker #1", _announcing(0, "hello", "run folder x"), launch_index=1),
        # mpi: one stream for several workers keeps its label
        ProcessSpec("workers", _announcing(5, "a", "b")),
    ]
    lines: list[str] = []
    with Cluster(specs, logs, grace=1.0, echo=lines.append) as cluster:
        result = cluster.wait()
    assert result.exit_codes == {"worker 1": 0, "worker 0": 0, "workers": 0}
    assert "[worker #0] loading" in lines and "[worker 1] training" in lines
    assert "[worker #1] hello" in lines and "[worker 0] run folder x" in lines
    assert "[workers] b" in lines
    announced = rank_line(1, 2)
    assert (logs / "worker-rank-1.log").read_text() == (
        f"rank 1 before\nloading\n{announced}\ntraining\n"
    )
    assert (logs / "worker-rank-0.log").read_text().startswith("hello\n")
    assert (logs / "worker-launch-0.log").read_text() == "an earlier launch\n"
    assert sorted(p.name for p in logs.iterdir()) == [
        "worker-launch-0.log",
        "worker-rank-0.log",
        "worker-rank-1.log",
        "workers.log",
    ]


def test_a_failure_names_the_rank_and_the_launch_order(tmp_path: Path) -> None:
    specs = [
        ProcessSpec(
            "worker #0", _announcing(1, "loading", "bad data", exit_code=3), launch_index=0
        ),
        ProcessSpec("worker #1", _python("import time; time.sleep(60)"), launch_index=1),
    ]
    cluster = Cluster(specs, tmp_path, grace=1.0, echo=lambda line: None)
    with pytest.raises(LaunchError) as err, cluster:
        cluster.wait()
    message = str(err.value)
    assert "worker rank 1 (launch #0) exited with code 3" in message, message
    assert f"Last lines of {tmp_path / 'worker-rank-1.log'}" in message and "loading" in message
    assert err.value.exit_code == 3


def test_one_workers_callback_finishes_everyone() -> None:
    """A callback's stop request (rank 0 only, typically) ends every worker at the same
    agreement point, as finished 'callback' (not a preemption); signals still win."""

    def worker(finish: bool, stop: bool = False) -> Any:
        def call(c: distributed.Coordinator) -> Any:
            c.attach(lambda: stop, max_time=None, finish_requested=lambda: finish)
            return c.at_interval(1.0), c.stop_agreed()

        return call

    assert run_workers([worker(True), worker(False)]) == [("callback", False)] * 2
    assert run_workers([worker(False), worker(False)]) == [(None, False)] * 2
    assert run_workers([worker(True), worker(False, stop=True)]) == [(None, True)] * 2
