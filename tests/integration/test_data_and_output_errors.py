"""Damaged data files stop `fit` with exit 3; predict's --output is never a device it replaces."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from mxtrain.cli.main import cli

CONFIG = """\
experiment: {{name: rows, seed: 1, runs_dir: {runs}}}
model: {{name: mlp, hidden: [8]}}
data:
  train: {{iterator: {iterator}, source: {source}, batch_size: 16{extra}}}
fit: {{num_epoch: 1}}
checkpoint: {{prefix: model}}
"""


def invoke(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result.exit_code, result.output


def write_config(folder: Path, iterator: str, source: str, extra: str = "") -> Path:
    config = folder / "rows.yaml"
    config.write_text(
        CONFIG.format(runs=folder / "runs", iterator=iterator, source=source, extra=extra)
    )
    return config


def write_rows(folder: Path, rows: int = 64) -> None:
    rng = np.random.default_rng(0)
    labels = np.arange(rows) % 2
    features = rng.normal(size=(rows, 4)).astype(np.float32) + labels[:, None]
    np.savez(folder / "rows.npz", data=features, label=labels)
    np.save(folder / "in.npy", features[:5])


def test_truncated_npz_stops_fit_with_a_data_error(tmp_path: Path) -> None:
    write_rows(tmp_path)
    whole = (tmp_path / "rows.npz").read_bytes()
    (tmp_path / "rows.npz").write_bytes(whole[: len(whole) // 2])
    config = write_config(tmp_path, "ndarray", "rows.npz")
    code, output = invoke("fit", config)
    assert code == 3, output
    assert "rows.npz cannot be read as a NumPy file" in output and "truncated" in output
    assert "Traceback" not in output
    # Nothing left behind blocks the next try once the file is whole again.
    (tmp_path / "rows.npz").write_bytes(whole)
    code, output = invoke("fit", config)
    assert code == 0, output


def test_stray_libsvm_index_stops_fit_naming_line_and_option(tmp_path: Path) -> None:
    lines = [f"{i % 2} {1 + i % 30}:1 {31 + i % 20}:0.5" for i in range(300)]
    lines[199] += " 3000000:1"
    (tmp_path / "rows.svm").write_text("\n".join(lines) + "\n")
    config = write_config(tmp_path, "libsvm", "rows.svm")
    code, output = invoke("fit", config)
    assert code == 3, output
    assert "rows.svm:200:" in output and "3,000,000" in output
    assert "num_features: 3000000" in output and "Traceback" not in output
    (tmp_path / "rows.svm").write_text("1 10000000000000:1\n")
    code, output = invoke("fit", config)
    assert code == 3 and "rows.svm:1:" in output and "largest supported feature index" in output
    assert "Traceback" not in output


# --------------------------------------------------------------------------- predict --output


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("rows")
    write_rows(folder)
    code, output = invoke("fit", write_config(folder, "ndarray", "rows.npz"))
    assert code == 0, output
    return folder


def predict(trained: Path, output: object, *extra: str) -> tuple[int, str]:
    run = trained / "runs" / "rows"
    return invoke(
        "predict", "--checkpoint", run, "--input", trained / "in.npy", "--output", output, *extra
    )


def test_dev_full_is_a_clear_error_and_stays_a_device(trained: Path) -> None:
    """As root, the old code renamed a regular file over /dev/full."""
    code, output = predict(trained, "/dev/full", "--force")
    assert code == 3, output
    assert "/dev/full" in output and "No space left on device" in output
    assert "Traceback" not in output
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)
    assert not list(Path("/dev").glob(".full.tmp-*"))


def test_dev_stdout_gets_the_records_in_a_pipe_and_a_redirect(trained: Path, tmp_path: Path):
    argv = [sys.executable, "-m", "mxtrain", "predict", "--checkpoint", "runs/rows"]
    argv += ["--input", "in.npy", "--output", "/dev/stdout"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    piped = subprocess.run(argv, cwd=trained, env=env, capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0, piped.stderr
    records = piped.stdout.splitlines()
    assert len(records) == 5 and all(r.startswith('{"line": ') for r in records), piped.stdout
    assert "wrote 5 records" in piped.stderr
    # A shell's `> file` makes /dev/stdout a regular file: written in place, not replaced.
    redirected = tmp_path / "out.jsonl"
    with open(redirected, "wb") as handle:
        inode = os.fstat(handle.fileno()).st_ino
        proc = subprocess.run(
            argv, cwd=trained, env=env, stdout=handle, stderr=subprocess.PIPE, timeout=120
        )
    assert proc.returncode == 0, proc.stderr
    assert redirected.read_text().splitlines() == records
    assert redirected.stat().st_ino == inode


def test_a_reader_that_stops_early_ends_predict_quietly(trained: Path) -> None:
    """`predict --output /dev/stdout | head` : the closed pipe is the reader's choice (exit 141,
    as every mxtrain command ends on a closed pipe), not an error message."""
    argv = [sys.executable, "-m", "mxtrain", "predict", "--checkpoint", "runs/rows"]
    argv += ["--input", "in.npy", "--output", "/dev/stdout"]
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first record
    try:
        proc = subprocess.run(
            argv,
            cwd=trained,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == 141, proc.stderr
    assert "error" not in proc.stderr.lower() and "Traceback" not in proc.stderr


def test_a_fifo_is_written_directly_without_force(trained: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "records.fifo"
    os.mkfifo(fifo)
    # A non-blocking reader opened first: predict's open for writing does not wait, and the
    # test cannot hang if predict fails before opening the FIFO.
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        code, output = predict(trained, fifo)
        assert code == 0, output
        records = os.read(reader, 1 << 16).decode().splitlines()
    finally:
        os.close(reader)
    assert len(records) == 5 and records[0].startswith('{"line": 1,')
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["records.fifo"]


def test_symlinked_output_replaces_its_target(trained: Path, tmp_path: Path) -> None:
    target = tmp_path / "target.jsonl"
    link = tmp_path / "latest.jsonl"
    link.symlink_to(target)  # dangling: the target is created
    code, output = predict(trained, link)
    assert code == 0, output
    assert link.is_symlink() and len(target.read_text().splitlines()) == 5
    code, output = predict(trained, link)  # the target exists now
    assert code == 2 and str(target) in output and "--force" in output
    target.write_text("old\n")
    code, output = predict(trained, link, "--force")
    assert code == 0, output
    assert link.is_symlink() and len(target.read_text().splitlines()) == 5


def test_unwritable_output_folder_is_named(trained: Path, tmp_path: Path) -> None:
    """These tests run as root, who may write anywhere the modes forbid; /proc refuses new
    files to everyone, and a file in the folder's path is no folder at all."""
    code, output = predict(trained, "/proc/predictions.jsonl")
    assert code == 3, output
    assert "creating files in /proc fails" in output and "Traceback" not in output
    (tmp_path / "plain.txt").write_text("x")
    code, output = predict(trained, tmp_path / "plain.txt" / "out.jsonl")
    assert code == 2, output
    assert "plain.txt" in output and "a file is in its path" in output
    assert "Traceback" not in output
    assert [p.name for p in tmp_path.iterdir()] == ["plain.txt"]


def test_a_write_that_fails_midway_keeps_the_old_file(trained: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_text("old\n")
    script = textwrap.dedent(
        f"""
        import errno, sys
        import mxtrain.inference.output as output_file
        real = output_file.write_atomically
        def full(path, write):
            def failing(handle):
                write(handle)
                raise OSError(errno.ENOSPC, "No space left on device")
            real(path, failing)
        output_file.write_atomically = full
        from mxtrain.cli.main import main
        sys.argv = ["mxtrain", "predict", "--checkpoint", {str(trained / "runs/rows")!r},
                    "--input", {str(trained / "in.npy")!r}, "--output", {str(out)!r}, "--force"]
        main()
        """
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 3, proc.stderr
    assert "No space left on device" in proc.stderr and "none was replaced" in proc.stderr
    assert out.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]
