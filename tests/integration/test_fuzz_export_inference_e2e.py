"""Fuzz findings on export, score, predict and resume, end to end: numeric arguments, MXNet's
traceback text, edited bucket keys and an edited config.yaml each end in a one-paragraph
error with a documented exit code; nothing hangs, nothing saved is lost, and a failed export
leaves nothing behind."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from checkpoint_helpers import reseal
from click.testing import CliRunner
from conftest import TINY_CONFIG, write_corpus
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from mxtrain.cli.main import cli
from mxtrain.config import load_config
from mxtrain.fit.new_run import fit_experiment
from mxtrain.option_checks import MAX_SEQUENCE_LENGTH
from mxtrain.run.layout import STATE_FILE

REPO = Path(__file__).resolve().parents[2]


def invoke(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result.exit_code, result.output


def one_paragraph(output: str) -> str:
    """The error line of a refused command, checked to carry no traceback."""
    assert "Traceback" not in output and 'File "' not in output, output
    assert "internal error" not in output, output
    return output


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("fuzz_export")
    write_corpus(folder / "train.txt", 120, seed=1)
    write_corpus(folder / "valid.txt", 30, seed=2)
    (folder / "input.txt").write_text("the cat sat\na dog ran far away\n")
    config = folder / "tiny.yaml"
    config.write_text(textwrap.dedent(TINY_CONFIG.format(runs_dir=folder / "runs")))
    return fit_experiment(load_config(config)).run.path


def copy_run(trained: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    return run


def snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


# ----------------------------------------------------------------------------- C9: arguments


@pytest.mark.parametrize("value", ["0", "-1", "100000001", "abc", "5.5"])
def test_export_bucket_must_be_a_sensible_length(trained: Path, tmp_path: Path, value: str) -> None:
    out = tmp_path / "out"
    code, output = invoke("export", trained, "-o", out, f"--bucket={value}")
    assert code == 2 and "--bucket" in one_paragraph(output)
    assert not out.exists()


def _possible_length(value: object) -> bool:
    try:
        return 1 <= int(str(value)) <= MAX_SEQUENCE_LENGTH
    except ValueError:
        return False


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.integers(), st.text(max_size=12)))
def test_any_impossible_bucket_is_a_usage_error(trained: Path, value: object) -> None:
    """Whatever --bucket gets, unless it is a length from 1 to the bound: exit 2 naming it,
    before anything is read or written."""
    assume(not _possible_length(value))
    out = trained.parent / "never"
    code, output = invoke("export", trained, "-o", out, f"--bucket={value}")
    assert code == 2 and "--bucket" in one_paragraph(output), output
    assert not out.exists()


PREDICT = ["predict", "--checkpoint", "{run}", "--input", "{input}", "--output", "{out}"]


@pytest.mark.parametrize(
    ("flag", "args"),
    [
        ("--batch-size", ["score", "{run}", "--batch-size", "0"]),
        ("--batch-size", ["score", "{run}", "--batch-size", str(2**40)]),
        ("--max-batches", ["score", "{run}", "--max-batches", "0"]),
        ("--epoch", ["score", "{run}", "--epoch=-1"]),
        ("--batch-size", [*PREDICT, "--batch-size", "-3"]),
        ("--top-k", [*PREDICT, "--top-k=-1"]),
        ("--epoch", [*PREDICT, "--epoch=-2"]),
        ("--batch-size", ["export", "{run}", "-o", "{out}", "--batch-size", str(2**40)]),
    ],
)
def test_numeric_arguments_are_usage_errors(
    trained: Path, tmp_path: Path, flag: str, args: list[str]
) -> None:
    values = {"run": trained, "input": trained.parent.parent / "input.txt", "out": tmp_path / "o"}
    code, output = invoke(*[a.format(**values) for a in args])
    assert code == 2 and flag in one_paragraph(output), output
    assert not (tmp_path / "o").exists()


def test_a_batch_too_large_for_mxnet_is_a_usage_error(trained: Path, tmp_path: Path) -> None:
    code, output = invoke("export", trained, "-o", tmp_path / "o", "--batch-size", str(10**9))
    assert code == 2 and "--batch-size" in one_paragraph(output)
    assert not (tmp_path / "o").exists() and not list(tmp_path.glob(".o.tmp-*"))


# ----------------------------------------------------------------------------- C11: MXNet's words


def test_resume_with_another_model_size_names_the_parameter(trained: Path, tmp_path: Path) -> None:
    run = copy_run(trained, tmp_path)
    before = snapshot(run)
    code, output = invoke(
        "resume", run, "--set", "model.num_hidden=32", "--set", "fit.num_epoch=3", "--force"
    )
    one_paragraph(output)
    assert code == 2, output
    assert "parameter lstm_l0_i2h_weight has shape (48, 8) in the checkpoint" in output
    assert "needs (128, 8)" in output and "model.num_hidden=32" in output
    assert "Incompatible attr" not in output and "Check failed" not in output
    after = snapshot(run)
    assert {k: v for k, v in after.items() if k != "train.log"} == {
        k: v for k, v in before.items() if k != "train.log"
    }


def edit_bucket_keys(run: Path, keys: object) -> Path:
    folder = sorted((run / "checkpoints").glob("e*"))[-1]
    saved = json.loads((folder / STATE_FILE).read_text())
    saved["bucket_keys"] = keys
    reseal(folder, STATE_FILE, json.dumps(saved).encode())
    return folder / STATE_FILE


@pytest.mark.parametrize(
    "keys", [[5, 9, 13, 50_000_000], [5, 9, 14], [0], 13, "13", [[5, "x"]], {"a": 1}]
)
def test_edited_bucket_keys_are_refused_naming_state_json(
    trained: Path, tmp_path: Path, keys: object
) -> None:
    run = copy_run(trained, tmp_path)
    state = edit_bucket_keys(run, keys)
    code, output = invoke("score", run)
    assert code == 5 and str(state) in one_paragraph(output).replace("\n", ""), output
    code, output = invoke(
        "predict", "--checkpoint", run, "--input", trained.parent.parent / "input.txt",
        "--output", tmp_path / "p.jsonl",
    )  # fmt: skip
    assert code == 5 and "bucket_keys" in one_paragraph(output)
    assert not (tmp_path / "p.jsonl").exists()


def test_a_huge_bucket_key_does_not_hang_score_or_resume(trained: Path, tmp_path: Path) -> None:
    """Before the check, score unrolled 50,000,000 steps for minutes; a real process with a
    generous timeout (killed if it runs out) shows it no longer does."""
    run = copy_run(trained, tmp_path)
    edit_bucket_keys(run, [5, 9, 13, 50_000_000])
    before = snapshot(run)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    for argv in (["score", str(run)], ["resume", str(run), "--set", "fit.num_epoch=3"]):
        proc = subprocess.run(
            [sys.executable, "-m", "mxtrain", *argv],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert proc.returncode == 5, proc.stderr
        assert "state.json" in one_paragraph(proc.stderr)
    assert {k: v for k, v in snapshot(run).items() if k != "train.log"} == {
        k: v for k, v in before.items() if k != "train.log"
    }


def test_edited_model_inputs_are_refused_by_export(trained: Path, tmp_path: Path) -> None:
    run = copy_run(trained, tmp_path)
    record = json.loads((run / "model_inputs.json").read_text())
    record["buckets"] = [5, 9, 13, 60_000_000]
    (run / "model_inputs.json").write_text(json.dumps(record))
    code, output = invoke("export", run, "-o", tmp_path / "out", "--all-buckets")
    assert code == 5 and "model_inputs.json" in one_paragraph(output)
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- C14: edited config


def test_export_verifies_the_checkpoint_as_score_does(trained: Path, tmp_path: Path) -> None:
    run = copy_run(trained, tmp_path)
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("num_hidden: 12", "num_hidden: 20"))
    code, scored = invoke("score", run)
    assert code == 3 and "does not fit the model built from" in one_paragraph(scored)
    out = tmp_path / "out"
    code, exported = invoke("export", run, "-o", out)
    assert code == 3 and "does not fit the model built from" in one_paragraph(exported)
    assert "pred_weight has shape (19, 12) in the checkpoint" in exported
    assert not out.exists() and not list(tmp_path.glob(".out.tmp-*"))
    # a folder given with --force keeps what it held
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, _ = invoke("export", run, "-o", out, "--force")
    assert code == 3 and [p.name for p in out.iterdir()] == ["keep.txt"]


def test_a_complete_export_leaves_no_staging_folder(trained: Path, tmp_path: Path) -> None:
    out = tmp_path / "nested" / "out"
    code, output = invoke("export", trained, "-o", out, "--bucket", "7", "--bucket", "9")
    assert code == 0, output
    names = sorted(p.name for p in out.iterdir())
    assert "export.json" in names and "model-bucket7-symbol.json" in names
    assert [p.name for p in out.parent.iterdir()] == ["out"]
    (out / "keep.txt").write_text("mine")
    code, output = invoke("export", trained, "-o", out, "--force")
    assert code == 0 and (out / "keep.txt").read_text() == "mine"
    assert "model-bucket13-0000.params" in {p.name for p in out.iterdir()}
