"""`mxtrain launch` through real OpenMPI and a real sshd, everything on 127.0.0.1.

The MPI tests need OpenMPI's ``mpirun`` (Debian: ``apt-get install openmpi-bin``); the ssh
tests need OpenSSH's ``sshd``, ``ssh`` and ``ssh-keygen`` (``apt-get install openssh-server
openssh-client``). Each skips, saying which program is missing, where they are not installed.
The sshd is this test's own: a throwaway host key and client key, a free loopback port, stopped
by its PID afterwards. Every launch runs under a timeout and every process it started is checked
to be gone.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from float_bounds import assert_params_close, mlp_chain_roundings
from launch_helpers import (
    LONG_GRACE,
    alive,
    descendants_of,
    end_all,
    job_processes,
    load_params,
    mxtrain,
    ndarray_train,
    process_env,
    start_launch,
    wait_for_log,
    wait_until_gone,
    write_config,
)

from mxtrain.launch import free_port

MPIRUN = shutil.which("mpirun")
needs_mpi = pytest.mark.skipif(
    MPIRUN is None,
    reason="OpenMPI's mpirun is not installed (Debian/Ubuntu: apt-get install openmpi-bin)",
)

# every process a test starts is killed afterwards, even when an assertion failed
pytestmark = pytest.mark.usefixtures("reaper")


def _sshd_path() -> str | None:
    return shutil.which("sshd") or next(
        (p for p in ("/usr/sbin/sshd", "/usr/local/sbin/sshd") if os.access(p, os.X_OK)), None
    )


SSH_TOOLS = {
    "sshd": _sshd_path(),
    "ssh": shutil.which("ssh"),
    "ssh-keygen": shutil.which("ssh-keygen"),
}
needs_ssh = pytest.mark.skipif(
    None in SSH_TOOLS.values(),
    reason=f"OpenSSH's {', '.join(k for k, v in SSH_TOOLS.items() if v is None)} not installed "
    "(Debian/Ubuntu: apt-get install openssh-server openssh-client)",
)

# mpirun on loopback only; as root (a container, CI) it refuses to start without these
MPI_ENV = {
    "OMPI_MCA_oob_tcp_if_include": "lo",
    "OMPI_MCA_btl_tcp_if_include": "lo",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",  # more processes than cores
}
if os.geteuid() == 0:
    MPI_ENV.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
MPI_ARGS = ("--launcher", "mpi", "--scheduler-host", "127.0.0.1")


def assert_same_params(got_path: Path, want_path: Path) -> None:
    """Two workers of 8 rows against one process of 16 for an epoch (96 / 16 = 6 steps): the
    server sums the halves' gradients, another order than one 16-row sum, at every step."""
    assert_params_close(load_params(got_path), load_params(want_path),
                        roundings=6 * mlp_chain_roundings(6, [8], 3, 16))  # fmt: skip


def one_process_reference(blobs: Path) -> Path:
    """One process training on the combined batch (2 workers x 8 rows): its first epoch."""
    single = write_config(blobs, "single.yaml", ndarray_train(blobs, 16), epochs=1)
    done = mxtrain("fit", single, "--name", "single", "--set", "kvstore.type=local")
    assert done.returncode == 0, done.stderr
    return blobs / "runs" / "single" / "model-0001.params"


def is_worker(pid: int) -> bool:
    """A worker's own process: not mpirun, not the ssh relay around it."""
    command = Path(f"/proc/{pid}/cmdline").read_bytes()
    return (
        process_env(pid).get("DMLC_ROLE") == "worker"
        and b"\0fit\0" in command
        and b"mxtrain.launch" not in command
    )


def kill_a_worker_and_wait(
    launcher: subprocess.Popen, blobs: Path, log_name: str, expect_loopback: bool = True
) -> tuple[str, float, list[int]]:
    """Once training runs, SIGKILL one worker; the launcher's stderr, the seconds it took to
    end, and every process of the job seen before the kill."""
    wait_for_log(launcher, blobs / "runs" / "dist.launch" / log_name, "epoch 2")
    scheduler = next(
        p for p in descendants_of(launcher.pid) if process_env(p).get("DMLC_ROLE") == "scheduler"
    )
    started = sorted(set(descendants_of(launcher.pid)) | set(job_processes(
        process_env(scheduler)["DMLC_PS_ROOT_PORT"])))  # fmt: skip
    workers = [p for p in started if is_worker(p)]
    assert len(workers) == 2, workers
    if expect_loopback:  # ps-lite advertises 127.0.0.1: no traffic leaves the loopback
        assert {process_env(p).get("DMLC_NODE_HOST") for p in workers} == {"127.0.0.1"}
    killed_at = time.monotonic()
    os.kill(workers[1], signal.SIGKILL)
    _, err = launcher.communicate(timeout=2 * LONG_GRACE)
    return err, time.monotonic() - killed_at, started


