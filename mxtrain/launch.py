"""``mxtrain launch``: start a parameter-server job (scheduler, servers, workers) and watch it.

MXNet's distributed kvstores (``dist_sync``, ``dist_device_sync``, ``dist_async``) run on
ps-lite: one scheduler, S servers and W workers that find each other through ``DMLC_*``
environment variables. A server or the scheduler is just ``python -c "import mxtrain, mxnet"``
with ``DMLC_ROLE`` set (mxtrain first, for its lighter MXNet import); a worker is
``python -m mxtrain fit CONFIG`` (or ``resume RUN``).

Launchers:

* ``local``: every process on this machine, on 127.0.0.1, each in its own process group and
  (on Linux) killed by the kernel if the launcher dies (``PR_SET_PDEATHSIG``);
* ``ssh``: the scheduler here, servers and workers on the hosts of a hosts file, round robin,
  each through ``ssh HOST 'cd DIR && env K=V ... python -m mxtrain ...'``;
* ``mpi``: the scheduler here, servers and workers through two ``mpirun`` commands that
  forward the environment with ``-x NAME=VALUE``.

Whatever the launcher, the processes started here are monitored the same way: each line a
process prints is shown with its label (``[worker 1] ...``) and written to its own log file
in the log folder; when one exits non-zero (or is killed) the others are stopped (SIGTERM to
the process group, SIGKILL after a grace period) and ``LaunchError`` names it, its exit code
or signal and the end of its log. SIGINT/SIGTERM to the launcher stop the whole job the same
way. ssh commands run under ``relay_remote`` (see there) so that signals reach them and a
dead launcher leaves nothing running remotely. All three launchers are tested end to end on
127.0.0.1: ssh against a real sshd started by the test, mpi with OpenMPI's mpirun (those
tests skip, saying why, where the tools are not installed).

Workers are named by their ps-lite rank, which the scheduler assigns only as they register
(launch order says nothing about it). Until a worker knows its rank it is ``worker #N``
(launch order) writing ``worker-launch-N.log``; a worker prints ``mxtrain: worker rank R of
W`` (see ``announce_rank``) once its kvstore exists, and from that line on the launcher shows
it as ``worker R`` and keeps its whole log, earlier lines included, in ``worker-rank-R.log``.
The mpi launcher runs all workers under one ``mpirun`` with one output stream: that stream
stays ``workers`` (``workers.log``); the rank lines in it also give each worker's MPI rank,
so that when mpirun reports "process rank 1 ... exited on signal 9" the error names the
worker by its ps-lite rank.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import ipaddress
import logging
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from mxtrain.config import load_config
from mxtrain.errors import ConfigError, ExitCode, MxtrainError, RunFolderError
from mxtrain.run.layout import CONFIG_FILE
from mxtrain.user_files import UnusableFile, read_regular

log = logging.getLogger("mxtrain")

LOCALHOST = "127.0.0.1"
LAUNCHERS = ("local", "ssh", "mpi")
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_TAIL_LINES = 20
# Seconds between SIGTERM and SIGKILL once a process of the job has failed. A broken job
# cannot save a checkpoint (dist_sync peers wait for the dead one inside ps-lite, where no
# signal handler runs), so waiting the whole --grace would only delay the end.
FAILURE_GRACE = 2.0
# Seconds a relayed command has, after SIGKILL was written to its relay, before its ssh
# client is killed (which would leave the relay to stop the command on its own grace).
_RELAY_KILL_WAIT = 1.0


class LaunchError(MxtrainError):
    """A process of the job failed; the whole job was stopped."""

    # a killed process, or a failed server/scheduler; a worker's own exit code replaces it
    exit_code: int = ExitCode.PEER_LOST


@dataclass
class ProcessSpec:
    """One command to start here, with its label (``server 0``) and extra environment.

    ``launch_index`` is set for a process that is exactly one worker: it is relabelled by
    rank once it announces its rank (see ``announce_rank``).
    """

    label: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    # ssh: the remote side runs under ``relay_remote``, which takes signal names on stdin
    relay_signals: bool = False
    launch_index: int | None = None

    @property
    def log_name(self) -> str:
        if self.launch_index is not None:
            return f"worker-launch-{self.launch_index}.log"
        return self.label.replace(" ", "-") + ".log"


def worker_label(launch_index: int) -> str:
    """A worker's label until its rank is known: its launch order, marked by ``#``."""
    return f"worker #{launch_index}"


_RANK_LINE = re.compile(r"mxtrain: worker rank (\d+) of (\d+)(?: \(MPI rank (\d+)\))?")
# what mpirun (OpenMPI) prints when one of its processes dies or fails
_MPI_SIGNALLED = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)")
_MPI_PROCESS_NAME = re.compile(r"Process name:\s*\[\[\d+,\d+\],(\d+)\]")
_MPI_EXIT_CODE = re.compile(r"Exit code:\s*(\d+)")
# the variables MPI implementations set to a process's rank (OpenMPI, then MPICH/Hydra)
_MPI_RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK")


