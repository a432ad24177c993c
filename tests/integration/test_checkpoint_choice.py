"""Which checkpoint score, predict, show and resume use, and what they do with a bad one.

One run is fitted once per module and stopped by fit.max_updates in its third epoch, so it
has epoch-end and mid-epoch checkpoints and a recorded best; tests that damage files work on
a copy.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from checkpoint_helpers import reseal, reseal_position
from click.testing import CliRunner
from conftest import TINY_CONFIG, write_corpus
from float_bounds import rescored_rel

from mxtrain.cli.main import cli
from mxtrain.run.folder import read_metrics

LAYOUT = ["e0001-b000000", "e0002-b000000", "e0002-b000003"]  # 17 batches an epoch, 37 updates


def rescored(run: Path, perplexity: float) -> float:
    """How far a perplexity scored again may be from fit's (float_bounds.rescored_rel) for
    the tiny config's LSTM (longest bucket 13)."""
    return rescored_rel(run, perplexity, steps=13, batch=8, embed=8, hidden=12, layers=1)


def invoke(*args: object) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


def fit(folder: Path, name: str, *overrides: str) -> Path:
    args: list[object] = ["fit", folder / "tiny.yaml", "--name", name]
    for item in overrides:
        args += ["--set", item]
    code, out, err = invoke(*args)
    assert code == 0, out + err
    return folder / "runs" / name


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("choice")
    write_corpus(folder / "train.txt", 120, seed=1)
    write_corpus(folder / "valid.txt", 30, seed=2)
    (folder / "tiny.yaml").write_text(textwrap.dedent(TINY_CONFIG.format(runs_dir=folder / "runs")))
    run = fit(
        folder,
        "stopped",
        "fit.num_epoch=3",
        "checkpoint.best_metric=perplexity",
        "fit.max_updates=37",
    )
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["best", *LAYOUT]
    return run


@pytest.fixture
def copy(stopped: Path, tmp_path: Path) -> Path:
    """A copy of the stopped run beside its data (config paths stay valid via run.json)."""
    target = tmp_path / "run"
    shutil.copytree(stopped, target)
    return target


def logged(run: Path) -> dict[str, float]:
    """Eval perplexity logged at each saved checkpoint, by tag."""
    records = read_metrics(run / "metrics.jsonl")
    return {r["checkpoint"]: r["eval"]["perplexity"] for r in records if r.get("checkpoint")}


def score_json(*args: object) -> dict:
    code, out, err = invoke("score", *args, "--json")
    assert code == 0, err
    return json.loads(out)


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_run_stopped_mid_epoch_scores_and_predicts_its_checkpoint(
    stopped: Path, tmp_path: Path
) -> None:
    """fit.max_updates stops in the first epoch: no epoch ended, yet there is a model."""
    run = fit(stopped.parent.parent, "first", "fit.max_updates=5")
    assert json.loads((run / "run.json").read_text())["status"] == "finished"
    assert not list(run.glob("model-*.params"))  # no epoch end: only the mid-epoch checkpoint
    record = score_json(run)
    assert record["checkpoint"] == "e0000-b000005" and (record["epoch"], record["batch"]) == (0, 5)
    # the checkpoint's weights on fit's evaluation batches: fit's number, exactly
    assert record["metrics"]["perplexity"] == pytest.approx(
        logged(run)["e0000-b000005"], rel=rescored(run, logged(run)["e0000-b000005"])
    )
    code, out, err = invoke("score", run)
    assert code == 0 and "(checkpoint e0000-b000005)" in out.splitlines()[0]

    source = tmp_path / "in.txt"
    source.write_text("the cat sat\n\nred dog\n")
    code, out, err = invoke(
        "predict", "--checkpoint", run, "--input", source, "--output", tmp_path / "o.jsonl"
    )
    assert code == 0, err
    assert "wrote 3 records" in out and "(checkpoint e0000-b000005)" in out
    code, out, _ = invoke("show", run)
    assert code == 0 and any(
        line.split()[0] == "e0000-b000005" and line.rstrip().endswith("latest")
        for line in out.splitlines()
        if line.strip().startswith("e0000")
    )


