"""An 8-worker, 4-server `mxtrain launch` soak on 127.0.0.1: three jobs in a row, each equal to
one process with the combined batch, and nothing (process, listening port, file) left behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from float_bounds import assert_params_close, mlp_chain_roundings
from launch_helpers import (
    load_params,
    make_blobs,
    mxtrain,
    ndarray_train,
    processes_whose_env,
    write_config,
)

# every process a test starts is killed afterwards, even when an assertion failed
pytestmark = pytest.mark.usefixtures("reaper")

WORKERS, SERVERS, BATCH = 8, 4, 4
# The servers sum 8 workers' 4-row gradients (in the order they arrive) where one process sums
# 32 rows: another order at each of 2 epochs x 96 / 32 steps (see float_bounds).
ROUNDINGS = 2 * (96 // (WORKERS * BATCH)) * mlp_chain_roundings(6, [8], 3, WORKERS * BATCH)


def listening_ports() -> dict[int, int]:
    """TCP ports something on this machine listens on (IPv4 and IPv6), with their socket's
    inode."""
    ports = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "0A":  # LISTEN
                ports[int(fields[1].rsplit(":", 1)[1], 16)] = int(fields[9])
    return ports


def socket_inodes(pids: set[int]) -> set[int]:
    """The inodes of the sockets ``pids`` hold open."""
    inodes = set()
    for pid in pids:
        try:
            links = [os.readlink(f) for f in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:
            continue
        inodes |= {int(link[8:-1]) for link in links if link.startswith("socket:[")}
    return inodes


def job_processes(job_tmp: Path) -> set[int]:
    """Live processes of the jobs this test launched (their TMPDIR is its folder): another
    suite's jobs running beside this one on the same machine are not this test's leftovers."""
    mark = f"TMPDIR={job_tmp}".encode()
    return set(processes_whose_env(lambda env: mark in env))


def shared_memory_files() -> set[str]:
    """What is in /dev/shm (ps-lite or MXNet leftovers would be)."""
    shm = Path("/dev/shm")
    return {p.name for p in shm.iterdir()} if shm.is_dir() else set()


@pytest.mark.slow
def test_eight_workers_four_servers_three_times_in_a_row(tmp_path: Path) -> None:
    blobs = make_blobs(tmp_path)
    single = write_config(blobs, "single.yaml", ndarray_train(blobs, WORKERS * BATCH), epochs=2)
    done = mxtrain("fit", single, "--name", "single", "--set", "kvstore.type=local")
    assert done.returncode == 0, done.stderr
    reference = load_params(blobs / "runs" / "single" / "model-0002.params")
    config = write_config(blobs, "dist.yaml", ndarray_train(blobs, BATCH), epochs=2)
    # the job's temporary files go to a folder of its own, which must be empty after each run
    job_tmp = tmp_path / "job-tmp"
    job_tmp.mkdir()
    before_ports, before_shm = set(listening_ports()), shared_memory_files()
    for attempt in range(3):
        name = f"soak{attempt}"
        done = mxtrain("launch", "-n", WORKERS, "-s", SERVERS, config, "--name", name,
                       "--grace", 3, timeout=240, extra_env={"TMPDIR": str(job_tmp)})  # fmt: skip
        assert done.returncode == 0, f"run {attempt}: {done.stdout[-3000:]}{done.stderr}"
        got = load_params(blobs / "runs" / name / "model-0002.params")
        assert_params_close(got, reference, roundings=ROUNDINGS, context=f"run {attempt}:")
        logs = blobs / "runs" / f"{name}.launch"
        assert len(list(logs.glob("worker-rank-*.log"))) == WORKERS
        assert len(list(logs.glob("server-*.log"))) == SERVERS
        # nothing of the job is left: processes, listening ports, temporary or shared-memory files
        assert not job_processes(job_tmp), f"run {attempt} left processes"
        # new listening ports, less those of processes that are not this test's (a suite
        # running beside it): the job's own would be held by processes it left
        others = set(processes_whose_env(lambda env: True)) - job_processes(job_tmp)
        theirs = socket_inodes(others)
        left = {p for p, inode in listening_ports().items() if inode not in theirs}
        assert left <= before_ports, f"run {attempt} left a listening port"
        assert not list(job_tmp.iterdir()), f"run {attempt} left {list(job_tmp.iterdir())}"
        assert shared_memory_files() <= before_shm, f"run {attempt} left files in /dev/shm"
