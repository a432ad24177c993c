"""End to end through the CLI: FIFOs and devices as inputs, run folders with entries of the
wrong type or encoding, paths too long for the file system, output folders that cannot be
created (fuzz classes C5-C8, C10). Each ends in one clear message and a documented exit code,
never a hang or a traceback, and leaves every saved file as it was.

Commands that would block on a FIFO or read /dev/zero without end, were the fix undone, run
as real ``python -m mxtrain`` processes with a timeout that kills them.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import TINY_CONFIG, write_corpus

from mxtrain.cli.main import cli

LONG = "x" * 300  # one name longer than any usual file system allows (255 bytes)


def invoke(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result.exit_code, result.output


def run_mxtrain(cwd: Path, *args: object) -> tuple[int, str]:
    """``python -m mxtrain ARGS`` in ``cwd``; killed (and the test failed) if it hangs."""
    done = subprocess.run(
        [sys.executable, "-m", "mxtrain", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.returncode, done.stdout + done.stderr


def assert_clean(code: int, output: str, expected: int, *phrases: str) -> None:
    assert code == expected, output
    assert "Traceback" not in output and "internal error" not in output, output
    for phrase in phrases:
        assert phrase in output, output


def snapshot(folder: Path) -> dict[str, str]:
    """Every entry of ``folder`` with its type and, for files, a hash of its bytes."""
    out = {}
    for path in sorted(folder.rglob("*")):
        key = str(path.relative_to(folder))
        if path.is_symlink() or not (path.is_file() or path.is_dir()):
            out[key] = "special"
        elif path.is_dir():
            out[key] = "folder"
        else:
            out[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny run (two epoch checkpoints) beside its config and data."""
    folder = tmp_path_factory.mktemp("fuzz_files")
    write_corpus(folder / "train.txt", 120, seed=1)
    write_corpus(folder / "valid.txt", 30, seed=2)
    (folder / "tiny.yaml").write_text(textwrap.dedent(TINY_CONFIG.format(runs_dir=folder / "runs")))
    code, output = invoke("fit", folder / "tiny.yaml", "--progress", "quiet")
    assert code == 0, output
    return folder / "runs" / "tiny"


@pytest.fixture
def run_copy(trained: Path) -> Path:
    """A copy of the trained run beside it (its config's relative data paths stay valid)."""
    target = trained.parent / f"copy-{os.getpid()}-{len(list(trained.parent.iterdir()))}"
    shutil.copytree(trained, target)
    yield target
    shutil.rmtree(target, ignore_errors=True)


# ----------------------------------------------------------------- C5/C6: FIFOs and devices


def test_check_refuses_a_fifo_config(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "f.yaml")
    code, output = run_mxtrain(tmp_path, "check", "f.yaml")
    assert_clean(code, output, 2, "f.yaml is a named pipe (FIFO)")


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "/dev/urandom"])
def test_fit_refuses_text_data_that_is_not_a_regular_file(trained: Path, kind: str) -> None:
    folder = trained.parent.parent
    data = folder / f"special-{kind.replace('/', '_')}.txt"
    if not data.exists() and not data.is_symlink():
        os.mkfifo(data) if kind == "fifo" else data.symlink_to(kind)
    code, output = run_mxtrain(
        folder,
        "fit",
        "tiny.yaml",
        "--name",
        "never",
        "--set",
        f"data.train.source={data.name}",
    )
    assert_clean(code, output, 3, data.name, "not a regular file")
    assert not (folder / "runs" / "never").exists()


def test_score_and_resume_refuse_devices_and_fifos(trained: Path, run_copy: Path) -> None:
    folder = trained.parent.parent
    fifo = folder / "score-input.fifo"
    if not fifo.exists():
        os.mkfifo(fifo)
    code, output = run_mxtrain(folder, "score", trained, "--data", fifo)
    assert_clean(code, output, 3, "is a named pipe (FIFO)")
    before = snapshot(run_copy)
    code, output = run_mxtrain(
        folder,
        "resume",
        run_copy,
        "--force",
        "--set",
        "data.train.source=/dev/zero",
        "--set",
        "fit.num_epoch=3",
    )
    assert_clean(code, output, 3, "/dev/zero is a character device")
    assert snapshot(run_copy) == before


def test_a_fifo_params_file_is_skipped_not_waited_for(trained: Path, run_copy: Path) -> None:
    params = run_copy / "checkpoints" / "e0002-b000000" / "params.nd"
    params.unlink()
    os.mkfifo(params)
    code, output = run_mxtrain(trained.parent.parent, "score", f"{run_copy}:e0002-b000000")
    assert_clean(code, output, 3, "params.nd is a named pipe (FIFO)")
    code, output = run_mxtrain(trained.parent.parent, "score", run_copy)
    assert_clean(code, output, 0, "e0001-b000000")  # the newest usable one


# ------------------------------------------------------ C7: run-folder entries, wrong kind