def test_latest_best_tag_and_epoch_selectors_agree_with_runs_and_show(stopped: Path) -> None:
    values = logged(stopped)
    latest = score_json(stopped)
    assert latest["checkpoint"] == "e0002-b000003" == score_json(f"{stopped}:latest")["checkpoint"]
    assert latest["metrics"]["perplexity"] == pytest.approx(
        values["e0002-b000003"], rel=rescored(stopped, values["e0002-b000003"])
    )

    best = score_json(f"{stopped}:best")
    code, out, _ = invoke("runs", stopped.parent, "--json")
    listed = {Path(r["path"]).name: r for r in json.loads(out)}["stopped"]["best"]
    assert best["checkpoint"] == listed["checkpoint"] == "e0002-b000000"
    assert best["metrics"]["perplexity"] == pytest.approx(
        listed["value"], rel=rescored(stopped, listed["value"])
    )
    code, out, _ = invoke("runs", stopped.parent)
    assert "e0002-b000000)" in out
    code, out, _ = invoke("show", stopped)
    rows = {line.split()[0]: line for line in out.splitlines() if line.strip().startswith("e000")}
    assert rows["e0002-b000000"].rstrip().endswith("best")
    assert rows["e0002-b000003"].rstrip().endswith("latest")
    assert "checkpoint e0002-b000000)" in out

    tagged = score_json(f"{stopped}:e0001-b000000")
    assert tagged["checkpoint"] == "e0001-b000000"
    assert tagged["metrics"]["perplexity"] == pytest.approx(
        values["e0001-b000000"], rel=rescored(stopped, values["e0001-b000000"])
    )
    assert score_json(f"{stopped}:2")["checkpoint"] == "e0002-b000000"
    assert score_json(stopped, "--epoch", "1")["checkpoint"] == "e0001-b000000"

    code, _, err = invoke("score", f"{stopped}:e0009-b000000")
    assert code == 3 and "no checkpoint e0009-b000000" in err and "RUN:latest" in err
    code, _, err = invoke("score", f"{stopped}:best", "--epoch", "1")
    assert code == 2 and "--epoch" in err


def test_a_flipped_bit_in_params_is_skipped_or_refused(copy: Path, tmp_path: Path) -> None:
    damaged = copy / "checkpoints" / "e0002-b000003" / "params.nd"
    flip_byte(damaged)
    code, out, err = invoke("score", copy, "--json")
    assert code == 0, err
    assert json.loads(out)["checkpoint"] == "e0002-b000000"  # the newest valid one
    assert "checkpoint e0002-b000003 is not usable (params.nd is corrupted" in err
    for ref in (f"{copy}:e0002-b000003",):
        code, out, err = invoke("score", ref)
        assert code == 3 and str(damaged) in err and "corrupted" in err
        assert "RUN:latest" in err and "Traceback" not in err + out
    code, out, _ = invoke("show", copy)
    assert "not usable: params.nd is corrupted" in out

    # predict loads the same verified file; the explicit choice is refused the same way
    source = tmp_path / "in.txt"
    source.write_text("the cat sat\n")
    code, out, err = invoke(
        "predict", "--checkpoint", copy, "--input", source, "--output", tmp_path / "o.jsonl"
    )
    assert code == 0 and "(checkpoint e0002-b000000)" in out, err
    code, out, err = invoke(
        "predict", "--checkpoint", f"{copy}:latest", "--input", source,
        "--output", tmp_path / "p.jsonl",
    )  # fmt: skip
    assert code == 0 and "(checkpoint e0002-b000000)" in out, err
    flip_byte(copy / "checkpoints" / "e0002-b000000" / "params.nd")
    code, out, err = invoke("score", f"{copy}:best")
    assert code == 3 and "e0002-b000000/params.nd is corrupted" in err and "Traceback" not in err


def test_run_folders_without_checkpoint_folders_still_work(copy: Path) -> None:
    shutil.rmtree(copy / "checkpoints")
    code, out, err = invoke("score", copy, "--json")
    assert code == 0, err
    assert json.loads(out)["checkpoint"] == "model-0002.params"
    assert "cannot be verified" in err
    assert score_json(f"{copy}:1")["checkpoint"] == "model-0001.params"
    code, _, err = invoke("score", f"{copy}:best")
    assert code == 5 and "no checkpoint folders" in err


def folder_state(run: Path) -> dict[str, str]:
    return {
        str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run.rglob("*"))
        if p.is_file()
    }


POSITIONS = {
    "epoch -1": lambda p: p.update(epoch=-1),
    "batch 10**12": lambda p: p.update(batch=10**12),
    'epoch "abc"': lambda p: p.update(epoch="abc"),
    "totals null": lambda p: p.update(totals=None),
}


@pytest.mark.parametrize("case", list(POSITIONS))
def test_resume_skips_a_checkpoint_with_an_impossible_position(copy: Path, case: str) -> None:
    bad = copy / "checkpoints" / "e0002-b000003"
    reseal_position(bad, POSITIONS[case])
    kept = folder_state(bad)
    code, out, err = invoke("resume", copy, "--set", "fit.max_updates=38")
    assert code == 0, out + err
    assert "checkpoint e0002-b000003 is not usable (state.json holds" in out + err
    assert "falling back to an older one" in out + err and "Traceback" not in out + err
    status = json.loads((copy / "run.json").read_text())
    assert status["resumes"][-1]["from"] == "e0002-b000000"
    # the bad one is neither used nor deleted: set aside, out of retention's reach
    assert not bad.exists()
    assert folder_state(copy / "checkpoints" / "damaged-e0002-b000003-1") == kept
    assert "kept as" in out + err and "damaged-e0002-b000003-1" in out + err
    assert (copy / "checkpoints" / "e0002-b000004").is_dir()  # 34 + 4 updates


