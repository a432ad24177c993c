"""Files that are not regular files, unreadable files and damaged run-folder files (fuzz
classes C5, C6, C7, C15): every reader refuses them with a clear error, nothing hangs.

A reader that regressed would block forever on a FIFO or read /dev/zero until memory runs out,
so every read of such a file happens in a child process bounded by a timeout (and an address
space limit), which ``subprocess.run`` kills when it expires.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mxtrain.data import arrays
from mxtrain.data.text_files import read_data_text
from mxtrain.errors import ConfigError, DataError, RunFolderError
from mxtrain.run.folder import RunFolder, read_metrics
from mxtrain.user_files import (
    UnusableFile,
    entry_problem,
    make_folder,
    open_regular,
    os_error_problem,
    read_file,
    require_usable_path,
)

LONG = "x" * 300  # one name longer than any usual file system allows (255 bytes)

# Each reader of a user-named or run-folder file, called on the path P in a child process.
READERS = {
    "config": "from mxtrain.config import load_config; load_config(P)",
    "saved config": "from mxtrain.config.saved import read_config_tree; read_config_tree(P)",
    "text data": "from mxtrain.data.text_files import read_data_text\n"
    "read_data_text(P, str(P), expected='a text file')",
    "vocab": "from mxtrain.data.vocab import Vocab; Vocab.load(P)",
    "label vocab": "from mxtrain.data.label_vocab import LabelVocab; LabelVocab.load(P)",
    "row meta": "from mxtrain.data.arrays import RowMeta; RowMeta.load(P)",
    "npy": "from mxtrain.data.arrays import _load_npy; _load_npy(P, 'data file')",
    "csv": "from mxtrain.data.arrays import _read_csv\n"
    "_read_csv(P, delimiter=',', label_column='y', feature_columns=None, need_label=True, "
    "max_rows=None)",
    "libsvm": "from mxtrain.data.libsvm import read_libsvm\n"
    "read_libsvm(P, zero_based=False, need_label=True)",
    "params": "from mxtrain.run.params import read_params; read_params(P)",
    "metrics": "from mxtrain.run.folder import read_metrics; read_metrics(P)",
    "hosts": "from mxtrain.launch import read_hosts; read_hosts(P)",
    "plugin": "from mxtrain.registry import Registry; Registry('model').get(f'{P}:build')",
}

CHILD = """\
import json, sys
from pathlib import Path
from mxtrain.errors import MxtrainError
from mxtrain.run.params import ParamsFileError
P = Path(sys.argv[1])
out = {}
for name, code in json.loads(sys.argv[2]).items():
    try:
        exec(code, {"P": P})
        out[name] = ["read", ""]
    except MxtrainError as exc:
        out[name] = [type(exc).__name__, str(exc)]
    except ParamsFileError as exc:
        out[name] = ["ParamsFileError", exc.problem]
    except BaseException as exc:
        out[name] = ["escaped " + type(exc).__name__, str(exc)]
print(json.dumps(out))
"""


def _limit_memory() -> None:  # in the child: a regressed endless read fails fast
    resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))


def read_in_child(path: Path, readers: dict[str, str]) -> dict[str, list[str]]:
    """What each reader makes of ``path``, in a child killed after a generous timeout."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), json.dumps(readers)],
        capture_output=True,
        text=True,
        timeout=240,
        preexec_fn=_limit_memory,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def make_special(tmp_path: Path, kind: str) -> Path:
    """``special.py`` in tmp_path (a name the plugin loader accepts too) as ``kind``."""
    path = tmp_path / "special.py"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:
        path.symlink_to(kind)  # /dev/zero, /dev/urandom: through a link, as users do
    return path


@pytest.mark.parametrize(
    ("kind", "phrase"),
    [
        ("fifo", "is a named pipe (FIFO), not a regular file"),
        ("/dev/zero", "is a character device, not a regular file"),
        ("/dev/urandom", "is a character device, not a regular file"),
        ("folder", "is a directory, not a file"),
    ],
)
def test_every_reader_refuses_what_is_not_a_regular_file(
    tmp_path: Path, kind: str, phrase: str
) -> None:
    path = make_special(tmp_path, kind)
    outcomes = read_in_child(path, READERS)
    for reader, (error, message) in outcomes.items():
        assert error in ("ConfigError", "DataError", "RunFolderError", "ParamsFileError"), (
            reader,
            error,
            message,
        )
        assert phrase in message, (reader, message)
    assert outcomes["config"][0] == "ConfigError" and outcomes["text data"][0] == "DataError"
    assert outcomes["metrics"][0] == "RunFolderError"


def test_a_fifo_writer_is_never_disturbed(tmp_path: Path) -> None:
    """The type is checked with stat before anything opens the FIFO: a writer waiting on it
    keeps waiting (were the FIFO opened, its open would return and the write fail)."""
    path = make_special(tmp_path, "fifo")
    writer = subprocess.Popen(
        [sys.executable, "-c", f"open({str(path)!r}, 'w').write('x')"],
        stderr=subprocess.PIPE,
    )
    try:
        read_in_child(path, {"config": READERS["config"]})
        assert writer.poll() is None  # still blocked in its open
    finally:
        writer.kill()
        writer.wait(timeout=60)


