"""Deterministic crash points: fit (and resume) killed at every named point of the run-folder
and checkpoint protocols, then resumed, end bit-identical to a run that was never killed.

Nothing here depends on speed: the process kills itself at a named point (mxtrain.crashpoints)
rather than after a sleep. Trial runs with ``trace:`` list the points in the order they are
hit; every registered point must appear there, and each is then killed at its first hit, its
last hit (the last epoch, or the end of the run), in the middle of an epoch (the checkpoint
of a SIGTERM stop) and, for the resume's own writes, inside ``mxtrain resume``.
"""

from __future__ import annotations

import json
import multiprocessing
import multiprocessing.connection
import shutil
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import metric_trace, params, write_corpus
from crash_child import run_command

from mxtrain.cli.main import cli
from mxtrain.crashpoints import POINTS
from mxtrain.run import checkpoint
from mxtrain.run.folder import RunFolder, read_metrics

# Dropout, momentum and an lr schedule (everything that makes resume hard), four batches an
# epoch, keep_last 1 with a best checkpoint (retention deletes in epochs 2 and 3).
CONFIG = """\
experiment: {{name: straight, seed: 5, runs_dir: {runs}}}
model: {{name: lstm_lm, num_embed: 4, num_hidden: 6, num_layers: 2, dropout: 0.3}}
data:
  train: {{iterator: bucket_sentence, source: train.txt, batch_size: 4, buckets: [5, 9, 13]}}
  eval: {{iterator: bucket_sentence, source: valid.txt, batch_size: 4}}
optimizer:
  name: sgd
  learning_rate: 0.5
  momentum: 0.9
  lr_scheduler: {{type: factor, step: 3, factor: 0.8}}
fit: {{num_epoch: 3, log_interval: 2, max_batches_per_epoch: 4}}
checkpoint: {{keep_last: 1, best_metric: perplexity}}
"""
EPOCHS = 3
STOP_MID_EPOCH = "term:train.batch@epoch=2,batch=2"  # SIGTERM: checkpoint e0001-b000002
STOP_AT_EPOCH_END = "term:train.batch@epoch=1,batch=4"  # e0001-b000000 saved twice
RESUME_CHANGE = ("--set", "fit.prefetch=1")  # a change that may be made: config.yaml replaced
CHILD_TIMEOUT = 300  # a hang guard only; no verdict depends on it


@dataclass(frozen=True)
class Hit:
    name: str
    where: dict[str, Any]
    ordinal: int  # 1 for the first hit of this name in its process, ...

    @property
    def key(self) -> str:
        """The point, with the file for the shared atomic-write points."""
        file = str(self.where.get("file", ""))
        if file.startswith("config.before-resume-"):
            file = "config.before-resume-*.yaml"
        return f"{self.name}[{file}]" if file else self.name


@dataclass(frozen=True)
class Case:
    key: str
    position: str
    command: str  # fit or resume
    crash_at: str

    @property
    def label(self) -> str:
        return f"{self.key} ({self.position})"


