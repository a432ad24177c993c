"""`mxtrain score` and `mxtrain predict` from a run folder alone, on one tiny trained run."""

from __future__ import annotations

import csv
import itertools
import json
import math
import os
import random
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import TINY_CONFIG, WORDS, write_corpus
from float_bounds import rescored_rel

from mxtrain.cli.main import cli
from mxtrain.cli.predict import predict_command
from mxtrain.cli.score import score_command
from mxtrain.config import load_config
from mxtrain.errors import ConfigError, DataError, RunFolderError
from mxtrain.fit.new_run import fit_experiment
from mxtrain.inference.predict import predict_run
from mxtrain.inference.score import score_checkpoint, score_run
from mxtrain.run.atomic import write_atomically
from mxtrain.run.choose import parse_checkpoint_ref
from mxtrain.run.folder import read_metrics


def test_commands_are_registered() -> None:
    assert cli.commands["score"] is score_command
    assert cli.commands["predict"] is predict_command


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny config fitted once (2 epochs); tests only read this run folder."""
    folder = tmp_path_factory.mktemp("scored")
    write_corpus(folder / "train.txt", 120, seed=1)
    write_corpus(folder / "valid.txt", 30, seed=2)
    config = folder / "tiny.yaml"
    config.write_text(textwrap.dedent(TINY_CONFIG.format(runs_dir=folder / "runs")))
    # a loss with a training-only output (raw outputs), whatever this machine measures fastest
    summary = fit_experiment(load_config(config, ["model.loss=softmax"]))
    return summary.run.path


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


def logged_eval(run: Path) -> dict[int, float]:
    records = read_metrics(run / "metrics.jsonl")
    return {r["epoch"]: r["eval"]["perplexity"] for r in records if r["event"] == "epoch"}


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def mixed_lines(seed: int = 7) -> list[str]:
    """Very different lengths (so buckets reorder them), blank lines, one longer than every
    training bucket (13), a one-word line."""
    rng = random.Random(seed)
    lengths = [12, 2, 0, 25, 7, 1, 11, 3, 0, 9, 2, 40, 5, 12, 4, 8, 1, 6]
    return [" ".join(rng.choice(WORDS) for _ in range(n)) for n in lengths]


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- score


def test_score_equals_the_eval_value_fit_logged(trained: Path) -> None:
    """The same weights and batches as fit's evaluation, through an inference-bound module
    (which may round differently: other_split_rel)."""
    logged = logged_eval(trained)
    assert sorted(logged) == [1, 2]
    for epoch, value in logged.items():
        assert score_run(f"{trained}:{epoch}")["perplexity"] == pytest.approx(
            value, rel=other_split_rel(trained, value)
        )
        assert score_run(trained, epoch=epoch)["perplexity"] == pytest.approx(
            value, rel=other_split_rel(trained, value)
        )
    # no epoch: the newest checkpoint
    assert score_run(trained)["perplexity"] == pytest.approx(
        logged[2], rel=other_split_rel(trained, logged[2])
    )


def other_split_rel(trained: Path, perplexity: float) -> float:
    """How far a perplexity scored again (another module, batch split or device count) may
    be from fit's: float_bounds.rescored_rel for the tiny LSTM (longest bucket 13)."""
    return rescored_rel(trained, perplexity, steps=13, batch=8, embed=8, hidden=12, layers=1)


def test_score_does_not_depend_on_batch_size_or_devices(trained: Path) -> None:
    logged = logged_eval(trained)[2]
    rel = other_split_rel(trained, logged)
    assert score_run(trained, batch_size=3)["perplexity"] == pytest.approx(logged, rel=rel)
    two = score_run(trained, batch_size=5, overrides=["context.count=2"])
    assert two["perplexity"] == pytest.approx(logged, rel=rel)