# ----------------------------------------------------------------- OSErrors said as they are


def _deny(monkeypatch: pytest.MonkeyPatch, target: Path) -> None:
    """Opening ``target`` fails as for a non-root user on a mode-000 file (tests run as root)."""
    real_open = os.open

    def guarded(path: object, flags: int, *args: object, **kwargs: object) -> int:
        if os.fspath(path) == os.fspath(target):  # type: ignore[arg-type]
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(target))
        return real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", guarded)


def test_unreadable_npy_is_a_permission_error_not_a_bad_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "x.npy"
    np.save(path, np.zeros((3, 2), dtype=np.float32))
    _deny(monkeypatch, path)
    with pytest.raises(DataError, match="permission denied") as info:
        arrays._load_npy(path, "data file")
    assert "not a NumPy file" not in str(info.value)


def test_an_oserror_from_numpy_is_reported_as_what_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The root fix: the error of the load itself (not only the check before it)."""
    path = tmp_path / "x.npy"
    np.save(path, np.zeros((3, 2), dtype=np.float32))

    def unreadable(*args: object, **kwargs: object) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(np, "load", unreadable)
    with pytest.raises(DataError, match=r"x\.npy cannot be opened: permission denied"):
        arrays._load_npy(path, "data file")


@pytest.mark.parametrize(
    "read",
    [
        lambda p: read_data_text(p, str(p), expected="a text file"),
        lambda p: read_file(p, "config file", error=ConfigError),
        lambda p: arrays.RowMeta.load(p),
    ],
    ids=["text data", "config", "row meta"],
)
def test_unreadable_files_say_permission_denied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read: object
) -> None:
    path = tmp_path / "f.txt"
    path.write_text("a b c\n")
    _deny(monkeypatch, path)
    with pytest.raises((DataError, ConfigError), match="permission denied"):
        read(path)  # type: ignore[operator]


@pytest.mark.parametrize(
    ("code", "phrase"),
    [
        (errno.ENAMETOOLONG, "has a name longer than the file system allows"),
        (errno.EACCES, "permission denied"),
        (errno.ENOENT, "does not exist"),
        (errno.EISDIR, "is a directory"),
        (errno.ELOOP, "is a loop of symbolic links"),
        (errno.EIO, "cannot be used: Input/output error"),
    ],
)
def test_os_errors_are_named(code: int, phrase: str) -> None:
    problem, _ = os_error_problem(OSError(code, os.strerror(code), "x"))
    assert phrase in problem


def test_a_name_too_long_is_said(tmp_path: Path) -> None:
    with pytest.raises(UnusableFile, match="longer than the file system allows"):
        open_regular(tmp_path / LONG)


# ------------------------------------------------------------------ run-folder files (C7)


@pytest.mark.parametrize(
    ("entry", "make", "phrase"),
    [
        ("checkpoints", "file", "is a file, not a folder"),
        ("checkpoints/best", "folder", "is a directory, not a file"),
        ("train.log", "folder", "is a directory, not a file"),
        ("run.json", "fifo", "is a named pipe"),
        ("metrics.jsonl", "device", "is a character device"),
        ("model_inputs.json", "folder", "is a directory, not a file"),
    ],
)
def test_run_folder_entries_of_the_wrong_type(
    tmp_path: Path, entry: str, make: str, phrase: str
) -> None:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("x: 1\n")
    target = run / entry
    if target.is_dir():
        target.rmdir()
    if make == "file":
        target.write_text("hi\n")
    elif make == "folder":
        target.mkdir()
    elif make == "fifo":
        os.mkfifo(target)
    else:
        target.symlink_to("/dev/zero")
    with pytest.raises(RunFolderError, match=phrase) as info:
        RunFolder(run).check_entries()
    assert str(target) in str(info.value) and info.value.exit_code == 5
    assert target.exists() or target.is_symlink()  # nothing was deleted


def test_entry_problem_ignores_what_does_not_exist(tmp_path: Path) -> None:
    assert entry_problem(tmp_path / "missing") is None
    assert entry_problem(tmp_path / "missing" / "below") is None
    (tmp_path / "file").write_text("x")
    assert entry_problem(tmp_path / "file" / "below") is None
    assert entry_problem(tmp_path, folder=True) is None


def test_metrics_with_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    good = json.dumps({"event": "epoch", "epoch": 1}) + "\n"
    path.write_bytes(good.encode() + b'{"event": "\xff"}\n' + good.encode())
    with pytest.raises(RunFolderError, match=r"metrics.jsonl:2: not UTF-8 text"):
        read_metrics(path)
    # a torn last line (a crash mid-write) is skipped, whatever its bytes
    path.write_bytes(good.encode() + b'{"event": "\xe2\x82')
    assert read_metrics(path) == [{"event": "epoch", "epoch": 1}]


def test_model_inputs_that_are_not_utf8_json(tmp_path: Path) -> None:
    from mxtrain.run.bucket_keys import read_model_inputs

    run = RunFolder(tmp_path)
    run.model_inputs_file.write_bytes(b"\xff\xfe{}")
    with pytest.raises(RunFolderError, match=r"model_inputs\.json is not UTF-8 JSON"):
        read_model_inputs(run)
    run.model_inputs_file.write_text("[1, 2]")
    with pytest.raises(RunFolderError, match="expected the record `mxtrain fit` writes"):
        read_model_inputs(run)
    run.model_inputs_file.unlink()
    run.model_inputs_file.mkdir()
    with pytest.raises(RunFolderError, match="is a directory, not a file"):
        read_model_inputs(run)


def test_best_marker_that_is_not_a_file_is_no_best(tmp_path: Path) -> None:
    from mxtrain.run.checkpoint import best_tag

    run = RunFolder(tmp_path)
    run.best_file.mkdir(parents=True)
    assert best_tag(run) is None
    assert run.best_file.is_dir()  # left as it was


def test_config_too_large_is_still_refused_after_a_bounded_read(tmp_path: Path) -> None:
    from mxtrain.config import MAX_CONFIG_BYTES, load_config

    path = tmp_path / "big.yaml"
    path.write_text(textwrap.dedent("# x\n") * (MAX_CONFIG_BYTES // 4 + 10))
    with pytest.raises(ConfigError, match="too large for a config file"):
        load_config(path)


# ------------------------------------------- C8/C10: paths too long, folders not creatable


def test_usable_path_names_what_cannot_be_looked_up(tmp_path: Path) -> None:
    require_usable_path(tmp_path / "missing" / "deeper", "run folder")  # missing: passes
    with pytest.raises(RunFolderError, match="longer than the file system allows") as info:
        require_usable_path(tmp_path / LONG, "run folder", error=RunFolderError)
    assert info.value.exit_code == 5 and LONG in str(info.value)


def test_run_references_too_long_are_run_folder_errors(tmp_path: Path) -> None:
    from mxtrain.run.choose import parse_checkpoint_ref
    from mxtrain.run.history import resolve_run
    from mxtrain.run.plugin_files import run_folder_of

    for text in (f"{tmp_path}/{LONG}", f"{tmp_path}/{LONG}:3"):
        with pytest.raises(RunFolderError, match="longer than the file system allows"):
            parse_checkpoint_ref(text)
        assert run_folder_of(text) is None  # the command's own check says why
    with pytest.raises(RunFolderError, match="longer than the file system allows"):
        resolve_run(f"{tmp_path}/{LONG}")


def test_folders_that_cannot_be_created(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="cannot be created: a file stands where"):
        make_folder(blocker / "below", "export folder", error=ConfigError, hint="Choose -o.")
    with pytest.raises(ConfigError, match="cannot be created"):
        make_folder(tmp_path / LONG / "x", "export folder", error=ConfigError, hint="")
    if Path("/proc/self").is_dir():
        with pytest.raises(ConfigError, match="/proc/mxtrain-x cannot be created"):
            make_folder(Path("/proc/mxtrain-x"), "export folder", error=ConfigError, hint="")
    make_folder(tmp_path / "a" / "b", "export folder", error=ConfigError, hint="")
    assert (tmp_path / "a" / "b").is_dir()


# ------------------------------------------ property: any bytes in a run folder's files


RUN_FOLDER_BYTES = st.one_of(
    st.binary(max_size=300),
    st.lists(
        st.sampled_from(
            [b'{"event": "epoch", "epoch": 1}', b"\xff\xfe", b"\xe2\x82", b"{", b"[]", b"null"]
        ),
        max_size=6,
    ).map(b"\n".join),
)


@settings(derandomize=True, deadline=None, database=None, max_examples=300)
@given(metrics=RUN_FOLDER_BYTES, inputs=RUN_FOLDER_BYTES, best=RUN_FOLDER_BYTES)
def test_any_bytes_in_run_folder_files_are_read_or_refused_cleanly(
    tmp_path_factory: pytest.TempPathFactory, metrics: bytes, inputs: bytes, best: bytes
) -> None:
    """Whatever bytes metrics.jsonl, model_inputs.json and checkpoints/best hold, their readers
    return or raise RunFolderError (never another exception), and change nothing."""
    from mxtrain.run.bucket_keys import read_model_inputs
    from mxtrain.run.checkpoint import best_tag

    run = RunFolder(tmp_path_factory.mktemp("run"))
    run.checkpoints_dir.mkdir()
    run.metrics_file.write_bytes(metrics)
    run.model_inputs_file.write_bytes(inputs)
    run.best_file.write_bytes(best)
    run.check_entries()
    for read in (read_metrics, lambda _: read_model_inputs(run), lambda _: best_tag(run)):
        try:
            read(run.metrics_file)
        except RunFolderError as exc:
            assert exc.exit_code == 5 and str(run.path) in str(exc)
    assert run.metrics_file.read_bytes() == metrics
    assert run.model_inputs_file.read_bytes() == inputs
    assert run.best_file.read_bytes() == best