def _make_wrong(run: Path, damage: str) -> None:
    if damage == "checkpoints is a file":
        shutil.rmtree(run / "checkpoints")
        (run / "checkpoints").write_text("not a folder\n")
    elif damage == "best is a folder":
        (run / "checkpoints" / "best").mkdir()
    elif damage == "train.log is a folder":
        (run / "train.log").unlink()
        (run / "train.log").mkdir()
    elif damage == "metrics.jsonl is not UTF-8":
        with (run / "metrics.jsonl").open("ab") as handle:
            handle.write(b'{"event": "\xff\xfe"}\n')
    elif damage == "model_inputs.json is not UTF-8":
        (run / "model_inputs.json").write_bytes(b"\xff\xfe{}")


@pytest.mark.parametrize(
    ("damage", "commands", "phrase"),
    [
        ("checkpoints is a file", ["resume", "score", "export"], "is a file, not a folder"),
        ("best is a folder", ["resume", "score", "export"], "best is a directory"),
        ("train.log is a folder", ["resume", "score"], "train.log is a directory"),
        ("metrics.jsonl is not UTF-8", ["resume"], "metrics.jsonl:"),
        ("model_inputs.json is not UTF-8", ["export"], "model_inputs.json is not UTF-8"),
    ],
)
def test_run_folder_entries_of_the_wrong_type_or_encoding(
    run_copy: Path, tmp_path: Path, damage: str, commands: list[str], phrase: str
) -> None:
    _make_wrong(run_copy, damage)
    before = snapshot(run_copy)
    for command in commands:
        args: list[object] = [command, run_copy]
        if command == "resume":
            args += ["--set", "fit.num_epoch=3", "--progress", "quiet"]
        elif command == "export":
            args += ["-o", tmp_path / f"export-{command}"]
        code, output = invoke(*args)
        assert_clean(code, output, 5, phrase)
        assert snapshot(run_copy) == before, command  # nothing saved was changed or deleted


def test_show_lists_a_run_with_bad_metrics_as_unreadable(run_copy: Path) -> None:
    _make_wrong(run_copy, "metrics.jsonl is not UTF-8")
    code, output = invoke("runs", run_copy.parent)
    assert_clean(code, output, 0, "not UTF-8")


# ---------------------------------------------------- C8: paths too long for the file system


@pytest.mark.parametrize(
    "args",
    [
        ["score", f"runs/{LONG}"],
        ["score", f"runs/{LONG}:2"],
        ["resume", f"runs/{LONG}"],
        ["predict", "--checkpoint", f"runs/{LONG}", "--input", "valid.txt", "--output", "p.jsonl"],
        ["export", f"runs/{LONG}", "-o", "exported"],
        ["show", f"runs/{LONG}"],
        ["diff", f"runs/{LONG}", "runs/tiny"],
        ["runs", f"runs/{LONG}"],
    ],
    ids=lambda args: args[0] + (":2" if args[1].endswith(":2") else ""),
)
def test_run_paths_too_long(trained: Path, monkeypatch: pytest.MonkeyPatch, args: list) -> None:
    monkeypatch.chdir(trained.parent.parent)
    code, output = invoke(*args)
    assert_clean(code, output, 5, "longer than the file system allows")


def test_fit_runs_dir_too_long(trained: Path) -> None:
    folder = trained.parent.parent
    code, output = invoke(
        "fit", folder / "tiny.yaml", "--set", f"experiment.runs_dir={folder / LONG}"
    )
    assert_clean(code, output, 5, "longer than the file system allows")
    code, output = invoke("check", folder / f"{LONG}.yaml")
    assert_clean(code, output, 2, "longer than the file system allows")


def test_input_and_output_paths_too_long(trained: Path, tmp_path: Path) -> None:
    folder = trained.parent.parent
    code, output = invoke("score", trained, "--data", folder / f"{LONG}.txt")
    assert_clean(code, output, 3, "longer than the file system allows")
    code, output = invoke("export", trained, "-o", tmp_path / LONG)
    assert_clean(code, output, 2, "longer than the file system allows")


# ----------------------------------------------------- C10: folders that cannot be created


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_output_folders_that_cannot_be_created(trained: Path, tmp_path: Path) -> None:
    code, output = invoke("export", trained, "-o", "/proc/mxtrain-export")
    assert_clean(code, output, 2, "/proc/mxtrain-export cannot be created")
    code, output = invoke("plot", trained, "-o", "/proc/mxtrain-plot/curves.png")
    assert_clean(code, output, 2, "/proc/mxtrain-plot cannot be created")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, output = invoke("export", trained, "-o", blocker / "below")
    assert_clean(code, output, 2, "cannot be created")
    code, output = invoke(
        "fit",
        trained.parent.parent / "tiny.yaml",
        "--set",
        "experiment.runs_dir=/proc/mxtrain-runs",
    )
    assert_clean(code, output, 5, "/proc/mxtrain-runs")