def rank_line(rank: int, num_workers: int, mpi_rank: int | None = None) -> str:
    """The line a distributed worker prints so that ``mxtrain launch`` learns its rank (and,
    under mpirun, which MPI rank that is: mpirun reports failures by MPI rank)."""
    line = f"mxtrain: worker rank {rank} of {num_workers}"
    return line if mpi_rank is None else f"{line} (MPI rank {mpi_rank})"


def mpi_rank_from_env(env: Mapping[str, str] | None = None) -> int | None:
    """This process's MPI rank when mpirun started it, else None."""
    env = os.environ if env is None else env
    for name in _MPI_RANK_VARIABLES:
        value = env.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def announce_rank(rank: int, num_workers: int) -> None:
    """Write ``rank_line`` on stderr (stdout may carry only ``--json`` events) in one system
    call: under mpirun several workers share one stream, and ``print`` writes the line and
    its newline separately, so two workers' lines could run together."""
    sys.stderr.flush()
    line = rank_line(rank, num_workers, mpi_rank_from_env()) + "\n"
    os.write(sys.stderr.fileno(), line.encode())


def parse_rank_line(line: str) -> int | None:
    """The rank announced by ``line``, or None when it is not a rank line."""
    match = _RANK_LINE.fullmatch(line.strip())
    return int(match.group(1)) if match else None


def parse_mpi_rank_lines(line: str) -> list[tuple[int, int]]:
    """Every (ps-lite rank, MPI rank) announced in ``line`` of an mpirun stream, where
    several workers' output shares one stream and lines may have run together."""
    return [
        (int(m.group(1)), int(m.group(3)))
        for m in _RANK_LINE.finditer(line)
        if m.group(3) is not None
    ]


@dataclass
class MpiReport:
    """What mpirun said about the process that failed."""

    text: str  # e.g. "worker rank 0 (MPI rank 1) on node n1 was killed by SIGKILL"
    signalled: bool  # killed by a signal (not an exit code of its own)


def describe_mpi_failure(lines: Sequence[str], ranks: Mapping[int, int]) -> MpiReport | None:
    """Which worker mpirun says failed and how, from its report in ``lines``; ``ranks`` maps
    MPI ranks to ps-lite ranks (from the workers' rank lines). None when there is no report."""
    text = "\n".join(lines)

    def who(mpi_rank: int) -> str:
        rank = ranks.get(mpi_rank)
        if rank is None:
            return f"the worker of MPI rank {mpi_rank} (its ps-lite rank was not known yet)"
        return f"worker rank {rank} (MPI rank {mpi_rank})"

    signalled = _MPI_SIGNALLED.search(text)
    if signalled:
        mpi_rank, node, signum = int(signalled[1]), signalled[2], int(signalled[3])
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        return MpiReport(f"{who(mpi_rank)} on node {node} was killed by {name}", True)
    named, code = _MPI_PROCESS_NAME.search(text), _MPI_EXIT_CODE.search(text)
    if named and code:
        return MpiReport(f"{who(int(named[1]))} exited with code {code[1]}", False)
    return None


@dataclass
class JobSpec:
    """What to launch: numbers of workers and servers and the worker's mxtrain arguments."""

    num_workers: int
    num_servers: int
    worker_args: list[str]  # after ``python -m mxtrain``: e.g. ["fit", "cfg.yaml", "--set", ...]
    python: str = sys.executable
    forward_env: dict[str, str] = field(default_factory=dict)  # --env NAME[=VALUE]
    workdir: str = field(default_factory=os.getcwd)
    grace: float = 10.0  # ssh: seconds the remote relay waits between SIGTERM and SIGKILL