class Workspace:
    """The corpus, the config, a fork server for the children, and the trial runs."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.runs = root / "runs"
        write_corpus(root / "train.txt", 40, seed=1)
        write_corpus(root / "valid.txt", 10, seed=2)
        self.config = root / "crash.yaml"
        self.config.write_text(CONFIG.format(runs=self.runs))
        self.context = multiprocessing.get_context("forkserver")
        self.context.set_forkserver_preload(["mxnet"])

    def child(self, args: list[str], crash_at: str, label: str) -> tuple[int | None, str]:
        """Run ``mxtrain ARGS`` in a child process; (exit code, negative for a signal; output)."""
        return self.children([(args, crash_at, label)])[0]

    def children(
        self, jobs: list[tuple[list[str], str, str]], parallel: int = 1
    ) -> list[tuple[int | None, str]]:
        """Run each ``(args, crash_at, label)`` job in a child, ``parallel`` at a time.

        Every child is started and reaped from this one thread: ``Process.start`` polls the
        other live children, and a poll racing a ``join`` in another thread reads the fork
        server's exit-code message twice and reports exit 255 for a child that was killed.
        """
        results: dict[int, tuple[int | None, str]] = {}
        running: dict[int, tuple[Any, float]] = {}
        try:
            for index, (args, crash_at, label) in enumerate(jobs):
                while len(running) >= parallel:
                    self._reap(jobs, running, results)
                proc = self.context.Process(
                    target=run_command, args=(args, crash_at, str(self.root), self.output(label))
                )
                proc.start()
                running[index] = (proc, time.monotonic() + CHILD_TIMEOUT)
            while running:
                self._reap(jobs, running, results)
        finally:  # a failure leaves no child behind
            for proc, _ in running.values():
                proc.kill()
                proc.join()
        return [results[index] for index in range(len(jobs))]

    def output(self, label: str) -> str:
        return str(self.root / f"{label}.out")

    def _reap(self, jobs: list[Any], running: dict[int, Any], results: dict[int, Any]) -> None:
        """Wait up to a second for a child to end; move the ended ones to ``results``."""
        multiprocessing.connection.wait([proc.sentinel for proc, _ in running.values()], 1)
        for index, (proc, deadline) in list(running.items()):
            if proc.is_alive() and time.monotonic() < deadline:
                continue
            del running[index]
            if proc.is_alive():
                proc.kill()
                proc.join()
                args, crash_at, _ = jobs[index]
                pytest.fail(f"mxtrain {' '.join(args)} with {crash_at!r} hung")
            proc.join()
            label = jobs[index][2]
            results[index] = (proc.exitcode, Path(self.output(label)).read_text(errors="replace"))

    def fit(self, name: str, crash_at: str) -> tuple[int | None, str]:
        args = ["fit", str(self.config), "--name", name, "--progress", "plain"]
        return self.child(args, crash_at, name)

    def trace(self, name: str, args: list[str], rules: str = "") -> tuple[int | None, list[Hit]]:
        path = self.root / f"{name}.trace"
        code, output = self.child(args, f"{rules};trace:{path}", name)
        assert code in (0, 75), output
        hits, seen = [], {}
        for line in path.read_text().splitlines():
            record = json.loads(line)
            seen[record["name"]] = seen.get(record["name"], 0) + 1
            hits.append(Hit(record["name"], record["where"], seen[record["name"]]))
        return code, hits


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def first_after(hits: list[Hit], start: int) -> Iterator[Hit]:
    """The first hit of each point after ``hits[start]``."""
    seen: set[str] = set()
    for hit in hits[start + 1 :]:
        if hit.key not in seen:
            seen.add(hit.key)
            yield hit


def index_of(hits: list[Hit], rule: str) -> int:
    name, _, where = rule.split(":", 1)[1].partition("@")
    wanted = dict(item.split("=") for item in where.split(","))
    return next(
        i
        for i, h in enumerate(hits)
        if h.name == name and all(str(h.where.get(k)) == v for k, v in wanted.items())
    )


def folder_listing(run: Path) -> list[str]:
    names = [p.name for p in run.iterdir() if not p.name.startswith("config.before-resume-")]
    names += [f"checkpoints/{p.name}" for p in (run / "checkpoints").iterdir()]
    return sorted(names)


def differences(straight: Path, run: Path) -> list[str]:
    """How ``run`` differs from the straight run: parameters, metrics, files, status."""
    if not (run / f"model-{EPOCHS:04d}.params").exists():
        return [f"no model-{EPOCHS:04d}.params"]
    problems = []
    a, b = params(straight, EPOCHS), params(run, EPOCHS)
    if a.keys() != b.keys() or any(not np.array_equal(a[k], b[k]) for k in a):
        problems.append("final parameters differ")
    if metric_trace(straight) != metric_trace(run):
        problems.append("metrics.jsonl differs")
    if folder_listing(straight) != folder_listing(run):
        problems.append(f"files differ: {folder_listing(run)}")
    elif (straight / "checkpoints/best").read_text() != (run / "checkpoints/best").read_text():
        problems.append("checkpoints/best differs")
    if RunFolder(run).read_status().get("status") != "finished":
        problems.append(f"run.json status {RunFolder(run).read_status().get('status')}")
    return problems


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    return Workspace(tmp_path_factory.mktemp("crash"))


@pytest.fixture(scope="module")
def trials(workspace: Workspace) -> dict[str, Any]:
    """The straight run (traced), and traced runs stopped mid-epoch, at an epoch end and
    resumed: the hits each kill case is chosen from."""
    ws = workspace
    fit_args = ["fit", str(ws.config), "--progress", "plain", "--name"]
    code, straight = ws.trace("straight", [*fit_args, "straight"])
    assert code == 0
    code, mid = ws.trace("mid", [*fit_args, "mid"], STOP_MID_EPOCH)
    assert code == 75
    code, edge = ws.trace("edge", [*fit_args, "edge"], STOP_AT_EPOCH_END)
    assert code == 75
    shutil.copytree(ws.runs / "mid", ws.root / "stopped-mid")  # pristine, for resume kills
    shutil.copytree(ws.runs / "mid", ws.runs / "mid-resumed")
    code, resumed = ws.trace(
        "resume", ["resume", str(ws.runs / "mid-resumed"), *RESUME_CHANGE, "--progress", "plain"]
    )
    assert code == 0
    return {"straight": straight, "mid": mid, "edge": edge, "resume": resumed}


def kill_cases(trials: dict[str, Any]) -> list[Case]:
    cases: list[Case] = []
    covered: set[str] = set()

    def add(hit: Hit, position: str, command: str, before: str = "") -> None:
        rule = f"kill:{hit.name}#{hit.ordinal}"
        cases.append(Case(hit.key, position, command, f"{before};{rule}" if before else rule))
        covered.add(hit.name)

    straight: list[Hit] = trials["straight"]
    by_key: dict[str, list[Hit]] = {}
    for hit in straight:
        by_key.setdefault(hit.key, []).append(hit)
    for hits in by_key.values():
        add(hits[0], "first hit", "fit")
        if len(hits) > 1:
            add(hits[-1], "last epoch / end of run", "fit")
    mid: list[Hit] = trials["mid"]
    for hit in first_after(mid, index_of(mid, STOP_MID_EPOCH)):
        add(hit, "mid-epoch stop", "fit", STOP_MID_EPOCH)
    edge: list[Hit] = trials["edge"]
    for hit in first_after(edge, index_of(edge, STOP_AT_EPOCH_END)):
        if hit.name not in covered:  # replacing a checkpoint of the same tag
            add(hit, "stop at an epoch end", "fit", STOP_AT_EPOCH_END)
    resumed: list[Hit] = trials["resume"]
    training = next(i for i, h in enumerate(resumed) if h.name == "train.batch")
    for hit in first_after(resumed[:training], -1):
        add(hit, "inside mxtrain resume", "resume")
    return cases


def kill_job(ws: Workspace, case: Case, name: str) -> tuple[list[str], str, str]:
    """The child job that runs the case's command as ``name`` until it kills itself."""
    if case.command == "fit":
        return ["fit", str(ws.config), "--name", name, "--progress", "plain"], case.crash_at, name
    run = ws.runs / name
    shutil.copytree(ws.root / "stopped-mid", run)
    return ["resume", str(run), *RESUME_CHANGE, "--progress", "plain"], case.crash_at, name