def long_job_with_a_killed_worker(
    blobs: Path, launch_args: list[object], log_name: str, extra_env: dict[str, str] | None = None
) -> tuple[int, str, float, list[int]]:
    """A 2-worker job that would train for ever, one worker SIGKILLed once it trains: the
    launcher's exit code and stderr, the seconds it took to end, the job's processes. The
    job runs with --grace LONG_GRACE: ending sooner shows it did not wait out --grace."""
    config = write_config(blobs, "long.yaml", ndarray_train(blobs, 4), epochs=100000)
    launcher = start_launch("-n", 2, "-s", 1, config, *launch_args, "--grace", LONG_GRACE,
                            extra_env=extra_env)  # fmt: skip
    started: list[int] = []
    try:
        err, elapsed, started = kill_a_worker_and_wait(launcher, blobs, log_name)
        # an ssh relay that lost its connection stops its command on its own --grace
        wait_until_gone(started, LONG_GRACE + 10)
    finally:
        end_all(launcher, started)
    return launcher.returncode, err, elapsed, started


# --- MPI -------------------------------------------------------------------------------------


@needs_mpi
def test_mpi_dist_sync_equals_one_process_with_the_combined_batch(blobs: Path) -> None:
    config = write_config(blobs, "dist.yaml", ndarray_train(blobs, 8), epochs=1)
    done = mxtrain("launch", "-n", 2, "-s", 1, config, *MPI_ARGS, extra_env=MPI_ENV)
    assert done.returncode == 0, done.stdout + done.stderr
    assert_same_params(blobs / "runs" / "dist" / "model-0001.params", one_process_reference(blobs))
    logs = blobs / "runs" / "dist.launch"
    assert sorted(p.name for p in logs.iterdir()) == ["scheduler.log", "servers.log", "workers.log"]
    announced = re.findall(
        r"mxtrain: worker rank (\d) of 2 \(MPI rank (\d)\)", (logs / "workers.log").read_text()
    )
    assert sorted(announced) in ([("0", "0"), ("1", "1")], [("0", "1"), ("1", "0")])


@needs_mpi
def test_mpi_a_killed_worker_stops_the_job_and_is_named(blobs: Path) -> None:
    code, err, elapsed, started = long_job_with_a_killed_worker(
        blobs, [*MPI_ARGS], "workers.log", MPI_ENV
    )
    assert code == 71, err
    assert elapsed < LONG_GRACE, elapsed  # a dead peer ends the job without waiting out --grace
    assert re.search(
        r"worker rank \d \(MPI rank \d\) on node \S+ was killed by SIGKILL \(mpirun's report\)", err
    ), err
    assert "Last lines of" in err and "workers.log" in err
    assert not [p for p in started if alive(p)], "orphans left behind"


@needs_mpi
def test_killing_the_mpi_launcher_leaves_no_process(blobs: Path) -> None:
    """mpirun's processes are not the launcher's children: each ends with its mpirun, which
    ends with the launcher, also when the launcher is SIGKILLed."""
    config = write_config(blobs, "long.yaml", ndarray_train(blobs, 4), epochs=100000)
    launcher = start_launch("-n", 2, "-s", 1, config, *MPI_ARGS, extra_env=MPI_ENV)
    started: list[int] = []
    try:
        wait_for_log(launcher, blobs / "runs" / "dist.launch" / "workers.log", "epoch 2")
        started = descendants_of(launcher.pid)
        assert sum(map(is_worker, started)) == 2
        launcher.kill()
        launcher.communicate(timeout=10)
        wait_until_gone(started, 10)
    finally:
        end_all(launcher, started)
    assert not [p for p in started if alive(p)], "processes outlived the launcher"


@needs_mpi
def test_mpi_refuses_a_hostfile_of_other_hosts_with_a_loopback_scheduler(blobs: Path) -> None:
    config = write_config(blobs, "dist.yaml", ndarray_train(blobs, 8), epochs=1)
    hostfile = blobs / "hostfile"
    hostfile.write_text("# two machines\nnode-a slots=2\nlocalhost slots=1\n")
    done = mxtrain("launch", "-n", 2, "-s", 1, config, *MPI_ARGS, "--hosts", hostfile)
    assert done.returncode == 2, done.stderr
    assert f"--hosts {hostfile} names node-a" in done.stderr and "Traceback" not in done.stderr
    assert not (blobs / "runs").exists()


# --- ssh against a real sshd -----------------------------------------------------------------