def free_port(host: str = LOCALHOST) -> int:
    """A TCP port nobody listens on right now (the scheduler binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def role_env(
    role: str, job: JobSpec, root_uri: str, root_port: int, node_host: str
) -> dict[str, str]:
    """Every ``DMLC_*`` variable one process needs, plus the forwarded ones."""
    env = dict(job.forward_env)
    env.update(
        DMLC_ROLE=role,
        DMLC_PS_ROOT_URI=root_uri,
        DMLC_PS_ROOT_PORT=str(root_port),
        DMLC_NUM_WORKER=str(job.num_workers),
        DMLC_NUM_SERVER=str(job.num_servers),
        DMLC_NODE_HOST=node_host,
    )
    return env


def _server_argv(python: str) -> list[str]:
    # importing mxnet with DMLC_ROLE=server/scheduler runs that role until the job ends;
    # mxtrain first, so that MXNet's import leaves out what a server never uses
    return [python, "-c", "import mxtrain, mxnet"]


def _worker_argv(job: JobSpec) -> list[str]:
    args = list(job.worker_args)
    if args and args[0] in ("fit", "resume") and "--progress" not in args:
        args += ["--progress", "plain"]  # workers write to pipes: one line per interval
    return [job.python, "-m", "mxtrain", *args]


def local_processes(job: JobSpec, port: int | None = None) -> list[ProcessSpec]:
    """Scheduler, servers and workers on this machine, all on 127.0.0.1."""
    port = port or free_port()

    def spec(label: str, role: str, argv: list[str]) -> ProcessSpec:
        return ProcessSpec(label, argv, role_env(role, job, LOCALHOST, port, LOCALHOST))

    specs = [spec("scheduler", "scheduler", _server_argv(job.python))]
    specs += [
        spec(f"server {i}", "server", _server_argv(job.python)) for i in range(job.num_servers)
    ]
    for i in range(job.num_workers):
        specs.append(spec(worker_label(i), "worker", _worker_argv(job)))
        specs[-1].launch_index = i
    return specs


def read_hosts(path: str | Path) -> list[str]:
    """Host names from a hosts file: one per line, ``#`` comments and blank lines skipped."""
    try:
        text = read_regular(path).decode("utf-8")
    except (UnusableFile, UnicodeDecodeError) as exc:
        problem = exc.problem if isinstance(exc, UnusableFile) else "is not UTF-8 text"
        raise ConfigError(
            f"--hosts {path}: the hosts file {problem}.",
            hint="Give a file with one host name or address per line.",
        ) from None
    hosts = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    hosts = [h for h in hosts if h]
    if not hosts:
        raise ConfigError(
            f"--hosts {path} lists no host.", hint="Write one host name or address per line."
        )
    return hosts