def test_score_max_batches_scores_a_prefix_and_says_so(trained: Path) -> None:
    full = logged_eval(trained)[2]
    code, out, err = invoke("score", trained, "--max-batches", "1000", "--json")
    assert code == 0, err
    record = json.loads(out)
    assert record["max_batches"] == 1000
    assert record["metrics"]["perplexity"] == pytest.approx(
        full, rel=other_split_rel(trained, full)
    )
    code, out, err = invoke("score", trained, "--max-batches", "1", "--batch-size", "2")
    assert code == 0, err
    assert "first 1 batches at most" in out and "first 1 batches at most" in err
    record = json.loads(out.strip().splitlines()[-1])
    assert record["max_batches"] == 1
    assert math.isfinite(record["metrics"]["perplexity"])
    assert record["metrics"]["perplexity"] != pytest.approx(full, rel=1e-3)
    code, out, err = invoke("score", trained, "--max-batches", "0")
    assert code == 2 and "--max-batches" in err and "Traceback" not in err
    assert json.loads(invoke("score", trained, "--json")[1])["max_batches"] is None


def test_score_with_a_data_file(
    trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    valid = trained.parent.parent / "valid.txt"
    same = score_run(trained, data=valid)
    logged = logged_eval(trained)[2]
    assert same["perplexity"] == pytest.approx(logged, rel=other_split_rel(trained, logged))
    other = write_corpus(tmp_path / "other.txt", 20, seed=11)
    monkeypatch.chdir(tmp_path)  # --data is relative to the current folder
    report = score_checkpoint(trained, data="other.txt")
    assert report.data == str(other)
    assert math.isfinite(report.metrics["perplexity"])
    assert report.metrics["perplexity"] != pytest.approx(same["perplexity"], rel=1e-3)


def test_score_cli_prints_a_table_and_a_json_line(trained: Path) -> None:
    code, out, err = invoke("score", f"{trained}:1")
    assert code == 0, err
    assert out.startswith(f"{trained} epoch 1 on ") and "metric" in out and "perplexity" in out
    record = json.loads(out.strip().splitlines()[-1])
    assert record["run"] == f"{trained}"
    assert record["epoch"] == 1
    assert record["data"].endswith("valid.txt")
    logged = logged_eval(trained)[1]
    assert record["metrics"]["perplexity"] == pytest.approx(
        logged, rel=other_split_rel(trained, logged)
    )

    code, out, err = invoke("score", trained, "--epoch", "2", "--batch-size", "4", "--json")
    assert code == 0, err
    lines = out.strip().splitlines()
    assert len(lines) == 1  # only the JSON, nothing else on stdout
    logged = logged_eval(trained)[2]  # scored in batches of 4 here, of 8 by fit
    assert json.loads(lines[0])["metrics"]["perplexity"] == pytest.approx(
        logged, rel=other_split_rel(trained, logged)
    )


# ----------------------------------------------------------------------------- predict


def test_predict_keeps_input_order_whole_lines_and_blank_lines(
    trained: Path, tmp_path: Path
) -> None:
    lines = mixed_lines()
    source = write_lines(tmp_path / "in.txt", lines)
    out = tmp_path / "out.jsonl"
    summary = predict_run(trained, source, out, top_k=4, batch_size=3)
    records = read_jsonl(out)
    assert [r["line"] for r in records] == list(range(1, len(lines) + 1))
    assert summary.lines == len(lines) and summary.empty == 2
    for line, record in zip(lines, records, strict=True):
        words = line.split()
        if not words:
            assert record == {
                "line": record["line"],
                "tokens": 0,
                "log_likelihood": None,
                "perplexity": None,
                "next": None,
            }
            continue
        # every word but the first is predicted, plus <eos>: the 40-word line was not split
        assert record["tokens"] == len(words)
        assert record["log_likelihood"] < 0
        assert record["perplexity"] == pytest.approx(
            math.exp(-record["log_likelihood"] / record["tokens"]), rel=1e-9
        )

    # Same sentences in reverse order, another batch size and two devices: each sentence gets
    # the same numbers, so records follow the input lines, not the batches.
    reverse = write_lines(tmp_path / "rev.txt", lines[::-1])
    out2 = tmp_path / "rev.jsonl"
    predict_run(trained, reverse, out2, top_k=4, overrides=["context.count=2"])
    for a, b in zip(records, read_jsonl(out2)[::-1], strict=True):
        assert a["tokens"] == b["tokens"]
        if a["log_likelihood"] is None:
            assert b["log_likelihood"] is None
            continue
        assert b["log_likelihood"] == pytest.approx(a["log_likelihood"], rel=1e-5)
        assert [t for t, _ in a["next"]] == [t for t, _ in b["next"]]


def test_next_is_the_distribution_after_the_whole_line(trained: Path, tmp_path: Path) -> None:
    vocab = json.loads((trained / "vocab.json").read_text())["tokens"]
    k = len(vocab) - 1  # every token but <pad>
    source = write_lines(tmp_path / "in.txt", ["red", "the cat sat on the", "dog ran far"])
    out = tmp_path / "out.jsonl"
    predict_run(trained, source, out, top_k=k)
    records = read_jsonl(out)
    for record in records:
        tokens = [t for t, _ in record["next"]]
        probs = [p for _, p in record["next"]]
        assert len(tokens) == k and len(set(tokens)) == k
        assert "<pad>" not in tokens and set(tokens) <= set(vocab)
        assert all(a >= b for a, b in itertools.pairwise(probs))  # most likely first
        assert all(0 < p <= 1 for p in probs) and sum(probs) <= 1 + 1e-5
    # A one-word line has one predicted token, <eos>, scored with exactly the "next"
    # distribution: so next's <eos> probability is exp(log_likelihood).
    one = records[0]
    assert one["tokens"] == 1
    eos = dict(map(tuple, one["next"]))["<eos>"]
    assert eos == pytest.approx(math.exp(one["log_likelihood"]), rel=1e-5)


def test_top_k_zero_has_no_next_and_a_too_large_k_is_refused(trained: Path, tmp_path: Path) -> None:
    source = write_lines(tmp_path / "in.txt", ["the cat", "a dog ran"])
    out = tmp_path / "out.jsonl"
    predict_run(trained, source, out)
    assert all("next" not in r for r in read_jsonl(out))
    vocab_size = len(json.loads((trained / "vocab.json").read_text())["tokens"])
    with pytest.raises(ConfigError, match="top-k"):
        predict_run(trained, source, tmp_path / "big.jsonl", top_k=vocab_size)
    assert not (tmp_path / "big.jsonl").exists()


def test_predicted_log_likelihood_adds_up_to_the_score(trained: Path, tmp_path: Path) -> None:
    valid = trained.parent.parent / "valid.txt"  # no line longer than the largest bucket
    out = tmp_path / "valid.jsonl"
    summary = predict_run(trained, valid, out)
    records = [r for r in read_jsonl(out) if r["log_likelihood"] is not None]
    total = sum(r["log_likelihood"] for r in records)
    tokens = sum(r["tokens"] for r in records)
    assert (summary.tokens, summary.log_likelihood) == (tokens, pytest.approx(total))
    perplexity = score_run(trained, data=valid)["perplexity"]
    assert total == pytest.approx(-math.log(perplexity) * tokens, rel=1e-5)
    assert summary.perplexity == pytest.approx(perplexity, rel=1e-5)


def test_csv_and_npy_hold_the_same_records(trained: Path, tmp_path: Path) -> None:
    lines = mixed_lines(seed=3)
    source = write_lines(tmp_path / "in.txt", lines)
    predict_run(trained, source, tmp_path / "p.jsonl", top_k=3)
    predict_run(trained, source, tmp_path / "p.csv", fmt="csv", top_k=3)
    predict_run(trained, source, tmp_path / "p.npy", fmt="npy", top_k=3)
    records = read_jsonl(tmp_path / "p.jsonl")

    with open(tmp_path / "p.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["line", "tokens", "log_likelihood", "perplexity", "next"]
    table = np.load(tmp_path / "p.npy", allow_pickle=False)
    assert table.shape == (len(lines),)
    assert table.dtype.names == (
        "line",
        "tokens",
        "log_likelihood",
        "perplexity",
        "next_id",
        "next_prob",
        "next_token",
    )
    for record, row, entry in zip(records, rows, table, strict=True):
        assert int(row["line"]) == int(entry["line"]) == record["line"]
        assert int(row["tokens"]) == int(entry["tokens"]) == record["tokens"]
        if record["log_likelihood"] is None:
            assert row["log_likelihood"] == row["perplexity"] == row["next"] == ""
            assert np.isnan(entry["log_likelihood"]) and np.isnan(entry["perplexity"])
            assert list(entry["next_id"]) == [-1, -1, -1]
            continue
        assert float(row["log_likelihood"]) == pytest.approx(record["log_likelihood"])
        assert float(row["perplexity"]) == pytest.approx(record["perplexity"])
        assert entry["log_likelihood"] == pytest.approx(record["log_likelihood"])
        pairs = [p.rsplit(":", 1) for p in row["next"].split(" ")]
        assert [t for t, _ in pairs] == [t for t, _ in record["next"]]
        assert [float(p) for _, p in pairs] == [p for _, p in record["next"]]
        assert list(entry["next_token"]) == [t for t, _ in record["next"]]
        assert np.allclose(entry["next_prob"], [p for _, p in record["next"]])


def test_a_moved_run_folder_is_enough(trained: Path, tmp_path: Path) -> None:
    """Copied elsewhere, with its original config folder gone: still scores and predicts."""
    moved = tmp_path / "elsewhere" / "tiny"
    shutil.copytree(trained, moved)
    status = json.loads((moved / "run.json").read_text())
    status["config_dir"] = str(tmp_path / "gone")
    (moved / "run.json").write_text(json.dumps(status))
    source = write_lines(tmp_path / "in.txt", ["the cat sat", "a dog ran far away"])
    predict_run(moved, source, tmp_path / "a.jsonl")
    predict_run(trained, source, tmp_path / "b.jsonl")
    assert read_jsonl(tmp_path / "a.jsonl") == read_jsonl(tmp_path / "b.jsonl")
    valid = trained.parent.parent / "valid.txt"
    assert score_run(moved, data=valid) == pytest.approx(score_run(trained, data=valid))
    with pytest.raises(DataError, match=r"valid\.txt"):  # data.eval is not in the folder
        score_run(moved)


def test_predict_cli_writes_atomically_and_never_overwrites(trained: Path, tmp_path: Path) -> None:
    source = write_lines(tmp_path / "in.txt", ["the cat sat", "", "a dog"])
    out = tmp_path / "out.csv"
    args = ["predict", "--checkpoint", f"{trained}:1", "--input", source, "--output", out]
    code, stdout, err = invoke(*args, "--format", "csv", "--top-k", "2")
    assert code == 0, err
    assert "wrote 3 records (1 blank lines)" in stdout
    first = out.read_text()
    assert first.startswith("line,tokens,log_likelihood,perplexity,next\n")

    code, _, err = invoke(*args, "--format", "csv")
    assert code == 2
    assert str(out) in err and "--force" in err and "Traceback" not in err
    assert out.read_text() == first

    code, _, err = invoke(*args, "--format", "csv", "--force")
    assert code == 0, err
    assert out.read_text() != first  # replaced (no next column now)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_failed_write_leaves_no_file_behind(tmp_path: Path) -> None:
    target = tmp_path / "out.jsonl"

    def crash(handle) -> None:
        handle.write(b'{"line": 1}\n')
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError):
        write_atomically(target, crash)
    assert list(tmp_path.iterdir()) == []
    target.write_text("old\n")
    with pytest.raises(RuntimeError):
        write_atomically(target, crash)
    assert target.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]


