"""End-to-end: a seq2seq run from `mxtrain init --template seq2seq` and two text files.

A toy task (the target is the source reversed) is fitted once per module; resume from a
mid-epoch stop continues bit-identically, and score reproduces the logged eval values on
data.eval and reads a parallel held-out pair of files with --data/--target.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from mxtrain.cli.main import cli
from mxtrain.run.folder import read_metrics

WORDS = ["a", "b", "c", "d", "e", "f", "g"]
SHRINK = [
    "model.num_embed=16",
    "model.num_hidden=24",
    "model.dropout=0.1",
    "data.train.batch_tokens=96",
    "data.eval.batch_tokens=96",
    "optimizer.learning_rate=0.01",
    "fit.log_interval=5",
]


def invoke(*args: object) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


def sets(values: list[str]) -> list[str]:
    return [a for v in values for a in ("--set", v)]


def fit_template(workdir: Path, runs: Path, *settings: str) -> Path:
    """`mxtrain fit` of the workdir's seq2seq template with --set ``settings``; its run."""
    code, out, err = invoke(
        "fit", workdir / "s2s.yaml", "--progress", "quiet",
        *sets([*settings, f"experiment.runs_dir={runs}"]),
    )  # fmt: skip
    assert code == 0, out + err
    return runs / "s2s"


def write_pairs(folder: Path, split: str, count: int, seed: int) -> tuple[Path, Path]:
    rng = random.Random(seed)
    sources = [[rng.choice(WORDS) for _ in range(rng.randint(1, 7))] for _ in range(count)]
    src, tgt = folder / f"{split}.src", folder / f"{split}.tgt"
    src.write_text("".join(" ".join(s) + "\n" for s in sources))
    tgt.write_text("".join(" ".join(s[::-1]) + "\n" for s in sources))
    return src, tgt


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("seq2seq")
    (root / "data").mkdir()
    write_pairs(root / "data", "train", 300, seed=1)
    write_pairs(root / "data", "dev", 40, seed=2)
    write_pairs(root, "test", 25, seed=3)
    code, out, err = invoke("init", "--template", "seq2seq", "-o", root / "s2s.yaml")
    assert code == 0, out + err
    return root


@pytest.fixture(scope="module")
def straight_run(workdir: Path) -> Path:
    """Three epochs straight; tests only read it."""
    return fit_template(workdir, workdir / "runs", *SHRINK, "fit.num_epoch=3")


def epochs(run: Path) -> list[dict]:
    return [r for r in read_metrics(run / "metrics.jsonl") if r["event"] == "epoch"]


def test_fit_learns_and_keeps_both_vocabularies(straight_run: Path) -> None:
    records = epochs(straight_run)
    assert [r["epoch"] for r in records] == [1, 2, 3]
    assert records[-1]["eval"]["perplexity"] < records[0]["eval"]["perplexity"]
    source = json.loads((straight_run / "vocab.json").read_text())["tokens"]
    target = json.loads((straight_run / "target_vocab.json").read_text())["tokens"]
    assert set(WORDS) <= set(source) and set(WORDS) <= set(target)
    assert "<bos>" in target


def test_resume_from_a_mid_epoch_stop_is_bit_identical(workdir: Path, straight_run: Path) -> None:
    import mxnet as mx

    run = fit_template(workdir, workdir / "stopped_runs", *SHRINK, "fit.num_epoch=3",
                       "fit.max_updates=7")  # fmt: skip
    code, out, err = invoke("resume", run, "--set", "fit.max_updates=null", "--progress", "quiet")
    assert code == 0, out + err
    straight = mx.nd.load(str(straight_run / "model-0003.params"))
    resumed = mx.nd.load(str(run / "model-0003.params"))
    assert sorted(straight) == sorted(resumed)
    for name, value in straight.items():
        assert np.array_equal(value.asnumpy(), resumed[name].asnumpy()), name


def test_score_reproduces_the_logged_eval_and_reads_parallel_files(
    workdir: Path, straight_run: Path
) -> None:
    logged = epochs(straight_run)[-1]["eval"]["perplexity"]
    code, out, err = invoke("score", straight_run, "--json")
    assert code == 0, err
    assert json.loads(out)["metrics"]["perplexity"] == pytest.approx(logged, rel=1e-6)
    # --batch-size counts pairs, replacing batch_tokens; the value does not change
    code, out, err = invoke("score", straight_run, "--batch-size", "5", "--json")
    assert code == 0, err
    assert json.loads(out)["metrics"]["perplexity"] == pytest.approx(logged, rel=1e-5)
    code, out, err = invoke(
        "score", straight_run, "--data", workdir / "test.src", "--target", workdir / "test.tgt",
        "--json",
    )  # fmt: skip
    assert code == 0, err
    report = json.loads(out)
    assert report["data"].endswith("test.src") and report["metrics"]["perplexity"] > 1.0
    code, out, err = invoke("score", straight_run, "--data", workdir / "test.src")
    assert code == 2 and "--target" in err and "Traceback" not in err


def test_pairs_of_unequal_length_are_refused_naming_both_files(workdir: Path) -> None:
    bad = workdir / "bad"
    bad.mkdir(exist_ok=True)
    src, tgt = write_pairs(bad, "train", 10, seed=4)
    tgt.write_text("".join(tgt.read_text().splitlines(keepends=True)[:7]))
    code, out, err = invoke(
        "fit",
        workdir / "s2s.yaml",
        "--progress",
        "quiet",
        *sets([*SHRINK, f"data.train.source={src}", f"data.train.target={tgt}",
               f"experiment.runs_dir={bad / 'runs'}"]),
    )  # fmt: skip
    assert code == 3, out + err
    assert str(src) in err and str(tgt) in err and "10" in err and "7" in err


def test_warm_start_with_the_saved_vocabularies_and_a_frozen_encoder(
    workdir: Path, straight_run: Path
) -> None:
    """initializer.from loads every parameter of a seq2seq run (its vocabularies reused);
    lr_mult 0 on the encoder keeps it exactly as loaded while the rest trains on."""
    import mxnet as mx

    run = fit_template(
        workdir, workdir / "warm_runs", *SHRINK, "fit.num_epoch=1",
        f"data.train.vocab={straight_run / 'vocab.json'}",
        f"initializer.from={straight_run}:3", 'optimizer.lr_mult={"encoder_*": 0}',
    )  # fmt: skip
    source = mx.nd.load(str(straight_run / "model-0003.params"))
    warm = mx.nd.load(str(run / "model-0001.params"))
    assert sorted(source) == sorted(warm)
    frozen = [n for n in source if n.startswith("arg:encoder_")]
    assert frozen
    for name in frozen:
        assert np.array_equal(source[name].asnumpy(), warm[name].asnumpy()), name
    assert not np.array_equal(
        source["arg:output_weight"].asnumpy(), warm["arg:output_weight"].asnumpy()
    )
    record = json.loads((run / "run.json").read_text())
    assert record["initialized_from"]["source"].endswith(":3")


def test_int8_is_refused_for_decoding(straight_run: Path, workdir: Path) -> None:
    for command in (
        ["score", straight_run],
        [
            "predict",
            "--checkpoint",
            straight_run,
            "--input",
            workdir / "test.src",
            "--output",
            workdir / "int8.jsonl",
        ],
    ):
        code, out, err = invoke(*command, "--int8")
        assert code == 2, out + err
        assert "--int8" in out + err and "stay fp32" in out + err
        assert "Traceback" not in out + err
    assert not (workdir / "int8.jsonl").exists()