def address_of(host: str) -> str:
    """The host's name or address without ssh's ``user@`` prefix (ps-lite needs the address)."""
    return host.rsplit("@", 1)[-1]


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback interface (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_hosts_reach_scheduler(hosts: Sequence[str], scheduler_host: str, source: str) -> None:
    """A loopback scheduler is reachable from this machine only: refuse other hosts."""
    if not is_loopback(scheduler_host):
        return
    remote = [h for h in hosts if not is_loopback(address_of(h))]
    if remote:
        raise ConfigError(
            f"{source} names {', '.join(remote)}, but the scheduler listens on "
            f"{scheduler_host}, which only this machine can reach.",
            hint="Give --scheduler-host an address those hosts reach, or list only 127.0.0.1 "
            "(or localhost) to run every process here.",
        )


def read_mpi_hostfile(path: str | Path) -> list[str]:
    """The host names of an mpirun hostfile (``HOST [slots=N ...]`` per line)."""
    return [line.split()[0] for line in read_hosts(path)]


def ssh_command(host: str, options: Sequence[str] = ()) -> list[str]:
    """``ssh`` with the options launch always needs, then ``options`` (``-o KEY=VALUE``)."""
    argv = ["ssh", "-o", "StrictHostKeyChecking=no", "-o", "BatchMode=yes"]
    for option in options:
        argv += ["-o", option]
    return [*argv, host]


def check_ssh_options(options: Sequence[str]) -> None:
    """Each ``--ssh-option`` must be ssh's ``KEY=VALUE`` (as after ``ssh -o``)."""
    for option in options:
        key, sep, value = option.partition("=")
        if not sep or not key.isalnum() or not value:
            raise ConfigError(
                f"--ssh-option {option!r} is not an ssh option as KEY=VALUE.",
                hint="For example --ssh-option Port=2222 --ssh-option IdentityFile=~/.ssh/id_job "
                "(see `man ssh_config`).",
            )


def _remote_command(job: JobSpec, env: Mapping[str, str], argv: Sequence[str]) -> str:
    assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    relay = [job.python, "-m", "mxtrain.launch", "--relay", f"{job.grace:g}", "--", *argv]
    command = " ".join(shlex.quote(a) for a in relay)
    return f"cd {shlex.quote(job.workdir)} && exec env {assignments} {command}"


def ssh_processes(
    job: JobSpec,
    hosts: Sequence[str],
    scheduler_host: str,
    port: int,
    ssh_options: Sequence[str] = (),
) -> list[ProcessSpec]:
    """The scheduler here; servers then workers on ``hosts`` round robin, through ssh.

    Every host needs the same working folder, the same Python environment and the data at
    the same paths (a shared file system, typically); ssh must log in without a password.
    """
    local_env = role_env("scheduler", job, scheduler_host, port, scheduler_host)
    specs = [ProcessSpec("scheduler", _server_argv(job.python), local_env)]
    roles = [("server", i, _server_argv(job.python)) for i in range(job.num_servers)]
    roles += [("worker", i, _worker_argv(job)) for i in range(job.num_workers)]
    for n, (role, index, argv) in enumerate(roles):
        host = hosts[n % len(hosts)]
        env = role_env(role, job, scheduler_host, port, address_of(host))
        ssh = ssh_command(host, ssh_options)
        command = _remote_command(job, env, argv)
        is_worker = role == "worker"
        label = worker_label(index) if is_worker else f"{role} {index}"
        specs.append(
            ProcessSpec(
                label,
                [*ssh, command],
                relay_signals=True,
                launch_index=index if is_worker else None,
            )
        )
    return specs


def mpi_processes(
    job: JobSpec, hostfile: str | None, scheduler_host: str, port: int
) -> list[ProcessSpec]:
    """The scheduler here; all servers through one ``mpirun``, all workers through another.

    The ps-lite node address of a process started by mpirun is its host's default address
    (``DMLC_NODE_HOST`` is not set for them), since one command serves several hosts; with a
    loopback scheduler every process runs here and all of them use the scheduler's address,
    so that no ps-lite traffic leaves the loopback interface.
    """
    local_env = role_env("scheduler", job, scheduler_host, port, scheduler_host)
    specs = [ProcessSpec("scheduler", _server_argv(job.python), local_env)]
    for role, count, argv in (
        ("server", job.num_servers, _server_argv(job.python)),
        ("worker", job.num_workers, _worker_argv(job)),
    ):
        env = role_env(role, job, scheduler_host, port, scheduler_host)
        if not is_loopback(scheduler_host):
            env.pop("DMLC_NODE_HOST")
        mpirun = ["mpirun", "-np", str(count)]
        if hostfile:
            mpirun += ["--hostfile", hostfile]
        mpirun += ["-wdir", job.workdir]
        for key, value in env.items():
            mpirun += ["-x", f"{key}={value}"]
        # mpirun's processes are not the launcher's children: each ends with its mpirun (or
        # orted) instead, so that a launcher killed by SIGKILL leaves none behind
        guard = [job.python, "-m", "mxtrain.launch", "--die-with-parent", "--"]
        specs.append(ProcessSpec(f"{role}s", [*mpirun, *guard, *argv]))
    return specs


def default_scheduler_host() -> str:
    """This machine's address as other hosts would reach it (best effort)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect(("10.255.255.255", 1))  # no packet is sent: picks the outgoing interface
            return str(sock.getsockname()[0])
    except OSError:
        return socket.gethostbyname(socket.gethostname())


# --------------------------------------------------------------------------------------------
# running and watching the processes
# --------------------------------------------------------------------------------------------


def _load_prctl() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None  # best effort: process groups still let the launcher stop everything


# Looked up here, in the parent: the child between fork and exec must not load libraries.
_PRCTL = _load_prctl()


def _kill_when_parent_dies() -> None:
    """Ask the kernel for SIGKILL when the parent process dies (Linux; kept across exec)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def _die_with_parent() -> None:
    """In the child, before exec: own process group, and SIGKILL when the launcher dies."""
    os.setpgid(0, 0)
    _kill_when_parent_dies()


class _StartedProcess:
    """A started process of the job: its output pump and the last lines it printed."""

    def __init__(self, spec: ProcessSpec, log_dir: Path, echo: Callable[[str], None]) -> None:
        self.spec = spec
        self.label = spec.label  # a worker's becomes ``worker R`` once its rank is known
        self.rank: int | None = None
        self.log_dir = log_dir
        self.log_path = log_dir / spec.log_name
        self.tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        self.mpi_ranks: dict[int, int] = {}  # an mpirun stream: MPI rank -> ps-lite rank
        env = dict(os.environ)
        env.update(spec.env)
        env.setdefault("PYTHONUNBUFFERED", "1")  # lines reach the log as they are printed
        # Held while the log file is written, moved or closed (pump thread and main thread).
        self._log_lock = threading.Lock()
        self._log_file: IO[str] = open(self.log_path, "a", encoding="utf-8")  # noqa: SIM115
        # What the file held before this launch (a resumed job reuses the log folder): a move
        # to the rank's file takes only what this process wrote and leaves the rest there.
        self._log_start = self._log_file.tell()
        self.process = subprocess.Popen(
            spec.argv,
            env=env,
            stdin=subprocess.PIPE if spec.relay_signals else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,  # only a prepared prctl call runs before exec
            text=True,
            encoding="utf-8",
            errors="replace",
            bufsize=1,
        )
        self._pump = threading.Thread(target=self._copy_output, args=(echo,), daemon=True)
        self._pump.start()

    def _copy_output(self, echo: Callable[[str], None]) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            line = line.rstrip("\r\n")
            if self.rank is None and self.spec.launch_index is not None:
                rank = parse_rank_line(line)
                if rank is not None:
                    self._switch_to_rank(rank)
            elif self.spec.launch_index is None:
                for rank, mpi_rank in parse_mpi_rank_lines(line):
                    self.mpi_ranks[mpi_rank] = rank
            self.tail.append(line)
            with self._log_lock:
                if not self._log_file.closed:
                    self._log_file.write(line + "\n")
                    self._log_file.flush()
            echo(f"[{self.label}] {line}")

    def _switch_to_rank(self, rank: int) -> None:
        """Label the worker by ``rank`` and carry its log so far over to the rank's file."""
        rank_path = self.log_dir / f"worker-rank-{rank}.log"
        with self._log_lock:
            if self._log_file.closed:
                return  # the launcher is finishing: keep the log where it is
            self._log_file.close()
            try:
                with open(self.log_path, encoding="utf-8", errors="replace") as early:
                    early.seek(self._log_start)
                    written_so_far = early.read()
                rank_file: IO[str] = open(rank_path, "a", encoding="utf-8")  # noqa: SIM115
                rank_file.write(written_so_far)
                rank_file.flush()
                # Only now that the lines are safe in the rank's file are they taken out here.
                if self._log_start == 0:
                    self.log_path.unlink()
                else:
                    os.truncate(self.log_path, self._log_start)
                self._log_file, self.log_path, self._log_start = rank_file, rank_path, 0
            except OSError as exc:  # the output must keep flowing: stay in the launch file
                log.warning("%s: cannot move its log to %s (%s)", self.label, rank_path, exc)
                self._log_file = open(self.log_path, "a", encoding="utf-8")  # noqa: SIM115
            self.rank = rank
            self.label = f"worker {rank}"

    @property
    def is_worker(self) -> bool:
        """One worker, or mpirun's stream of all workers (not the scheduler or a server)."""
        return self.spec.label.startswith("worker")

    def describe_name(self) -> str:
        """Who this is in messages: a worker by rank and launch order when its rank is known."""
        index = self.spec.launch_index
        if index is None:
            return self.label
        if self.rank is None:
            return f"worker launch #{index} (its rank was not known yet)"
        return f"worker rank {self.rank} (launch #{index})"

    def finish_output(self, timeout: float = 2.0) -> None:
        self._pump.join(timeout)
        with self._log_lock:
            if not self._log_file.closed:
                self._log_file.close()

    def signal_group(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signum)

    def forward_signal(self, signum: int) -> None:
        """Deliver ``signum`` to the command itself, also when it runs on another host.

        Signalling a local ssh client would only end the connection; a relayed command
        gets the signal's name on its standard input instead (see ``relay_remote``).
        """
        if not self.spec.relay_signals:
            self.signal_group(signum)
            return
        assert self.process.stdin is not None
        with contextlib.suppress(BrokenPipeError, ValueError, OSError):
            self.process.stdin.write(signal.Signals(signum).name + "\n")
            self.process.stdin.flush()

    def killed_by(self) -> str | None:
        """The signal that killed the process (on its host, for a relayed command), if any."""
        code = self.process.returncode
        if code is None or code == 0:
            return None
        if code < 0:
            signum = -code
        elif self.spec.relay_signals and 128 < code < 128 + signal.NSIG:
            signum = code - 128  # the relay exits 128+N when its command died of signal N
        else:
            return None
        try:
            return signal.Signals(signum).name
        except ValueError:
            return f"signal {signum}"

    def describe_exit(self) -> str:
        code = self.process.returncode
        if code is None:
            return "still running"
        killer = self.killed_by()
        if killer is not None:
            where = " on its host" if self.spec.relay_signals else ""
            return f"was killed by {killer}{where}"
        return f"exited with code {code}"


@dataclass
class LaunchResult:
    """How the job ended: exit codes by label, and the log folder."""

    exit_codes: dict[str, int | None]
    log_dir: Path


class Cluster:
    """Starts processes, watches them, and stops all of them when one fails.

    Use as a context manager: leaving the block (normally, by an exception or by a signal)
    always stops and reaps every process started, so none outlives the launcher.
    """

    def __init__(
        self,
        specs: Iterable[ProcessSpec],
        log_dir: Path,
        *,
        grace: float = 10.0,
        echo: Callable[[str], None] | None = None,
        poll: float = 0.1,
        resume_command: str | None = None,
    ) -> None:
        self.specs = list(specs)
        self.resume_command = resume_command  # shown when a signal stopped the job
        self.log_dir = Path(log_dir)
        self.grace = grace
        self.poll = poll
        self._echo_lock = threading.Lock()
        self._echo_target = echo or self._print
        self.running: list[_StartedProcess] = []
        self._signalled: int | None = None

    def _print(self, line: str) -> None:
        print(line, flush=True)

    def _echo(self, line: str) -> None:
        with self._echo_lock:  # one line at a time from several pump threads
            self._echo_target(line)

    def __enter__(self) -> Cluster:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._previous = {
            s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            for spec in self.specs:
                self.running.append(_StartedProcess(spec, self.log_dir, self._echo))
        except BaseException:
            self.stop()
            self._restore_signals()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            self.stop()
        finally:
            self._restore_signals()

    def _restore_signals(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self._signalled is not None:
            raise KeyboardInterrupt  # a second Ctrl-C: stop waiting for a graceful end
        self._signalled = signum

    @property
    def pids(self) -> list[int]:
        return [r.process.pid for r in self.running]

    def _workers(self) -> list[_StartedProcess]:
        return [r for r in self.running if r.is_worker]

    def wait(self) -> LaunchResult:
        """Block until the workers finish; raise LaunchError (after stopping all) on a failure.

        The scheduler and servers end by themselves once every worker has finished; they
        are stopped if they have not a grace period later.
        """
        workers = self._workers() or self.running
        while True:
            if self._signalled is not None:
                self._stop_on_signal()
            failed = next((r for r in self.running if r.process.poll() not in (None, 0)), None)
            if failed is not None:
                self.stop(grace=min(self.grace, FAILURE_GRACE))
                raise self._failure(failed)
            if all(r.process.poll() == 0 for r in workers):
                break
            time.sleep(self.poll)
        deadline = time.monotonic() + self.grace
        while any(r.process.poll() is None for r in self.running):
            if time.monotonic() > deadline:
                log.warning("scheduler/servers still running after the workers ended: stopping")
                break
            time.sleep(self.poll)
        self.stop()
        return LaunchResult({r.label: r.process.returncode for r in self.running}, self.log_dir)

    def _stop_on_signal(self) -> None:
        signum = self._signalled
        assert signum is not None
        name = signal.Signals(signum).name
        log.warning("%s: stopping the job (workers save a checkpoint first)", name)
        # Workers get the signal to checkpoint and stop together; servers wait for them.
        for running in self._workers():
            running.forward_signal(signum)
        self.stop(first_signal=None)
        codes = {r.label: r.process.returncode for r in self.running}
        preempted = all(c == ExitCode.PREEMPTED for k, c in codes.items() if k.startswith("worker"))
        resume = self.resume_command or "mxtrain launch --resume RUN_FOLDER"
        error = LaunchError(
            f"the job was stopped by {name}; exit codes: "
            + ", ".join(f"{k} {v}" for k, v in codes.items())
            + ".",
            hint=f"Logs are in {self.log_dir}."
            + (f" Rank 0 saved a checkpoint; continue with `{resume}`." if preempted else ""),
        )
        error.exit_code = ExitCode.PREEMPTED if preempted else 130
        raise error

    def stop(self, first_signal: int | None = signal.SIGTERM, grace: float | None = None) -> None:
        """Stop every process still running: ``first_signal``, then SIGKILL after ``grace``
        seconds (default: the cluster's). Relayed (ssh) commands get both signals through
        their relay, so that remote processes end on the same schedule as local ones."""
        grace = self.grace if grace is None else grace
        alive = [r for r in self.running if r.process.poll() is None]
        if first_signal is not None:
            for running in alive:
                running.forward_signal(first_signal)
        deadline = time.monotonic() + grace
        for running in alive:
            with contextlib.suppress(subprocess.TimeoutExpired):
                running.process.wait(max(0.0, deadline - time.monotonic()))
        relayed = [r for r in self.running if r.spec.relay_signals and r.process.poll() is None]
        for running in relayed:
            running.forward_signal(signal.SIGKILL)  # the remote command, then ssh ends
        deadline = time.monotonic() + (_RELAY_KILL_WAIT if relayed else 0.0)
        for running in relayed:
            with contextlib.suppress(subprocess.TimeoutExpired):
                running.process.wait(max(0.0, deadline - time.monotonic()))
        for running in self.running:
            if running.process.poll() is None:
                running.signal_group(signal.SIGKILL)
                running.process.wait()
            else:
                running.signal_group(signal.SIGKILL)  # leftovers in its group, if any
        for running in self.running:
            running.finish_output()

    def _failure(self, failed: _StartedProcess) -> LaunchError:
        tail = "\n".join(f"    {line}" for line in failed.tail) or "    (no output)"
        what = f"{failed.describe_name()} {failed.describe_exit()}"
        killed = failed.killed_by() is not None
        hint = f"All logs are in {self.log_dir}."
        if failed.spec.argv[:1] == ["mpirun"]:
            report = describe_mpi_failure(failed.tail, failed.mpi_ranks)
            if report is None:
                what = f"mpirun ({failed.label}) {failed.describe_exit()}"
            else:
                what = f"{report.text} (mpirun's report); mpirun {failed.describe_exit()}"
                killed = killed or report.signalled
            if "allow-run-as-root" in "\n".join(failed.tail):
                hint += (
                    " mpirun refuses to run as root: run as another user, or set "
                    "OMPI_ALLOW_RUN_AS_ROOT=1 and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 if you must."
                )
        error = LaunchError(
            f"{what}; the other processes were stopped. Last lines of {failed.log_path}:\n{tail}\n",
            hint=hint,
        )
        code = failed.process.returncode
        if failed.is_worker and not killed and code is not None and code > 0:
            error.exit_code = code  # a worker's own mxtrain exit code (config, data, ...)
        return error


def run_job(
    specs: Sequence[ProcessSpec],
    log_dir: Path,
    *,
    grace: float = 10.0,
    echo: Callable[[str], None] | None = None,
    resume_command: str | None = None,
) -> LaunchResult:
    """Start ``specs``, stream their output, and return when the workers are done.

    Raises LaunchError naming the first process that failed, after stopping all others;
    ``resume_command`` is what that error suggests after a signal stopped the job.
    """
    log.info("launch: %d processes, logs in %s", len(specs), log_dir)
    with Cluster(specs, log_dir, grace=grace, echo=echo, resume_command=resume_command) as cluster:
        return cluster.wait()


# --------------------------------------------------------------------------------------------
# the command's library call
# --------------------------------------------------------------------------------------------


@dataclass
class LaunchRequest:
    """Everything ``mxtrain launch`` was asked (the click command fills it)."""

    target: str  # CONFIG, or RUN_FOLDER with resume
    num_workers: int
    num_servers: int
    launcher: str = "local"
    hosts_file: str | None = None
    env: Sequence[str] = ()  # NAME or NAME=VALUE
    overrides: Sequence[str] = ()
    name: str | None = None
    force: bool = False
    resume: bool = False
    grace: float = 10.0
    log_dir: str | None = None
    scheduler_host: str | None = None
    ssh_options: Sequence[str] = ()  # KEY=VALUE, each passed as ``ssh -o KEY=VALUE``


def _forwarded_env(items: Sequence[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not name or not name.replace("_", "a").isalnum():
            raise ConfigError(
                f"--env {item!r} is not NAME or NAME=VALUE.",
                hint="For example --env OMP_NUM_THREADS or --env OMP_NUM_THREADS=4.",
            )
        if not sep:
            if name not in os.environ:
                raise ConfigError(
                    f"--env {name}: the variable is not set here, so there is nothing to forward.",
                    hint=f"Export it first, or give a value: --env {name}=VALUE.",
                )
            value = os.environ[name]
        env[name] = value
    return env


def _plan_job(request: LaunchRequest) -> tuple[JobSpec, Path, Path]:
    """The workers' command line, the run folder and the log folder, after checking what can
    be checked here."""
    if request.num_workers < 1 or request.num_servers < 1:
        raise ConfigError(
            "launch needs at least one worker (-n) and one server (-s).",
            hint="For example: mxtrain launch -n 2 -s 1 CONFIG.",
        )
    if request.resume:
        run = Path(request.target)
        if not (run / CONFIG_FILE).is_file():
            raise ConfigError(
                f"--resume {run}: not a run folder (it has no config.yaml).",
                hint="Give the folder a previous `mxtrain launch` or `mxtrain fit` created.",
            )
        config = load_config(run / CONFIG_FILE, request.overrides, base_dir=run.parent)
        run_dir = run
        args = ["resume", str(run)]
    else:
        config = load_config(request.target, request.overrides)
        run_dir = Path(config.experiment.runs_dir) / (request.name or config.experiment.name)
        if run_dir.exists() and not request.force:
            raise RunFolderError(
                f"the run folder {run_dir} already exists; mxtrain never overwrites a run.",
                hint="Pass --name NEW_NAME to start a separate run, or --force to replace it.",
            )
        args = ["fit", request.target]
        if request.name:
            args += ["--name", request.name]
    for override in request.overrides:
        args += ["--set", override]
    if request.force:
        args.append("--force")
    kv_type = config.kvstore.type
    if not kv_type.startswith("dist"):
        raise ConfigError(
            f"kvstore.type is {kv_type!r}, but workers started by launch must share a "
            "distributed kvstore.",
            hint="Set kvstore.type to dist_sync (or dist_device_sync, dist_async), e.g. "
            "--set kvstore.type=dist_sync.",
        )
    job = JobSpec(
        request.num_workers,
        request.num_servers,
        args,
        forward_env=_forwarded_env(request.env),
        grace=request.grace,
    )
    log_dir = (
        Path(request.log_dir) if request.log_dir else run_dir.parent / (run_dir.name + ".launch")
    )
    return job, run_dir, log_dir


def _resume_command(request: LaunchRequest, run_dir: Path) -> str:
    """The ``mxtrain launch --resume`` line that continues this job with the same cluster."""
    words = ["mxtrain", "launch", "-n", str(request.num_workers), "-s", str(request.num_servers)]
    if request.launcher != "local":
        words += ["--launcher", request.launcher]
        if request.hosts_file:
            words += ["--hosts", request.hosts_file]
        if request.scheduler_host:
            words += ["--scheduler-host", request.scheduler_host]
        for option in request.ssh_options:
            words += ["--ssh-option", option]
    for item in request.env:
        words += ["--env", item]
    words += ["--resume", str(run_dir)]
    return " ".join(shlex.quote(w) for w in words)


def build_processes(request: LaunchRequest, job: JobSpec) -> list[ProcessSpec]:
    """The commands of the request's launcher."""
    if request.launcher == "local":
        if request.hosts_file:
            log.warning("--hosts is ignored by the local launcher")
        return local_processes(job)
    if request.ssh_options and request.launcher != "ssh":
        log.warning("--ssh-option is used only by the ssh launcher")
    scheduler_host = request.scheduler_host or default_scheduler_host()
    if request.launcher in ("ssh", "mpi"):
        program = "ssh" if request.launcher == "ssh" else "mpirun"
        if shutil.which(program) is None:
            package = "openssh-client" if program == "ssh" else "openmpi-bin"
            raise ConfigError(
                f"--launcher {request.launcher}: {program} is not on PATH.",
                hint=f"Install it (Debian/Ubuntu: apt-get install {package}) or put it on PATH, "
                "or use --launcher local to run every process on this machine.",
            )
    # with a loopback scheduler nothing listens beyond this machine
    port = free_port(LOCALHOST if is_loopback(scheduler_host) else "0.0.0.0")
    if request.launcher == "ssh":
        if not request.hosts_file:
            raise ConfigError(
                "--launcher ssh needs --hosts FILE (one host per line).",
                hint="Or use --launcher local to run every process on this machine.",
            )
        check_ssh_options(request.ssh_options)
        hosts = read_hosts(request.hosts_file)
        check_hosts_reach_scheduler(hosts, scheduler_host, f"--hosts {request.hosts_file}")
        return ssh_processes(job, hosts, scheduler_host, port, request.ssh_options)
    if request.launcher == "mpi":
        if request.hosts_file:
            hosts = read_mpi_hostfile(request.hosts_file)
            check_hosts_reach_scheduler(hosts, scheduler_host, f"--hosts {request.hosts_file}")
        return mpi_processes(job, request.hosts_file, scheduler_host, port)
    raise ConfigError(
        f"--launcher {request.launcher!r} is not one of {', '.join(LAUNCHERS)}.",
        hint="Use local, ssh or mpi.",
    )


def launch(request: LaunchRequest, echo: Callable[[str], None] | None = None) -> LaunchResult:
    """Run a distributed training job as ``request`` says; see the module docstring."""
    job, run_dir, log_dir = _plan_job(request)
    specs = build_processes(request, job)
    return run_job(
        specs,
        log_dir,
        grace=request.grace,
        echo=echo,
        resume_command=_resume_command(request, run_dir),
    )


# --------------------------------------------------------------------------------------------
# the remote end of an ssh launch
# --------------------------------------------------------------------------------------------

_RELAYED = {"SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM, "SIGKILL": signal.SIGKILL}


def relay_remote(argv: Sequence[str], *, grace: float = 10.0) -> int:
    """Run ``argv`` on a remote host for ``mxtrain launch --launcher ssh``; its exit code.

    Killing a local ssh client does not stop its remote command (without a terminal sshd
    sends no signal; with ``ssh -tt`` it sends SIGHUP, which kills a worker before it can
    save a checkpoint). So the launcher keeps ssh's standard input open and this relay
    reads it: a line ``SIGTERM`` or ``SIGINT`` is passed to the command (a graceful stop),
    ``SIGKILL`` ends it at once (the launcher's grace is over);
    end of input means the launcher or the connection is gone, and the command is stopped
    (SIGTERM, then SIGKILL after ``grace``) so that nothing is left running on the host.
    """
    child = subprocess.Popen(list(argv), process_group=0)  # its own group: stopped as one

    def signal_child(signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signum)

    def read_requests() -> None:
        for line in sys.stdin:
            signum = _RELAYED.get(line.strip())
            if signum is not None:
                signal_child(signum)
        if child.poll() is None:  # end of input: nobody is left to stop the command
            signal_child(signal.SIGTERM)
            try:
                child.wait(grace)
            except subprocess.TimeoutExpired:
                signal_child(signal.SIGKILL)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda n, _frame: signal_child(n))
    threading.Thread(target=read_requests, name="mxtrain-relay", daemon=True).start()
    code = child.wait()
    signal_child(signal.SIGKILL)  # leftovers of the command's process group, if any
    return code if code >= 0 else 128 - code


def exec_dying_with_parent(argv: Sequence[str]) -> None:
    """Replace this process by ``argv``, which the kernel kills (SIGKILL) when this process's
    parent dies: mpirun's processes use it, since the launcher's own guard (process groups,
    ``PR_SET_PDEATHSIG``) reaches only its direct children."""
    parent = os.getppid()
    _kill_when_parent_dies()
    if os.getppid() != parent:
        sys.exit(1)  # the parent died before the guard was set
    os.execvp(argv[0], list(argv))


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "--die-with-parent" and sys.argv[2] == "--":
        exec_dying_with_parent(sys.argv[3:])
    if len(sys.argv) < 5 or sys.argv[1] != "--relay" or sys.argv[3] != "--":
        sys.exit(
            "usage: python -m mxtrain.launch --relay GRACE_SECONDS -- COMMAND [ARG...]\n"
            "       python -m mxtrain.launch --die-with-parent -- COMMAND [ARG...]"
        )
    sys.exit(relay_remote(sys.argv[4:], grace=float(sys.argv[2])))