def recover(ws: Workspace, case: Case, name: str, killed: tuple[int | None, str]) -> list[str]:
    """Recover from the kill with the next command and compare: the problems."""
    run = ws.runs / name
    code, output = killed
    if code != -signal.SIGKILL:
        return [f"not killed (exit {code}): {output[-300:]}"]
    if not run.exists():
        # killed before the run folder was renamed into place: nothing is left behind, and
        # the same fit command starts the run again
        code, output = invoke("fit", str(ws.config), "--name", name, "--progress", "plain")
        if any(p.name.startswith(f".{name}.") for p in ws.runs.iterdir()):
            return ["the staging folder was left behind"]
    elif RunFolder(run).read_status().get("status") == "finished":
        # killed after run.json recorded the end: the run is complete, and resume says so
        code, output = invoke("resume", str(run))
        if code != 2 or "nothing to resume" not in output:
            return [f"resume of the finished run exited {code}: {output[-500:]}"]
        code = 0
    else:
        extra = RESUME_CHANGE if case.command == "resume" else ()
        code, output = invoke("resume", str(run), *extra, "--progress", "plain")
    if code != 0 or "Traceback" in output:
        return [f"recovery exited {code}: {output[-500:]}"]
    return differences(ws.runs / "straight", run)


def test_every_crash_point_recovers(workspace: Workspace, trials: dict[str, Any]) -> None:
    traced = {h.name for hits in trials.values() for h in hits}
    assert sorted(set(POINTS) - traced) == [], "registered points that no run reaches"
    cases = kill_cases(trials)
    assert {c.key.split("[")[0] for c in cases} == set(POINTS)
    positions = {c.position for c in cases}
    assert "mid-epoch stop" in positions and "last epoch / end of run" in positions
    names = [f"k{number:03d}" for number in range(len(cases))]
    # the killed processes run two at a time (they are separate processes); the recoveries
    # run here, one after the other
    jobs = [kill_job(workspace, case, name) for case, name in zip(cases, names, strict=True)]
    killed = workspace.children(jobs, parallel=2)
    failures = []
    for case, name, result in zip(cases, names, killed, strict=True):
        problems = recover(workspace, case, name, result)
        if problems:
            failures.append(f"{case.label} [{case.crash_at}]: {'; '.join(problems)}")
    recovered = len(cases) - len(failures)
    print(
        f"\n{recovered} of {len(cases)} crash points recover "
        f"({len(POINTS)} named points, each killed at its first and last hit, mid-epoch "
        "and inside resume where it occurs there)"
    )
    assert failures == [], "\n".join(failures)


