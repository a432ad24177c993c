"""End-to-end: a right-to-left model (data reverse_target) and reranking a beam with it
(`predict --rerank`, `score --rerank`).

The toy task of test_seq2seq_e2e (the target is the source reversed): a right-to-left model
trains exactly as a left-to-right one on target files written backwards, writes its outputs
in reading order, and reranks a left-to-right model's candidates; each misuse is a clear
error.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import params
from test_seq2seq_e2e import SHRINK, fit_template, invoke, write_pairs

SETTINGS = [
    *SHRINK,
    "fit.num_epoch=2",
    "fit.eval_metrics=[perplexity, wer]",
    "fit.decode_eval.beam_size=2",
    "checkpoint.best_metric=wer",
]


def backwards(path: Path) -> Path:
    """``path`` with every line's tokens in the opposite order, beside it."""
    out = path.with_name(path.stem + "_backwards" + path.suffix)
    out.write_text(
        "".join(" ".join(line.split()[::-1]) + "\n" for line in path.read_text().splitlines())
    )
    return out


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("rerank")
    (root / "data").mkdir()
    for split, count, seed in (("train", 300, 1), ("dev", 40, 2)):
        _, target = write_pairs(root / "data", split, count, seed=seed)
        backwards(target)
    code, out, err = invoke("init", "--template", "seq2seq", "-o", root / "s2s.yaml")
    assert code == 0, out + err
    return root


@pytest.fixture(scope="module")
def forward(workdir: Path) -> Path:
    return fit_template(workdir, workdir / "forward", *SETTINGS)


@pytest.fixture(scope="module")
def backward(workdir: Path) -> Path:
    return fit_template(workdir, workdir / "backward", *SETTINGS, "data.train.reverse_target=true")


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def predict(run: Path, source: Path, out: Path, *extra: object) -> list[dict]:
    code, _, err = invoke("predict", "--checkpoint", run, "--input", source, "--output", out,
                          *extra)  # fmt: skip
    assert code == 0, err
    return records(out)


def test_a_right_to_left_run_trains_as_on_backwards_files_and_writes_reading_order(
    workdir: Path, backward: Path, tmp_path: Path
) -> None:
    by_files = fit_template(workdir, tmp_path / "runs", *SETTINGS,
                            "data.train.target=data/train_backwards.tgt",
                            "data.eval.target=data/dev_backwards.tgt")  # fmt: skip
    ours, theirs = params(backward, 2), params(by_files, 2)
    assert sorted(ours) == sorted(theirs)
    for name, value in ours.items():
        np.testing.assert_array_equal(value, theirs[name], err_msg=name)
    saved = json.loads((backward / "run.json").read_text())
    assert saved  # the run folder is complete
    source = workdir / "data" / "dev.src"
    turned = predict(backward, source, tmp_path / "turned.jsonl")
    written = predict(by_files, source, tmp_path / "written.jsonl")
    assert [r["output"] for r in turned] == [" ".join(r["output"].split()[::-1]) for r in written]
    assert [r["score"] for r in turned] == [r["score"] for r in written]


