"""Run folder creation, refusal to overwrite, --force replacement and atomic files."""

from __future__ import annotations

from pathlib import Path

import pytest

from mxtrain.errors import ExitCode, RunFolderError
from mxtrain.run.atomic import atomic_write_text
from mxtrain.run.folder import MetricsLog, create_run_folder, finish_replacement, read_metrics


def test_creates_and_refuses_existing(tmp_path: Path) -> None:
    run = create_run_folder(tmp_path, "exp", force=False)
    assert run.path.is_dir() and run.replaced is None
    (run.path / "keep.txt").write_text("precious")
    with pytest.raises(RunFolderError) as info:
        create_run_folder(tmp_path, "exp", force=False)
    assert info.value.exit_code == ExitCode.RUN_FOLDER
    assert str(run.path) in str(info.value) and "--force" in str(info.value)
    assert (run.path / "keep.txt").read_text() == "precious"


@pytest.mark.parametrize("succeeded", [True, False])
def test_force_keeps_old_run_until_new_one_succeeds(tmp_path: Path, succeeded: bool) -> None:
    old = create_run_folder(tmp_path, "exp", force=False)
    (old.path / "model-0001.params").write_bytes(b"old")
    new = create_run_folder(tmp_path, "exp", force=True)
    assert new.replaced is not None and (new.replaced / "model-0001.params").read_bytes() == b"old"
    assert list(new.path.iterdir()) == []
    message = finish_replacement(new, succeeded=succeeded)
    if succeeded:
        assert message is None and not new.replaced.exists()
    else:
        assert message is not None and str(new.replaced) in message
        assert (new.replaced / "model-0001.params").read_bytes() == b"old"


@pytest.mark.parametrize("name", ["", "..", "a/b"])
def test_rejects_unusable_names(tmp_path: Path, name: str) -> None:
    with pytest.raises(RunFolderError):
        create_run_folder(tmp_path, name, force=False)


def test_atomic_write_leaves_no_temporary_files(tmp_path: Path) -> None:
    target = tmp_path / "config.yaml"
    atomic_write_text(target, "a: 1\n")
    atomic_write_text(target, "a: 2\n")
    assert target.read_text() == "a: 2\n"
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]


def test_status_merges_fields(tmp_path: Path) -> None:
    run = create_run_folder(tmp_path, "exp", force=False)
    run.write_status(status="running", started=1.0)
    run.write_status(status="finished")
    assert run.read_status() == {"status": "finished", "started": 1.0}


def test_metrics_log_skips_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path)
    log.write({"event": "epoch", "epoch": 1})
    log.close()
    with open(path, "a") as handle:
        handle.write('{"event": "epo')  # a crash mid-write
    records = read_metrics(path)
    assert [r["epoch"] for r in records] == [1]