def test_resume_falls_back_when_mxnet_cannot_read_a_verified_file(copy: Path) -> None:
    reseal(copy / "checkpoints" / "e0002-b000003", "optimizer.nd", b"\x00" * 64)
    # the damaged newest one is kept and blocks nothing: resume from the next one
    code, out, err = invoke("resume", copy, "--set", "fit.max_updates=35")
    assert code == 0, out + err
    assert "optimizer.nd cannot be read by MXNet" in out + err and "falling back" in out + err
    assert json.loads((copy / "run.json").read_text())["resumes"][-1]["from"] == "e0002-b000000"

    # none left: an error that does not claim a fallback
    for tag in (*LAYOUT, "e0002-b000001"):
        folder = copy / "checkpoints" / tag
        if folder.is_dir():
            reseal(folder, "params.nd", b"\x00" * 64)
    before = folder_state(copy)
    code, out, err = invoke("resume", copy, "--set", "fit.max_updates=40")
    assert code == 3 and "has no valid checkpoint" in err and "params.nd cannot be read" in err
    assert "falls back" not in err and "falling back" not in err and "Traceback" not in err
    assert folder_state(copy) == before


@contextlib.contextmanager
def read_only(folder: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Make ``folder`` really unwritable; yields how.

    Not root: chmod. Root ignores permission bits, so the folder is bind-mounted read-only
    onto itself (writes fail with EROFS). Where mounting is not allowed either, the one
    write resume's check makes (tempfile.mkstemp in the folder) is made to fail with EROFS,
    which is what the kernel answers on a read-only filesystem.
    """
    if os.geteuid() != 0:
        modes = {p: p.stat().st_mode for p in [folder, *folder.rglob("*")] if p.is_dir()}
        for path in modes:
            path.chmod(0o555)
        try:
            yield "chmod"
        finally:
            for path, mode in modes.items():
                path.chmod(mode)
        return
    mounted = False
    if shutil.which("mount"):
        bind = subprocess.run(["mount", "--bind", folder, folder], capture_output=True)
        if bind.returncode == 0:
            ro = subprocess.run(
                ["mount", "-o", "remount,bind,ro", folder, folder], capture_output=True
            )
            if ro.returncode == 0:
                mounted = True
            else:
                subprocess.run(["umount", folder], capture_output=True)
    if mounted:
        try:
            yield "read-only bind mount"
        finally:
            subprocess.run(["umount", folder], capture_output=True, check=True)
        return
    real = tempfile.mkstemp

    def refuse(*args: object, **kwargs: object) -> tuple[int, str]:
        where = Path(str(kwargs.get("dir", "")))
        if where == folder or folder in where.parents:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(where))
        return real(*args, **kwargs)  # type: ignore[call-overload,no-any-return]

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    yield "simulated EROFS"


def test_resume_of_a_read_only_run_folder(copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = folder_state(copy)
    with read_only(copy, monkeypatch) as how:
        code, out, err = invoke("resume", copy, "--set", "fit.max_updates=40")
    assert code == 5, (how, out + err)
    assert f"the folder {copy}" in err and "cannot be written" in err and "chmod" in err
    assert "Traceback" not in out + err
    assert folder_state(copy) == before
    code, out, err = invoke("resume", copy, "--set", "fit.max_updates=38")  # writable again
    assert code == 0, out + err


def test_best_without_best_metric_is_the_best_logged_checkpoint(copy: Path) -> None:
    """No checkpoint.best_metric, so no checkpoints/best: RUN:best is what runs reports."""
    (copy / "checkpoints" / "best").unlink()
    code, out, _ = invoke("runs", copy.parent, "--json")
    listed = json.loads(out)[0]["best"]
    best = score_json(f"{copy}:best")
    assert best["checkpoint"] == listed["checkpoint"] == "e0002-b000000"
    assert best["metrics"]["perplexity"] == pytest.approx(
        listed["value"], rel=rescored(copy, listed["value"])
    )
    (copy / "metrics.jsonl").write_text("")  # nothing logged: no best to load
    code, _, err = invoke("score", f"{copy}:best")
    assert code == 3 and "records no best checkpoint" in err and "best_metric" in err
    assert "Traceback" not in err
