"""End-to-end distributed training with `mxtrain launch` on 127.0.0.1 (real processes).

Every launch runs under a timeout and every process it started is checked to be gone.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from float_bounds import assert_params_close, mlp_chain_roundings, rnn_chain_roundings
from launch_helpers import (
    LONG_GRACE,
    alive,
    children_of,
    descendants_of,
    end_all,
    load_params,
    mxtrain,
    ndarray_train,
    process_env,
    start_launch,
    wait_for_log,
    wait_until_gone,
    write_config,
)

from mxtrain.run.checkpoint import list_checkpoints
from mxtrain.run.folder import RunFolder

# every process a test starts is killed afterwards, even when an assertion failed
pytestmark = pytest.mark.usefixtures("reaper")


def test_dist_sync_equals_one_process_with_the_combined_batch_and_resumes(blobs: Path) -> None:
    dist_cfg = write_config(blobs, "dist.yaml", ndarray_train(blobs, 8), epochs=1)
    done = mxtrain("launch", "-n", 2, "-s", 1, dist_cfg, "--grace", 3)
    assert done.returncode == 0, done.stdout + done.stderr
    runs = blobs / "runs"
    run = runs / "dist"
    # a distributed resume: every worker reads rank 0's checkpoint, then one more epoch
    resumed = mxtrain(
        "launch", "-n", 2, "-s", 1, "--resume", run, "--set", "fit.num_epoch=2", "--grace", 3
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    # One process, batch 16 = 2 workers x 8: the shards are strided, so each combined batch
    # holds exactly the rows the two workers trained on together.
    single_cfg = write_config(blobs, "single.yaml", ndarray_train(blobs, 16))
    single = mxtrain("fit", single_cfg, "--name", "single", "--set", "kvstore.type=local")
    assert single.returncode == 0, single.stderr
    # The server sums the workers' 8-row gradients where one process sums 16 rows: another
    # order at each of the 96 / 16 = 6 steps an epoch, so a step's chain of roundings times
    # the steps so far (see float_bounds).
    for epoch in (1, 2):
        assert_params_close(
            load_params(run / f"model-000{epoch}.params"),
            load_params(runs / "single" / f"model-000{epoch}.params"),
            roundings=6 * epoch * mlp_chain_roundings(6, [8], 3, 16),
            context=f"epoch {epoch}",
        )
    first, last = load_params(run / "model-0001.params"), load_params(run / "model-0002.params")
    assert not all(np.allclose(first[k], last[k]) for k in first)  # training moved the weights
    # output labelled and logged by ps-lite rank (both launches append to the same files),
    # and rank 0 alone wrote the run folder
    assert "[worker 0]" in done.stdout and "[worker 1]" in done.stdout
    logs = runs / "dist.launch"
    assert {p.name for p in logs.iterdir()} == {
        "scheduler.log",
        "server-0.log",
        "worker-rank-0.log",
        "worker-rank-1.log",
    }
    rank0, rank1 = ((logs / f"worker-rank-{r}.log").read_text() for r in (0, 1))
    assert f"run folder {run}" in rank0 and "rank 0 writes the run folder" not in rank0
    assert rank1.count("worker rank 1: rank 0 writes the run folder") == 2
    assert sorted(p.name for p in runs.iterdir()) == ["dist", "dist.launch", "single"]


def test_sigterm_to_launch_checkpoints_exits_75_and_resume_finishes(blobs: Path) -> None:

    config = write_config(blobs, "long.yaml", ndarray_train(blobs, 4), epochs=100000)
    launcher = start_launch("-n", 2, "-s", 1, config, "--grace", 5)
    started: list[int] = []
    try:
        wait_for_log(launcher, blobs / "runs" / "dist.launch" / "worker-rank-1.log", "epoch 2")
        started = children_of(launcher.pid)
        assert len(started) == 4  # scheduler, server, two workers
        launcher.send_signal(signal.SIGTERM)
        out, err = launcher.communicate(timeout=30)
    finally:
        end_all(launcher, started)
    assert launcher.returncode == 75, out + err
    run = blobs / "runs" / "dist"
    assert f"continue with `mxtrain launch -n 2 -s 1 --resume {run}`" in err, err
    assert not [p for p in started if alive(p)], "orphans left behind"
    saved = list_checkpoints(RunFolder(run))
    assert saved, "rank 0 saved no checkpoint on the way out"
    assert "stop requested: saved checkpoint" in out
    newest = saved[-1]
    # finish the interrupted epoch and one more, as a real user would by raising num_epoch
    resumed = mxtrain(
        "launch",
        "-n",
        2,
        "-s",
        1,
        "--resume",
        run,
        "--set",
        f"fit.num_epoch={newest.epoch + 2}",
        "--grace",
        3,
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"from checkpoint {newest.tag}" in resumed.stdout
    after = list_checkpoints(RunFolder(run))
    assert after[-1].epoch == newest.epoch + 2 and after[-1].batch == 0


def role_of(pid: int) -> str:
    return process_env(pid).get("DMLC_ROLE", "")


@pytest.mark.parametrize("victim", ["worker", "server", "scheduler"])
def test_a_killed_process_stops_the_job_quickly_and_resume_finishes(
    blobs: Path, victim: str
) -> None:
    """SIGKILL to a worker, a server or the scheduler once rank 0 has checkpointed two epochs
    (a point in the training, not a time): every process is gone without waiting out --grace
    (the failure's own short grace), the exit code is 71 and the message names what died; the
    run folder keeps its last checkpoint and `launch --resume` finishes from it."""
    config = write_config(blobs, "long.yaml", ndarray_train(blobs, 4), epochs=100000)
    launcher = start_launch("-n", 2, "-s", 1, config, "--grace", LONG_GRACE)
    started: list[int] = []
    try:
        wait_for_log(launcher, blobs / "runs" / "dist.launch" / "worker-rank-0.log", "epoch 3")
        started = children_of(launcher.pid)
        assert sorted(map(role_of, started)) == ["scheduler", "server", "worker", "worker"]
        target = [p for p in started if role_of(p) == victim][-1]
        killed_at = time.monotonic()
        os.kill(target, signal.SIGKILL)
        _, err = launcher.communicate(timeout=2 * LONG_GRACE)
        wait_until_gone(started, 10)
        elapsed = time.monotonic() - killed_at
    finally:
        end_all(launcher, started)
    assert not [p for p in started if alive(p)], "orphans left behind"
    assert elapsed < LONG_GRACE, elapsed  # a dead peer ends the job without waiting out --grace
    assert launcher.returncode == 71, err
    if victim == "worker":  # ps-lite may have given the killed worker either rank
        named = re.search(r"worker rank (\d) \(launch #\d\) was killed by SIGKILL", err)
        assert named, err
        assert f"worker-rank-{named.group(1)}.log" in err
    else:
        label = "server 0" if victim == "server" else "scheduler"
        assert f"error: {label} was killed by SIGKILL; the other processes were stopped" in err
    assert "Traceback" not in err
    run = blobs / "runs" / "dist"
    saved = list_checkpoints(RunFolder(run))
    assert saved and saved[-1].epoch >= 2
    newest = saved[-1]
    resumed = mxtrain("launch", "-n", 2, "-s", 1, "--resume", run, "--grace", 3,
                      "--set", f"fit.num_epoch={newest.epoch + 1}")  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"from checkpoint {newest.tag}" in resumed.stdout
    assert list_checkpoints(RunFolder(run))[-1].epoch == newest.epoch + 1


UNEVEN_PLUGIN = """\
from mxtrain.data.array_options import NDArrayOptions
from mxtrain.data.arrays import build_ndarray_iter


def uneven(context, source, labels, num_parts=1, part_index=0):
    # part 0 gets 48 rows (6 batches of 8), part 1 only 24 (3 batches)
    rows = 48 if part_index == 0 else 24
    options = NDArrayOptions(source=source, labels=labels, batch_size=8, max_rows=rows)
    return build_ndarray_iter(options, context)
"""


def test_unequal_shards_train_the_same_number_of_batches(blobs: Path) -> None:
    (blobs / "uneven.py").write_text(UNEVEN_PLUGIN)
    train = (
        f"{{iterator: '{blobs / 'uneven.py'}:uneven', source: {blobs / 'x.npy'}, "
        f"labels: {blobs / 'y.npy'}, num_parts: 1}}"
    )
    config = write_config(blobs, "uneven.yaml", train)
    done = mxtrain("launch", "-n", 2, "-s", 1, config, "--grace", 3)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "every worker trains 3" in done.stdout
    from mxtrain.run.folder import read_metrics

    epochs = [
        r for r in read_metrics(blobs / "runs" / "dist" / "metrics.jsonl") if r["event"] == "epoch"
    ]
    assert [r["batch"] for r in epochs] == [3, 3]


def test_launch_refuses_a_local_kvstore_and_an_existing_run(blobs: Path) -> None:
    config = write_config(blobs, "dist.yaml", ndarray_train(blobs, 8))
    done = mxtrain("launch", "-n", 2, "-s", 1, config, "--set", "kvstore.type=local")
    assert done.returncode == 2
    assert "kvstore.type=dist_sync" in done.stderr
    (blobs / "runs" / "dist").mkdir(parents=True)
    done = mxtrain("launch", "-n", 2, "-s", 1, config)
    assert done.returncode == 5 and "already exists" in done.stderr


# --- the ssh launcher, through a fake ssh that runs the "remote" command here -----------------

FAKE_SSH = """\
#!/bin/bash
# Like ssh HOST COMMAND, on this machine: drop the options and the host, then run the command
# in a child shell (as sshd would) with this process's standard input and output.
while [ $# -gt 0 ]; do
  case "$1" in
    -o|-p|-i|-l) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
shift
bash -c "$*"
"""


@pytest.fixture
def fake_ssh(blobs: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A hosts file naming 127.0.0.1, with a fake ``ssh`` first on PATH."""
    bin_dir = blobs / "bin"
    bin_dir.mkdir()
    ssh = bin_dir / "ssh"
    ssh.write_text(FAKE_SSH)
    ssh.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    hosts = blobs / "hosts.txt"
    hosts.write_text("127.0.0.1\n")
    return hosts


SSH_ARGS = ("--launcher", "ssh", "--scheduler-host", "127.0.0.1", "--grace", 3)


def test_ssh_launcher_trains_like_the_local_one(blobs: Path, fake_ssh: Path) -> None:
    config = write_config(blobs, "dist.yaml", ndarray_train(blobs, 8), epochs=1)
    local = mxtrain("launch", "-n", 2, "-s", 1, config, "--name", "local", "--grace", 3)
    assert local.returncode == 0, local.stdout + local.stderr
    remote = mxtrain("launch", "-n", 2, "-s", 1, config, "--name", "ssh", "--hosts", fake_ssh,
                     *SSH_ARGS)  # fmt: skip
    assert remote.returncode == 0, remote.stdout + remote.stderr
    assert "[worker 1]" in remote.stdout and "\r" not in remote.stdout
    runs = blobs / "runs"
    ref, got = (load_params(runs / n / "model-0001.params") for n in ("local", "ssh"))
    # The same job either way: the same shards, threads and updates, and the server's sum of
    # two workers' gradients is the same whichever arrives first (a + b == b + a exactly).
    assert ref.keys() == got.keys()
    for name in ref:
        np.testing.assert_array_equal(got[name], ref[name], err_msg=name)
    # the worker logs show the "remote" workers went through the fake ssh and the relay
    worker_log = (runs / "ssh.launch" / "worker-rank-1.log").read_text()
    assert "distributed worker rank" in worker_log


def test_killing_the_ssh_launcher_stops_the_remote_commands(blobs: Path, fake_ssh: Path) -> None:
    config = write_config(blobs, "long.yaml", ndarray_train(blobs, 4), epochs=100000)
    launcher = start_launch("-n", 2, "-s", 1, config, "--hosts", fake_ssh, *SSH_ARGS)
    started: list[int] = []
    try:
        wait_for_log(launcher, blobs / "runs" / "dist.launch" / "worker-rank-1.log", "epoch 2")
        started = descendants_of(launcher.pid)
        commands = [Path(f"/proc/{p}/cmdline").read_bytes() for p in started]
        relays = [c for c in commands if b"mxtrain.launch\x00--relay\x00" in c]
        assert len(relays) == 3  # one server and two workers, each under the relay
        launcher.kill()  # SIGKILL: the launcher gets no chance to clean up
        launcher.communicate(timeout=10)
        deadline = time.monotonic() + 20
        while [p for p in started if alive(p)] and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        end_all(launcher, started)
    left = [p for p in started if alive(p)]
    assert not left, f"processes outlived the launcher: {left}"


# --- dist_async ----------------------------------------------------------------------------


# the smallest learning rate the config accepts
NEGLIGIBLE_LR = 1e-20


def test_dist_async_trains_and_resumes_from_the_saved_weights(blobs: Path) -> None:
    from mxtrain.run.folder import read_metrics

    config = write_config(blobs, "async.yaml", ndarray_train(blobs, 8), epochs=4)
    done = mxtrain("launch", "-n", 2, "-s", 1, config, "--set", "kvstore.type=dist_async",
                   "--set", "optimizer.momentum=0.0", "--grace", 3)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "optimizer state lives on the kvstore servers" in done.stdout
    run = blobs / "runs" / "dist"
    losses = [
        next(iter(r["train"].values()))
        for r in read_metrics(run / "metrics.jsonl")
        if r["event"] == "epoch"
    ]
    assert len(losses) == 4 and losses[-1] < 0.8 * losses[0], losses
    # With a negligible learning rate a resumed epoch must keep the checkpoint's weights: it
    # would not if the servers still held the random initialisation (weights of order 0.1).
    lr = f"optimizer.learning_rate={NEGLIGIBLE_LR}"
    resumed = mxtrain("launch", "-n", 2, "-s", 1, "--resume", run, "--set", "fit.num_epoch=5",
                      "--set", lr, "--grace", 3)  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "has no optimizer state: the optimizer starts afresh" in resumed.stdout
    saved, again = (load_params(run / f"model-000{e}.params") for e in (4, 5))
    # Each of the epoch's 96 / 8 = 12 updates (no momentum) moves a weight by lr * |g|, and a
    # float32 subtraction is off by at most half a step of the result: for any gradient below
    # 1e6 (this small MLP's are of order 1) the epoch moves no weight by 12 * 1e-20 * 1e6 plus
    # its own rounding, so 1e-12 absolute on any CPU.
    for name in saved:
        np.testing.assert_allclose(again[name], saved[name], rtol=2**-23, atol=1e-12, err_msg=name)


STREAM_CONFIG = """\
experiment: {{name: {name}, seed: 2, runs_dir: {runs}}}
model: {{name: lstm_lm, num_embed: 8, num_hidden: 8, num_layers: 1}}
data:
  train: {{iterator: bptt_stream, source: {text}, batch_size: {streams}, bptt: 6}}
optimizer: {{name: sgd, learning_rate: 1.0, clip_global_norm: 0.5}}
kvstore: {{type: {kvstore}}}
fit: {{num_epoch: 1, log_interval: 5}}
"""


def test_dist_stream_lm_equals_one_process_with_all_streams(tmp_path: Path) -> None:
    """bptt_stream shards by stream: 2 workers of 3 streams each carry their own states and,
    with the gradients summed before the global-norm clip, train what one process with the
    6 streams trains."""
    from conftest import write_corpus

    text = write_corpus(tmp_path / "train.txt", 200, seed=3)
    runs = tmp_path / "runs"
    configs = {}
    for name, streams, kvstore in (("dist", 3, "dist_sync"), ("single", 6, "local")):
        configs[name] = tmp_path / f"{name}.yaml"
        configs[name].write_text(
            STREAM_CONFIG.format(name=name, runs=runs, text=text, streams=streams, kvstore=kvstore)
        )
    done = mxtrain("launch", "-n", 2, "-s", 1, configs["dist"], "--grace", 3)
    assert done.returncode == 0, done.stdout + done.stderr
    single = mxtrain("fit", configs["single"])
    assert single.returncode == 0, single.stderr
    dist = load_params(runs / "dist" / "model-0001.params")
    ref = load_params(runs / "single" / "model-0001.params")
    # The gradient over 6 streams is summed as 3 + 3 by the server, and the norm of the clip
    # sums its squares in another order: per update, the network's chain of roundings and one
    # per gradient value (the norm scales them all), times the updates (see float_bounds).
    from mxtrain.run.folder import read_metrics

    updates = sum(r["batch"] for r in read_metrics(runs / "single" / "metrics.jsonl")
                  if r["event"] == "epoch")  # fmt: skip
    chain = rnn_chain_roundings(6, 6, ref["pred_bias"].size, num_embed=8, num_hidden=8,
                                num_layers=1)  # fmt: skip
    values = sum(v.size for v in ref.values())
    assert_params_close(dist, ref, roundings=updates * (chain + values))
    assert "grad_norm" in (runs / "single" / "train.log").read_text()