def test_score_and_predict_rerank_with_a_right_to_left_run(
    workdir: Path, forward: Path, backward: Path, tmp_path: Path
) -> None:
    source, target = workdir / "data" / "dev.src", workdir / "data" / "dev.tgt"
    asked = ("--data", source, "--target", target, "--metrics", "wer,per", "--beam-size", 3)
    code, out, err = invoke("score", forward, *asked, "--rerank", backward, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["decoding"]["rerank"] == [
        {"run": str(backward), "checkpoint": report["decoding"]["rerank"][0]["checkpoint"],
         "reverse_target": True}
    ]  # fmt: skip
    assert 0 <= report["metrics"]["wer"] <= 100
    reranked = predict(forward, source, tmp_path / "r.jsonl", "--beam-size", 3, "--nbest", 2,
                       "--rerank", backward)  # fmt: skip
    assert len(reranked) == len(source.read_text().splitlines())
    assert all(len(r["nbest"]) == 2 for r in reranked)
    for r in reranked:
        first, second = r["nbest"]
        assert first["score"] >= second["score"] and r["output"] == first["output"]
    # an ensemble searching beside the reranker: the ensemble of a run with itself scores
    # as the run alone, so the pool's ranking is the same
    doubled = predict(forward, source, tmp_path / "e.jsonl", "--beam-size", 3, "--nbest", 2,
                      "--rerank", backward, "--ensemble", forward)  # fmt: skip
    assert [r["output"] for r in doubled] == [r["output"] for r in reranked]
    # score's WER is that of predict's best outputs at the same beam
    outputs = predict(forward, source, tmp_path / "one.jsonl", "--beam-size", 3,
                      "--rerank", backward)  # fmt: skip
    references: dict[str, set[str]] = {}
    for src, tgt in zip(source.read_text().splitlines(), target.read_text().splitlines(),
                        strict=True):  # fmt: skip
        references.setdefault(" ".join(src.split()), set()).add(" ".join(tgt.split()))
    decoded = dict(zip((" ".join(s.split()) for s in source.read_text().splitlines()),
                       (r["output"] for r in outputs), strict=True))  # fmt: skip
    wrong = sum(decoded[src] not in refs for src, refs in references.items())
    assert report["metrics"]["wer"] == pytest.approx(100 * wrong / len(references))


def test_rerank_and_direction_errors_are_clear(
    workdir: Path, forward: Path, backward: Path, tmp_path: Path
) -> None:
    source = workdir / "data" / "dev.src"
    out = tmp_path / "o.jsonl"
    code, _, err = invoke("predict", "--checkpoint", forward, "--input", source, "--output", out,
                          "--ensemble", backward)  # fmt: skip
    assert code != 0 and "Traceback" not in err
    assert "right to left" in err and "--rerank" in err and str(backward) in err
    code, _, err = invoke("predict", "--checkpoint", forward, "--input", source, "--output", out,
                          "--rerank", backward, "--beam-size", 1)  # fmt: skip
    assert code != 0 and "--beam-size 2" in err and "Traceback" not in err
    code, _, err = invoke("score", forward, "--rerank", backward, "--beam-size", 1)
    assert code != 0 and "--rerank" in err and "Traceback" not in err
    code, _, err = invoke("check", workdir / "s2s.yaml", "--set", "data.train.reverse_target=true",
                          "--set", "data.eval.reverse_target=false")  # fmt: skip
    assert code != 0 and "reverse_target" in err and "Traceback" not in err
    code, _, err = invoke("check", workdir / "s2s.yaml", "--set", "data.train.reverse_target=yes")
    assert code != 0 and "reverse_target" in err and "Traceback" not in err


def test_results_script_reports_a_reranked_row(
    workdir: Path, forward: Path, backward: Path, tmp_path: Path
) -> None:
    """--rerank NAME=FOLDER: the right-to-left run gets its own row, labelled so, and the
    reranked decoding one, whose figures are `score --rerank`'s."""
    from test_seq2seq_decoding_metrics import results_script

    row, text, split = results_script(workdir, forward, tmp_path, "--rerank",
                                      f"g2p_cmudict={backward}")  # fmt: skip
    (member,) = row["rerank"]["members"]
    assert member["run"] == str(backward)
    assert "right to left" in text and "together (`score --rerank`)" in text
    # the toy runs differ from the shipped config in much, but not in their direction
    (note,) = [line for line in text.splitlines() if "The rerank run" in line]
    assert "more than its seed and direction" in note and "reverse_target" not in note
    code, out, err = invoke("score", f"{forward}:best", "--data", split / "test.src", "--target",
                            split / "test.tgt", "--metrics", "wer,per", "--beam-size", 5,
                            "--rerank", f"{backward}:best", "--json")  # fmt: skip
    assert code == 0, err
    report = json.loads(out)
    assert row["rerank"]["test_wer"] == report["metrics"]["wer"]
    assert row["rerank"]["test_per"] == report["metrics"]["per"]
    assert f"**{row['rerank']['test_wer']:,.1f} / {row['rerank']['test_per']:,.1f}**" in text
