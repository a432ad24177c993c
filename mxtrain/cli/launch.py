"""``mxtrain launch``: run a distributed (parameter-server) training job."""

from __future__ import annotations

import click

from mxtrain.cli.options import handle_errors, set_option


@click.command(
    "launch",
    epilog="""\b
Examples:
  mxtrain launch -n 2 -s 1 cfg.yaml --set kvstore.type=dist_sync
  mxtrain launch -n 2 -s 1 --resume runs/my_run
  mxtrain launch -n 8 -s 4 --launcher ssh --hosts hosts.txt --env OMP_NUM_THREADS cfg.yaml
  mxtrain launch -n 8 -s 4 --launcher mpi --hosts hostfile cfg.yaml""",
)
@click.argument("target", metavar="CONFIG", type=click.Path(exists=True))
@click.option("-n", "--num-workers", type=int, required=True, help="Number of workers.")
@click.option(
    "-s",
    "--num-servers",
    type=int,
    default=None,
    help="Number of parameter servers (default: as many as workers).",
)
@click.option(
    "--launcher",
    type=click.Choice(["local", "ssh", "mpi"]),
    default="local",
    show_default=True,
    help="local: every process on this machine; ssh: on the hosts of --hosts; mpi: mpirun.",
)
@click.option(
    "--hosts",
    "hosts_file",
    type=click.Path(dir_okay=False),
    help="ssh: one host (or user@host) per line, # comments; mpi: an mpirun hostfile "
    "(HOST [slots=N] per line).",
)
@click.option(
    "--env",
    multiple=True,
    metavar="NAME[=VALUE]",
    help="Environment variable to pass to every process; repeatable.",
)
@set_option
@click.option("--name", default=None, help="Run name (default: experiment.name).")
@click.option("--force", is_flag=True, help="Replace an existing run folder (as fit --force).")
@click.option(
    "--resume",
    is_flag=True,
    help="CONFIG is a run folder: continue it (every worker runs `mxtrain resume`).",
)
@click.option(
    "--grace",
    type=float,
    default=10.0,
    show_default=True,
    help="Seconds between SIGTERM and SIGKILL when the job is stopped (Ctrl-C, SIGTERM); "
    "after a process failed, at most 2.",
)
@click.option(
    "--log-dir",
    default=None,
    help="Per-process log files (default: RUNS_DIR/RUN_NAME.launch/, beside the run folder).",
)
@click.option(
    "--scheduler-host",
    default=None,
    help="ssh/mpi: this machine's address as the hosts reach it (default: guessed).",
)
@click.option(
    "--ssh-option",
    "ssh_options",
    multiple=True,
    metavar="KEY=VALUE",
    help="ssh: an option for every ssh command (as ssh -o), e.g. Port=2222; repeatable.",
)
@handle_errors
def launch_command(
    target: str,
    num_workers: int,
    num_servers: int | None,
    launcher: str,
    hosts_file: str | None,
    env: tuple[str, ...],
    overrides: tuple[str, ...],
    name: str | None,
    force: bool,
    resume: bool,
    grace: float,
    log_dir: str | None,
    scheduler_host: str | None,
    ssh_options: tuple[str, ...],
) -> None:
    """Start a scheduler, servers and workers that train CONFIG with a dist_* kvstore.

    Each process's output is shown with its label and kept in its own log file; workers are
    named by ps-lite rank ([worker 1] ..., worker-rank-1.log) once they know it, and by
    launch order before ([worker #0] ...). If any process fails, the others are stopped and
    the exit code is the failed worker's (71 if it was killed, or a server or the scheduler
    failed). Only rank 0 writes the run folder.
    """
    # deferred: import cost (`mxtrain --help` imports every command)
    from mxtrain.launch import LaunchRequest, launch
    from mxtrain.run.folder import check_name_option

    check_name_option(name)
    request = LaunchRequest(
        target=target,
        num_workers=num_workers,
        num_servers=num_servers if num_servers is not None else num_workers,
        launcher=launcher,
        hosts_file=hosts_file,
        env=env,
        overrides=overrides,
        name=name,
        force=force,
        resume=resume,
        grace=grace,
        log_dir=log_dir,
        scheduler_host=scheduler_host,
        ssh_options=ssh_options,
    )
    result = launch(request, echo=click.echo)
    click.echo(f"launch: all workers finished; logs in {result.log_dir}")