# ----------------------------------------------------------------------------- errors


def test_missing_run_folder_and_epoch_get_clear_messages(trained: Path) -> None:
    code, _, err = invoke("score", trained.parent / "nope")
    assert code == 5
    assert str(trained.parent / "nope") in err and "does not exist" in err
    assert "tiny" in err  # the run folders that do exist are listed
    code, _, err = invoke("score", f"{trained}:7")
    assert code == 5
    assert "epoch 7" in err and "model-0007.params" in err and "epochs 1, 2" in err
    code, _, err = invoke("score", trained, "--epoch", "1", "--json", "--set", "fit.prefetch=0")
    assert code == 0, err
    code, _, err = invoke("score", f"{trained}:2", "--epoch", "1")
    assert code == 2 and "--epoch" in err
    code, _, err = invoke("score", f"{trained}:last")
    assert code == 2 and "epoch number" in err


def test_missing_input_and_data_files(trained: Path, tmp_path: Path) -> None:
    missing = tmp_path / "missing.txt"
    code, _, err = invoke(
        "predict", "--checkpoint", trained, "--input", missing, "--output", tmp_path / "o.jsonl"
    )
    assert code == 3 and str(missing) in err
    assert not (tmp_path / "o.jsonl").exists()
    code, _, err = invoke("score", trained, "--data", missing)
    assert code == 3 and str(missing) in err