def test_straight_run_is_unchanged_by_tracing(workspace: Workspace, trials: dict[str, Any]) -> None:
    """The mid-epoch stop and its resume (traced) match the straight run too."""
    assert differences(workspace.runs / "straight", workspace.runs / "mid-resumed") == []
    assert checkpoint.list_checkpoints(RunFolder(workspace.root / "stopped-mid"))[-1].tag == (
        "e0001-b000002"
    )


# ----------------------------------------------------------------------------- SIGTERM early


@pytest.mark.parametrize("point", ["file.written", "mxnet-file.replaced"])
def test_sigterm_before_the_run_folder_exists_leaves_nothing(
    workspace: Workspace, point: str
) -> None:
    name = f"early-{point}"
    code, output = workspace.fit(name, f"term:{point}")
    assert code == 75, output
    assert "stopped on request before the run folder was created; nothing was written" in output
    assert "same `mxtrain fit` command" in output and "Traceback" not in output
    assert [p.name for p in workspace.runs.iterdir() if name in p.name] == []


def test_sigterm_before_the_first_batch_resumes_from_the_start(
    workspace: Workspace, trials: dict[str, Any]
) -> None:
    run = workspace.runs / "first-batch"
    code, output = workspace.fit(run.name, "term:run-folder.published")
    assert code == 75, output
    assert "before the first batch" in output and f"mxtrain resume {run}" in output
    assert "Traceback" not in output
    assert RunFolder(run).read_status()["status"] == "preempted"
    assert checkpoint.list_checkpoints(RunFolder(run)) == []
    code, output = invoke("resume", str(run), "--progress", "plain")
    assert code == 0, output
    assert "training starts from the beginning" in output
    assert [r["from"] for r in RunFolder(run).read_status()["resumes"]] == ["beginning"]
    assert differences(workspace.runs / "straight", run) == []


# ----------------------------------------------------------------------------- epoch rates


def test_epoch_rates_after_a_mid_epoch_resume_cover_the_whole_epoch(
    workspace: Workspace, trials: dict[str, Any]
) -> None:
    run = workspace.runs / "rates"
    shutil.copytree(workspace.root / "stopped-mid", run)
    (ckpt,) = [c for c in checkpoint.list_checkpoints(RunFolder(run)) if c.batch]
    saved = json.loads((ckpt.path / "state.json").read_text())
    position = saved["state"]["position"]
    assert position["batch"] == 2 and position["epoch_seconds"] > 0
    # Pretend the first half of the epoch took 1000 s: the resumed epoch record must count it
    position["epoch_seconds"] = 1000.0
    (ckpt.path / "state.json").write_text(json.dumps(saved))
    manifest = json.loads((ckpt.path / "manifest.json").read_text())
    del manifest["manifest_sha256"]
    manifest["files"]["state.json"] = checkpoint.file_digest(ckpt.path / "state.json")
    (ckpt.path / "manifest.json").write_bytes(checkpoint._seal(manifest))

    code, output = invoke("resume", str(run), "--progress", "plain")
    assert code == 0, output

    def epoch_two(folder: Path) -> dict[str, Any]:
        (record,) = [
            r
            for r in read_metrics(folder / "metrics.jsonl")
            if r["event"] == "epoch" and r["epoch"] == 2
        ]
        return record

    resumed, straight = epoch_two(run), epoch_two(workspace.runs / "straight")
    # the counts cover the whole epoch, and so do the seconds (the 1000 s before the stop)
    assert (resumed["samples"], resumed["tokens"]) == (straight["samples"], straight["tokens"])
    seconds, tokens = resumed["seconds"], resumed["tokens"]
    assert seconds >= 1000.0
    # the record's rate is its tokens over its seconds (seconds rounded to 3 decimals, the
    # rate to 2)
    assert tokens / (seconds + 0.0005) - 0.005 <= resumed["tokens_per_s"]
    assert resumed["tokens_per_s"] <= tokens / (seconds - 0.0005) + 0.005
    assert resumed["samples"] / (seconds + 0.0005) - 0.005 <= resumed["samples_per_s"]
    assert resumed["samples_per_s"] <= resumed["samples"] / (seconds - 0.0005) + 0.005
