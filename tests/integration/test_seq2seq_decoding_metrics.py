"""End-to-end: decoding metrics (bleu, wer, ...) in fit's evaluations and in `mxtrain score`.

The toy task of test_seq2seq_e2e (the target is the source reversed) is fitted with
eval_metrics [perplexity, bleu, wer] and best_metric wer: the eval records carry the decoded
metrics every epoch, score reproduces them exactly, a source with two targets counts as right
when its output matches either, and a mid-epoch stop resumes bit-identically with decoding on.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import params
from test_seq2seq_e2e import SHRINK, fit_template, invoke, write_pairs

from mxtrain.run.folder import read_metrics

SETTINGS = [
    *SHRINK,
    "fit.num_epoch=2",
    "fit.eval_metrics=[perplexity, bleu, wer]",
    "fit.decode_eval.beam_size=2",
    "fit.decode_eval.max_sentences=30",
    "checkpoint.best_metric=wer",
]


def fit(workdir: Path, runs: Path, *more: str) -> Path:
    return fit_template(workdir, runs, *SETTINGS, *more)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("decoding_metrics")
    (root / "data").mkdir()
    write_pairs(root / "data", "train", 300, seed=1)
    write_pairs(root / "data", "dev", 40, seed=2)
    code, out, err = invoke("init", "--template", "seq2seq", "-o", root / "s2s.yaml")
    assert code == 0, out + err
    return root


@pytest.fixture(scope="module")
def straight_run(workdir: Path) -> Path:
    """Two epochs straight with decoding metrics; tests only read it."""
    return fit(workdir, workdir / "runs")


def evals(run: Path) -> list[dict]:
    return [r["eval"] for r in read_metrics(run / "metrics.jsonl") if r["event"] == "epoch"]


def score_json(*args: object) -> dict:
    code, out, err = invoke("score", *args, "--json")
    assert code == 0, err
    return json.loads(out)


def test_eval_records_carry_decoding_metrics_and_the_best_is_by_wer(straight_run: Path) -> None:
    records = evals(straight_run)
    assert len(records) == 2
    for record in records:
        assert set(record) == {"perplexity", "bleu", "wer"}
        assert 0.0 <= record["bleu"] <= 100.0 and 0.0 <= record["wer"] <= 100.0
        # 30 distinct sources: a WER is a whole number of them
        assert record["wer"] * 30 / 100 == pytest.approx(round(record["wer"] * 30 / 100))
    best = 1 if records[0]["wer"] <= records[1]["wer"] else 2  # a tie keeps the first
    tag = (straight_run / "checkpoints" / "best").read_text().strip()
    assert tag == f"e{best:04d}-b000000"


def test_score_on_data_eval_reproduces_the_logged_decoding_metrics(straight_run: Path) -> None:
    for epoch, logged in enumerate(evals(straight_run), start=1):
        report = score_json(f"{straight_run}:{epoch}")
        assert report["decoding"] == {"beam_size": 2, "length_penalty": 1.0, "sources": 30}
        # the same sources, beam, parameters and batches: the same outputs, the same numbers
        assert report["metrics"]["bleu"] == logged["bleu"]
        assert report["metrics"]["wer"] == logged["wer"]
        assert report["metrics"]["perplexity"] == pytest.approx(logged["perplexity"], rel=1e-6)
    more = score_json(straight_run, "--metrics", "chrf,per", "--beam-size", "1")
    assert list(more["metrics"]) == ["perplexity", "bleu", "wer", "chrf", "per"]
    assert all(0.0 <= more["metrics"][n] <= 100.0 for n in ("bleu", "wer", "chrf", "per"))


def test_a_source_with_two_targets_is_right_when_it_matches_either(
    workdir: Path, straight_run: Path
) -> None:
    from mxtrain.inference.open import open_run
    from mxtrain.inference.score import decoding_evaluation

    folder = workdir / "two_targets"
    folder.mkdir()
    src = folder / "test.src"
    src.write_text("a b c\n")
    (folder / "one.tgt").write_text("x\n")
    opened = open_run(straight_run, data=src, target=folder / "one.tgt")
    evaluation = decoding_evaluation(opened, ["wer"], 3, on_eval_data=False)
    (output,) = evaluation.outputs(*opened.params())
    assert output and output != "x"
    src.write_text("a b c\na b c\na  b c\n")  # three lines, one source as the iterator reads it
    cases = {
        "hit.tgt": (f"x\n{output}\nx\n", 0.0),
        "hit_first.tgt": (f"{output}\ng g\nx\n", 0.0),
        "miss.tgt": ("x\ng g\nx\n", 100.0),
    }
    for name, (text, wer) in cases.items():
        (folder / name).write_text(text)
        report = score_json(
            straight_run, "--data", src, "--target", folder / name, "--metrics", "wer,per",
            "--beam-size", "3",
        )  # fmt: skip
        assert report["decoding"] == {"beam_size": 3, "length_penalty": 1.0, "sources": 1}
        assert report["metrics"]["wer"] == wer, name
        if wer == 0.0:
            assert report["metrics"]["per"] == 0.0


def test_resume_from_a_mid_epoch_stop_is_exact_with_decoding_metrics(
    workdir: Path, straight_run: Path
) -> None:
    run = fit(workdir, workdir / "stopped_runs", "fit.max_updates=7")
    code, out, err = invoke("resume", run, "--set", "fit.max_updates=null", "--progress", "quiet")
    assert code == 0, out + err
    straight, resumed = params(straight_run, 2), params(run, 2)
    assert sorted(straight) == sorted(resumed)
    for name, value in straight.items():
        assert np.array_equal(value, resumed[name]), name
    assert evals(run) == evals(straight_run)


def test_only_decoding_metrics_mid_epoch_evaluations_and_early_stopping_on_wer(
    workdir: Path,
) -> None:
    run = fit(
        workdir, workdir / "wer_runs", "fit.eval_metrics=[wer]", "checkpoint.best_metric=null",
        "fit.eval_interval=8", "fit.early_stopping.metric=wer", "fit.early_stopping.patience=1",
        "fit.num_epoch=6",
    )  # fmt: skip
    records = read_metrics(run / "metrics.jsonl")
    mid = [r["eval"] for r in records if r["event"] == "eval"]
    assert mid and all(set(values) == {"wer"} for values in mid)  # no device metric at all
    assert all(set(values) == {"wer"} for values in evals(run))
    # patience 1: training ends at the first evaluation that does not improve on the best
    wers = [values["wer"] for values in mid]
    stop = next(i for i in range(1, len(wers)) if wers[i] >= min(wers[:i]))
    assert len(wers) == stop + 1
    status = json.loads((run / "run.json").read_text())
    assert status.get("stop_reason") == "early_stopping"


def test_decoding_metric_errors_are_clear(workdir: Path, straight_run: Path, tiny_config) -> None:
    code, out, err = invoke("score", straight_run, "--metrics", "bleux")
    assert code != 0 and "bleux" in err and "bleu, chrf, wer, per" in err
    assert "Traceback" not in err
    code, out, err = invoke("fit", tiny_config, "--progress", "quiet")
    assert code == 0, out + err
    lm_run = tiny_config.parent / "runs" / "tiny"
    code, out, err = invoke("score", lm_run, "--metrics", "bleu")
    assert code != 0 and "--metrics bleu" in err and "lstm_lm" in err
    assert "Traceback" not in err
    code, out, err = invoke("score", lm_run, "--beam-size", "3")
    assert code != 0 and "--beam-size 3" in err and "Traceback" not in err


def results_script(workdir: Path, run: Path, tmp_path: Path, *more: str) -> tuple[dict, str, Path]:
    """scripts/results.py on ``run`` as g2p_cmudict, its test split being the dev files: the
    row in RESULTS.json, RESULTS.md's text and the split's folder."""
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[2] / "scripts" / "results.py"
    test_data = tmp_path / "split"
    test_data.mkdir()
    for side in ("src", "tgt"):
        (test_data / f"test.{side}").write_text((workdir / "data" / f"dev.{side}").read_text())
    output = tmp_path / "RESULTS.md"
    proc = subprocess.run(
        [sys.executable, str(script), "--runs", str(tmp_path / "none"), "--output", str(output),
         "--drop-missing", "--run", f"g2p_cmudict={run}", "--g2p-data", str(test_data), *more],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    row = json.loads(output.with_suffix(".json").read_text())["g2p_cmudict"]
    return row, output.read_text(), test_data


def test_results_script_reports_a_g2p_run_by_wer_and_scores_its_test_split(
    workdir: Path, straight_run: Path, tmp_path: Path
) -> None:
    """scripts/results.py's G2P section: the best dev WER as fit logged it, test WER and PER
    from `mxtrain score RUN:best --data test.src --target test.tgt` at beam 5."""
    row, text, test_data = results_script(workdir, straight_run, tmp_path)
    logged = [r["wer"] for r in evals(straight_run)]
    assert row["valid"] == min(logged) and row["epochs"] == 2
    source, target = test_data / "test.src", test_data / "test.tgt"
    report = score_json(
        f"{straight_run}:best", "--data", source, "--target", target, "--metrics", "wer,per",
        "--beam-size", 5,
    )  # fmt: skip
    assert row["test_wer"] == report["metrics"]["wer"]
    assert row["test_per"] == report["metrics"]["per"]
    assert "## Grapheme-to-phoneme conversion" in text and "Bisani & Ney 2008" in text
    assert f"| {row['test_wer']:,.1f} / {row['test_per']:,.1f} | 5 |" in text
    assert "Our split is not theirs" in text


def test_score_and_predict_decode_with_an_ensemble(
    workdir: Path, straight_run: Path, tmp_path: Path
) -> None:
    source, target = workdir / "data" / "dev.src", workdir / "data" / "dev.tgt"
    asked = ("--data", source, "--target", target, "--metrics", "wer,per", "--beam-size", 3)
    best = f"{straight_run}:best"
    alone = score_json(best, *asked)
    # a model beside itself: the mean of two equal distributions is the distribution
    doubled = score_json(best, *asked, "--ensemble", best)
    assert doubled["metrics"] == alone["metrics"]
    members = doubled["decoding"]["ensemble"]
    assert [m["run"] for m in members] == [str(straight_run)] * 2
    assert members[0]["checkpoint"] == members[1]["checkpoint"] == alone["checkpoint"]
    # another seed: a different model; the device metrics stay the first run's own
    other = fit(workdir, tmp_path / "runs", "experiment.seed=7")
    pair = score_json(best, *asked, "--ensemble", other)
    assert pair["metrics"]["perplexity"] == alone["metrics"]["perplexity"]
    assert 0 <= pair["metrics"]["wer"] <= 100 and len(pair["decoding"]["ensemble"]) == 2
    outputs = {}
    for name, extra in (("alone", ()), ("doubled", ("--ensemble", straight_run))):
        out = tmp_path / f"{name}.jsonl"
        code, _, err = invoke(
            "predict", "--checkpoint", straight_run, "--input", source, "--output", out, *extra
        )
        assert code == 0, err
        outputs[name] = [json.loads(line) for line in out.read_text().splitlines()]
    assert outputs["doubled"] == outputs["alone"]


def test_an_ensemble_member_needs_only_its_run_folder(straight_run: Path, tmp_path: Path) -> None:
    """score without --data reads the first run's data.eval for every model: a member copied
    to a machine without its own eval files (run.json's config folder gone) still decodes."""
    moved = tmp_path / "moved"
    shutil.copytree(straight_run, moved)
    status = json.loads((moved / "run.json").read_text())
    status["config_dir"] = str(tmp_path / "nowhere")
    (moved / "run.json").write_text(json.dumps(status))
    asked = ("--metrics", "wer", "--beam-size", 2)
    alone = score_json(f"{straight_run}:best", *asked)
    doubled = score_json(f"{straight_run}:best", *asked, "--ensemble", f"{moved}:best")
    assert doubled["metrics"] == alone["metrics"]


def test_score_length_penalty_ranks_the_beam_as_predict_does(
    workdir: Path, straight_run: Path, tmp_path: Path
) -> None:
    """--length-penalty 0 ranks by log-probability alone: score's WER equals that of
    predict's outputs at the same beam and alpha."""
    source, target = workdir / "data" / "dev.src", workdir / "data" / "dev.tgt"
    report = score_json(straight_run, "--data", source, "--target", target, "--metrics", "wer",
                        "--beam-size", 3, "--length-penalty", 0)  # fmt: skip
    assert report["decoding"]["length_penalty"] == 0.0
    out = tmp_path / "out.jsonl"
    code, _, err = invoke("predict", "--checkpoint", straight_run, "--input", source, "--output",
                          out, "--beam-size", 3, "--length-penalty", 0)  # fmt: skip
    assert code == 0, err
    outputs = [json.loads(line)["output"] for line in out.read_text().splitlines()]
    references: dict[str, set[str]] = {}
    for src, tgt in zip(source.read_text().splitlines(), target.read_text().splitlines(),
                        strict=True):  # fmt: skip
        references.setdefault(" ".join(src.split()), set()).add(" ".join(tgt.split()))
    decoded = dict(zip((" ".join(s.split()) for s in source.read_text().splitlines()), outputs,
                       strict=True))  # fmt: skip
    wrong = sum(decoded[src] not in refs for src, refs in references.items())
    assert report["metrics"]["wer"] == pytest.approx(100 * wrong / len(references))
    code, _, err = invoke("score", straight_run, "--length-penalty", 0.5,
                          "--set", "fit.eval_metrics=[perplexity]", "--set", "fit.decode_eval=null",
                          "--set", "checkpoint.best_metric=perplexity")  # fmt: skip
    assert code != 0 and "--length-penalty 0.5" in err and "Traceback" not in err


def test_ensemble_errors_name_the_runs_and_the_difference(
    workdir: Path, straight_run: Path, tmp_path: Path, tiny_config
) -> None:
    source = workdir / "data" / "dev.src"
    # fewer source words kept: another source vocabulary
    narrow = fit(workdir, tmp_path / "runs", "data.train.max_vocab=6", "fit.num_epoch=1")
    target = workdir / "data" / "dev.tgt"
    code, out, err = invoke("score", straight_run, "--data", source, "--target", target,
                            "--metrics", "wer", "--ensemble", narrow)  # fmt: skip
    assert code != 0 and "Traceback" not in err
    assert str(narrow) in err and str(straight_run) in err and "source vocabulary" in err
    code, out, err = invoke("score", straight_run, "--ensemble", straight_run,
                            "--set", "fit.eval_metrics=[perplexity]",
                            "--set", "fit.decode_eval=null",
                            "--set", "checkpoint.best_metric=perplexity")  # fmt: skip
    assert code != 0 and "--metrics wer" in err and "Traceback" not in err
    code, out, err = invoke("fit", tiny_config, "--progress", "quiet")
    assert code == 0, out + err
    lm_run = tiny_config.parent / "runs" / "tiny"
    lines = tmp_path / "lines.txt"
    lines.write_text("the cat\n")
    code, out, err = invoke("predict", "--checkpoint", lm_run, "--input", lines, "--output",
                            tmp_path / "o.jsonl", "--ensemble", lm_run)  # fmt: skip
    assert code != 0 and "not a seq2seq run" in err and "Traceback" not in err


def test_results_script_reports_an_ensemble_row(
    workdir: Path, straight_run: Path, tmp_path: Path
) -> None:
    """--ensemble NAME=FOLDER: the further run gets its own row and the ensemble one; a run
    beside itself decodes as alone, so all three test figures agree."""
    ensemble = ("--ensemble", f"g2p_cmudict={straight_run}")
    row, text, _ = results_script(workdir, straight_run, tmp_path, *ensemble)
    (member,) = row["ensemble"]["members"]
    assert member["test_wer"] == row["test_wer"] == row["ensemble"]["test_wer"]
    assert member["test_per"] == row["test_per"] == row["ensemble"]["test_per"]
    assert "the 2 above as an ensemble" in text and text.count(", seed ") >= 2
