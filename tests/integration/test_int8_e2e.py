"""--int8 through the CLI on a stateful LSTM language model: score and predict in int8,
the calibration measured once per checkpoint and kept in the run folder, and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import small_stream_lm

from mxtrain.cli.main import cli
from mxtrain.engine.quantization import int8_available

pytestmark = pytest.mark.skipif(not int8_available(), reason="MXNet without oneDNN")


def invoke(*args: object) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


def last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("int8")
    config = small_stream_lm(folder, "lm", "cell: fused, tie_weights: true")
    code, out, err = invoke("fit", config, "--progress", "quiet")
    assert code == 0, out + err
    return folder / "runs" / "lm"


def test_score_in_int8_calibrates_once_and_keeps_the_ranges(lm_run: Path) -> None:
    code, out, err = invoke("score", lm_run, "--json")
    assert code == 0, out + err
    fp32 = last_json(out)
    assert "int8" not in fp32

    code, out, err = invoke("score", lm_run, "--json", "--int8", "--calibration-batches", "5")
    assert code == 0, out + err
    first = last_json(out)
    report = first["int8"]
    assert report["operators"] == ["RNN lstm", "FullyConnected pred"]
    assert report["calibration_batches"] == 5 and not report["calibration_reused"]
    kept = Path(report["calibration_file"])
    assert kept.parent == lm_run / "int8" and kept.name == f"{fp32['checkpoint']}.json"
    record = json.loads(kept.read_text())
    assert record["calibration_data"] == "data.train" and record["ranges"]
    # the unit tests bound each layer's error; the perplexity of the whole model stays close
    assert first["metrics"]["perplexity"] == pytest.approx(fp32["metrics"]["perplexity"], rel=0.05)

    code, out, err = invoke("score", lm_run, "--json", "--int8", "--calibration-batches", "5")
    assert code == 0, out + err
    again = last_json(out)
    assert again["int8"]["calibration_reused"]
    assert again["metrics"] == first["metrics"]  # the same ranges, the same numbers

    # another sample size measures again (and keeps that one)
    code, out, err = invoke("score", lm_run, "--json", "--int8", "--calibration-batches", "3")
    assert code == 0, out + err
    assert not last_json(out)["int8"]["calibration_reused"]
    assert json.loads(kept.read_text())["calibration_batches"] == 3


def test_a_different_checkpoint_gets_its_own_ranges(lm_run: Path) -> None:
    code, out, err = invoke("score", f"{lm_run}:1", "--json", "--int8")
    assert code == 0, out + err
    report = last_json(out)["int8"]
    assert report["calibration_file"].endswith("e0001-b000000.json")
    assert report["calibration_batches"] == 20


def test_predict_in_int8_with_calibration_data(lm_run: Path, tmp_path: Path) -> None:
    inputs = tmp_path / "in.txt"
    inputs.write_text("the cat sat\n\nthe dog ran on the mat\n")
    calibration = lm_run.parent.parent / "valid.txt"
    out_file = tmp_path / "out.jsonl"
    code, out, err = invoke(
        "predict", "--checkpoint", lm_run, "--input", inputs, "--output", out_file,
        "--top-k", "2", "--int8", "--calibration-data", calibration,
    )  # fmt: skip
    assert code == 0, out + err
    records = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert [r["line"] for r in records] == [1, 2, 3]
    assert records[1]["tokens"] == 0 and records[0]["tokens"] == 3
    assert len(records[2]["next"]) == 2
    kept = next((lm_run / "int8").glob("*.json"))
    assert any(
        json.loads(f.read_text())["calibration_data"] == str(calibration)
        for f in (lm_run / "int8").glob("*.json")
    ), kept


def test_bad_int8_requests_are_clear_errors(lm_run: Path, tmp_path: Path) -> None:
    code, out, err = invoke("score", lm_run, "--calibration-batches", "5")
    assert code == 2 and "--calibration-batches applies only with --int8" in out + err
    code, out, err = invoke("score", lm_run, "--int8", "--calibration-batches", "0")
    assert code == 2 and "--calibration-batches" in out + err
    missing = tmp_path / "nope.txt"
    code, out, err = invoke("score", lm_run, "--int8", "--calibration-data", missing)
    assert code == 3 and str(missing) in out + err
    code, out, err = invoke("score", lm_run, "--int8", "--set", "context.devices=gpu")
    # a GPU build refuses --int8 there; a CPU-only build refuses the GPU first
    assert code == 2 and ("--int8 runs on CPUs" in out + err or "CPU-only build" in out + err)
    for text in (out, err):
        assert "Traceback" not in text


def test_kept_ranges_that_miss_a_layer_are_measured_again(lm_run: Path) -> None:
    scoring = ("score", f"{lm_run}:2", "--json", "--int8", "--calibration-batches", "4")
    code, out, err = invoke(*scoring)
    assert code == 0, out + err
    kept = Path(last_json(out)["int8"]["calibration_file"])
    record = json.loads(kept.read_text())
    complete = dict(record["ranges"])
    record["ranges"].pop(sorted(complete)[0])  # as if kept for a graph without that layer
    kept.write_text(json.dumps(record))
    code, out, err = invoke(*scoring)
    assert code == 0, out + err
    assert not last_json(out)["int8"]["calibration_reused"]
    assert json.loads(kept.read_text())["ranges"] == complete