def test_target_is_refused_for_single_file_data(trained: Path, tmp_path: Path) -> None:
    text = write_lines(tmp_path / "a.txt", ["the cat sat"])
    code, _, err = invoke("score", trained, "--data", text, "--target", text)
    assert code == 2 and "--target applies to parallel" in err and "Traceback" not in err
    code, _, err = invoke("score", trained, "--target", text)
    assert code == 2 and "--target" in err and "Traceback" not in err


def test_incomplete_run_folders(trained: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty_run"
    empty.mkdir()
    with pytest.raises(RunFolderError, match=r"no config\.yaml"):
        score_run(empty)
    no_params = tmp_path / "no_params"
    no_params.mkdir()
    shutil.copy(trained / "config.yaml", no_params / "config.yaml")
    shutil.copy(trained / "run.json", no_params / "run.json")
    with pytest.raises(RunFolderError, match=r"no checkpoint.*model-NNNN\.params"):
        score_run(no_params)
    # a run folder without checkpoint folders (older runs) reads the top-level params file,
    # which has no checksum: a damaged one is still an error that names it
    broken = tmp_path / "broken"
    shutil.copytree(trained, broken)
    shutil.rmtree(broken / "checkpoints")
    params = broken / "model-0002.params"
    params.write_bytes(params.read_bytes()[:100])
    code, _, err = invoke("score", broken)
    assert code == 3 and str(params) in err and "Traceback" not in err
    with pytest.raises(DataError):
        score_run(broken)


def test_a_model_override_that_does_not_fit_the_checkpoint(trained: Path) -> None:
    code, _, err = invoke("score", trained, "--set", "model.num_hidden=7")
    assert code == 2
    assert "model.num_hidden=7" in err and "does not fit" in err


def test_parse_checkpoint_ref(tmp_path: Path) -> None:
    assert parse_checkpoint_ref("runs/x") == (Path("runs/x"), None)
    assert parse_checkpoint_ref("runs/x:3") == (Path("runs/x"), 3)
    odd = tmp_path / "a:b"
    odd.mkdir()
    assert parse_checkpoint_ref(str(odd)) == (odd, None)  # an existing path is taken whole
    assert parse_checkpoint_ref("runs/x:best") == (Path("runs/x"), "best")
    assert parse_checkpoint_ref("runs/x:latest") == (Path("runs/x"), "latest")
    assert parse_checkpoint_ref("runs/x:e0002-b000020") == (Path("runs/x"), "e0002-b000020")
    for wrong in ("runs/x:bestest", "runs/x:e2-b20", "runs/x:-1"):
        with pytest.raises(ConfigError, match="not an epoch number, 'best', 'latest'"):
            parse_checkpoint_ref(wrong)
    with pytest.raises(ConfigError):
        parse_checkpoint_ref("")


# ----------------------------------------------------------------------------- processes


def _subprocess(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=cwd,
    )


def _predict_args(trained: Path, tmp_path: Path) -> list[str]:
    source = write_lines(tmp_path / "in.txt", ["the cat sat", "", "dog " * 20])
    return ["predict", "--checkpoint", str(trained), "--input", str(source), "--output", "o.jsonl"]


def test_python_m_mxtrain_predict(trained: Path, tmp_path: Path) -> None:
    """`python -m mxtrain predict` in a real process: input order, whole long lines,
    no terminal escapes in a pipe, and no overwrite of an existing output."""
    argv = [sys.executable, "-m", "mxtrain", *_predict_args(trained, tmp_path)]
    proc = _subprocess(argv, tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    records = read_jsonl(tmp_path / "o.jsonl")
    assert [r["tokens"] for r in records] == [3, 0, 20]  # the 20-word line is whole
    assert "wrote 3 records" in proc.stdout and "\x1b[" not in proc.stdout
    again = _subprocess(argv, tmp_path)
    assert again.returncode == 2 and "already exists" in again.stderr


# ----------------------------------------------------------------------------- raw outputs


def test_raw_outputs_hold_every_position_in_input_order(trained: Path, tmp_path: Path) -> None:
    """--outputs raw: one padded row per line (blank ones marked unpredicted), each row the
    model's softmax at every input position; the position reading a line's last word is the
    distribution the records call "next"."""
    lines = mixed_lines()
    source = write_lines(tmp_path / "in.txt", lines)
    raw = tmp_path / "raw.npz"
    code, out, err = invoke(
        "predict", "--checkpoint", trained, "--input", source, "--output", raw,
        "--outputs", "raw", "--batch-size", "3",
    )  # fmt: skip
    assert code == 0, err
    assert f"wrote the raw outputs of {len(lines)} inputs (2 without a prediction)" in out
    vocab = json.loads((trained / "vocab.json").read_text())["tokens"]
    with np.load(raw) as archive:
        assert sorted(archive.files) == [
            "nll_output",  # the loss head's per-position negative log-likelihood
            "nll_output.shape",
            "predicted",
            "softmax_output",
            "softmax_output.shape",
        ]
        probs, shapes = archive["softmax_output"], archive["softmax_output.shape"]
        nll = archive["nll_output"]
        predicted = archive["predicted"]
    # the longest row: the 40-word line's own bucket
    assert probs.shape == (len(lines), shapes[:, 0].max(), len(vocab)) and probs.shape[1] >= 40
    assert predicted.tolist() == [bool(line.split()) for line in lines]
    records = tmp_path / "next.jsonl"
    predict_run(trained, source, records, top_k=len(vocab) - 1)
    for i, (line, record) in enumerate(zip(lines, read_jsonl(records), strict=True)):
        words = len(line.split())
        if not words:
            assert shapes[i].tolist() == [0, 0] and np.isnan(probs[i]).all()
            continue
        steps = shapes[i][0]
        assert steps >= words and shapes[i][1] == len(vocab)
        assert np.isnan(probs[i, steps:]).all() and not np.isnan(probs[i, :steps]).any()
        # the loss head's per-position values add up to the line's log-likelihood
        assert nll[i, :words].sum() == pytest.approx(-record["log_likelihood"], rel=1e-4)
        after_line = probs[i, words - 1]
        for token, p in record["next"]:
            assert after_line[vocab.index(token)] == pytest.approx(p, rel=1e-5)
    # reversed input on two devices: the same rows, by line
    reverse = write_lines(tmp_path / "rev.txt", lines[::-1])
    predict_run(trained, reverse, tmp_path / "rev.npz", outputs="raw", fmt="npz",
                overrides=["context.count=2"])  # fmt: skip
    with np.load(tmp_path / "rev.npz") as archive:
        again = archive["softmax_output"][::-1]
    np.testing.assert_allclose(again, probs, rtol=1e-5, atol=1e-7)


def test_raw_npy_needs_one_array_and_bad_requests_are_refused(
    trained: Path, tmp_path: Path
) -> None:
    source = write_lines(tmp_path / "in.txt", mixed_lines())
    out = tmp_path / "raw.npy"
    with pytest.raises(ConfigError, match="--format npz"):
        predict_run(trained, source, out, outputs="raw", fmt="npy")
    assert not out.exists()
    same = write_lines(tmp_path / "same.txt", ["the cat sat", "a dog ran", "red"])
    with pytest.raises(ConfigError, match=r"2 outputs .*--format npz"):
        predict_run(trained, same, out, outputs="raw", fmt="npy")
    assert not out.exists()
    for fmt, top_k, words in (("jsonl", 0, "--format jsonl cannot hold raw"), ("npz", 2, "top-k")):
        with pytest.raises(ConfigError, match=words):
            predict_run(trained, same, tmp_path / "x", outputs="raw", fmt=fmt, top_k=top_k)
    with pytest.raises(ConfigError, match="--format npz cannot hold records"):
        predict_run(trained, same, tmp_path / "x", fmt="npz")