SSHD_CONFIG = """\
Port {port}
ListenAddress 127.0.0.1
HostKey {dir}/host_key
PidFile {dir}/sshd.pid
AuthorizedKeysFile {dir}/authorized_keys
StrictModes no
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin prohibit-password
AllowTcpForwarding no
X11Forwarding no
PrintMotd no
LogLevel ERROR
"""


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[list[str]]:
    """A private sshd on a free loopback port; yields the launch options that reach it."""
    folder = tmp_path / "sshd"
    folder.mkdir()
    keygen = SSH_TOOLS["ssh-keygen"]
    assert keygen is not None
    for key in ("host_key", "client_key"):
        subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-f", str(folder / key)],
                       check=True, timeout=30)  # fmt: skip
    shutil.copy(folder / "client_key.pub", folder / "authorized_keys")
    (folder / "authorized_keys").chmod(0o600)
    if os.geteuid() == 0 and not Path("/run/sshd").is_dir():
        Path("/run/sshd").mkdir(mode=0o755, parents=True)  # sshd's privilege separation folder
    port = free_port()  # on 127.0.0.1
    (folder / "sshd_config").write_text(SSHD_CONFIG.format(port=port, dir=folder))
    server = subprocess.Popen(
        [str(SSH_TOOLS["sshd"]), "-D", "-e", "-f", str(folder / "sshd_config")],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    options = [
        f"Port={port}",
        f"IdentityFile={folder / 'client_key'}",
        "IdentitiesOnly=yes",
        "UserKnownHostsFile=/dev/null",
        "LogLevel=ERROR",
    ]
    ssh = [str(SSH_TOOLS["ssh"]), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no"]
    for option in options:
        ssh += ["-o", option]
    try:
        deadline = time.monotonic() + 20
        while True:  # until sshd accepts our key
            if server.poll() is not None:
                pytest.fail(f"sshd did not start: {server.communicate()[0]}")
            probe = subprocess.run([*ssh, "127.0.0.1", "true"], capture_output=True, text=True,
                                   timeout=20, stdin=subprocess.DEVNULL)  # fmt: skip
            if probe.returncode == 0:
                break
            assert time.monotonic() < deadline, f"cannot log in to the test sshd: {probe.stderr}"
            time.sleep(0.2)
        yield [arg for option in options for arg in ("--ssh-option", option)]
    finally:
        server.terminate()  # by its PID; its sessions end with it
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def ssh_launch_args(blobs: Path, options: list[str]) -> list[object]:
    hosts = blobs / "hosts.txt"
    hosts.write_text("127.0.0.1\n")
    return ["--launcher", "ssh", "--hosts", hosts, "--scheduler-host", "127.0.0.1",
            "--env", "OMP_NUM_THREADS=1", *options]  # fmt: skip


@needs_ssh
def test_ssh_through_a_real_sshd_equals_one_process_with_the_combined_batch(
    blobs: Path, sshd: list[str]
) -> None:
    config = write_config(blobs, "dist.yaml", ndarray_train(blobs, 8), epochs=1)
    done = mxtrain("launch", "-n", 2, "-s", 1, config, *ssh_launch_args(blobs, sshd))
    assert done.returncode == 0, done.stdout + done.stderr
    assert_same_params(blobs / "runs" / "dist" / "model-0001.params", one_process_reference(blobs))
    assert "[worker 0]" in done.stdout and "[worker 1]" in done.stdout


@needs_ssh
def test_ssh_a_killed_worker_stops_the_job_and_nothing_stays_on_the_host(
    blobs: Path, sshd: list[str]
) -> None:
    code, err, elapsed, started = long_job_with_a_killed_worker(
        blobs, ssh_launch_args(blobs, sshd), "worker-rank-1.log"
    )
    assert elapsed < LONG_GRACE, elapsed  # a dead peer ends the job without waiting out --grace
    # the relay turns the remote worker's SIGKILL into exit code 137, which ssh passes on
    assert code == 71, err
    assert re.search(r"worker rank \d \(launch #\d\) was killed by SIGKILL on its host", err), err
    assert not [p for p in started if alive(p)], "processes left on the host"


@needs_ssh
def test_ssh_killing_the_launcher_stops_the_processes_sshd_started(
    blobs: Path, sshd: list[str]
) -> None:
    config = write_config(blobs, "long.yaml", ndarray_train(blobs, 4), epochs=100000)
    launcher = start_launch("-n", 2, "-s", 1, config, *ssh_launch_args(blobs, sshd))
    started: list[int] = []
    try:
        wait_for_log(launcher, blobs / "runs" / "dist.launch" / "worker-rank-1.log", "epoch 2")
        scheduler = next(p for p in descendants_of(launcher.pid)
                         if process_env(p).get("DMLC_ROLE") == "scheduler")  # fmt: skip
        started = job_processes(process_env(scheduler)["DMLC_PS_ROOT_PORT"])
        remote = [p for p in started if p not in descendants_of(launcher.pid)]
        assert len(remote) >= 3, started  # a server and two workers, started by sshd
        launcher.kill()  # SIGKILL: the launcher gets no chance to clean up
        launcher.communicate(timeout=10)
        wait_until_gone(started, 30)
    finally:
        end_all(launcher, started)
    assert not [p for p in started if alive(p)], "processes outlived the launcher"
