"""scripts/results.py's tagger section: a run of the shipped UD tagger config (shrunk, on toy
CoNLL-U files) gets its best dev accuracy, the test accuracy `mxtrain score` reports, the
accuracy on unseen words from `mxtrain predict`, and the most-frequent-tag baseline."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from mxtrain.cli.main import cli
from mxtrain.run.folder import read_metrics

ROOT = Path(__file__).resolve().parents[2]
SUFFIXES = {"ing": "VERB", "ly": "ADV", "ness": "NOUN", "ful": "ADJ"}
WORDS = [stem + suffix for stem in ("bor", "kal", "mip", "tus") for suffix in SUFFIXES]
#: the test split, by hand: (form, gold tag); "set" is a NOUN twice and a VERB once in training
TEST = [
    [("the", "DET"), ("set", "VERB"), ("zzzing", "VERB")],
    [("kalness", "NOUN"), ("yyyness", "NOUN")],
]


def conllu(sentences: list[list[tuple[str, str]]]) -> str:
    lines = []
    for number, sentence in enumerate(sentences, 1):
        lines.append(f"# sent_id = {number}")
        for i, (form, tag) in enumerate(sentence, 1):
            lines.append(f"{i}\t{form}\t{form}\t{tag}\t_\t_\t0\tdep\t_\t_")
        lines.append("")
    return "\n".join(lines) + "\n"


def toy_sentences(n: int, seed: int) -> list[list[tuple[str, str]]]:
    """Sentences with "the" twice (so DET is the most frequent tag) and suffix-tagged words."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(1, 5))]
        tagged = [(w, next(t for s, t in SUFFIXES.items() if w.endswith(s))) for w in words]
        out.append([("the", "DET"), *tagged, ("the", "DET")])
    return out


def test_the_tagger_section_reports_test_unseen_and_baseline_accuracy(tmp_path: Path) -> None:
    data = tmp_path / "split"
    data.mkdir()
    ambiguous = [[("the", "DET"), ("set", "NOUN")]] * 2 + [[("set", "VERB"), ("the", "DET")]]
    (data / "train.conllu").write_text(conllu(toy_sentences(60, 1) + ambiguous), "utf-8")
    (data / "dev.conllu").write_text(conllu(toy_sentences(10, 2)), "utf-8")
    (data / "test.conllu").write_text(conllu(TEST), "utf-8")
    sets = [
        f"experiment.runs_dir={tmp_path / 'runs'}",
        f"data.train.source={data / 'train.conllu'}",
        f"data.eval.source={data / 'dev.conllu'}",
        *("model.num_embed=8", "model.num_hidden=8", "model.num_layers=1", "model.char_embed=4"),
        *("model.char_filters=6", "fit.num_epoch=2", "optimizer.lr_scheduler.max_update=2"),
    ]
    args = ["fit", str(ROOT / "configs/ud_hebrew_tagger.yaml"), "--progress", "quiet"]
    result = CliRunner().invoke(cli, [*args, *[a for s in sets for a in ("--set", s)]])
    assert result.exit_code == 0, result.output
    run = tmp_path / "runs/ud_hebrew_tagger"

    output = tmp_path / "RESULTS.md"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts/results.py"), "--runs", str(tmp_path / "none"),
         "--output", str(output), "--drop-missing", "--run", f"ud_hebrew_tagger={run}",
         "--tagger-data", str(data)],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    row = json.loads(output.with_suffix(".json").read_text())["ud_hebrew_tagger"]

    epochs = [r for r in read_metrics(run / "metrics.jsonl") if r["event"] == "epoch"]
    logged = [r["eval"]["accuracy"] for r in epochs]
    assert row["valid"] == max(logged) and row["epochs"] == 2
    scored = CliRunner().invoke(
        cli, ["score", f"{run}:best", "--data", str(data / "test.conllu"), "--json"]
    )
    assert scored.exit_code == 0, scored.output
    accuracy = json.loads(scored.stdout.strip().splitlines()[-1])["metrics"]["accuracy"]
    assert row["test"] == 100 * accuracy
    assert (row["test_words"], row["unseen_words"]) == (5, 2)
    # the baseline: the -> DET and kalness -> NOUN right; set -> NOUN (2 of 3 in training)
    # wrong; the unseen zzzing and yyyness -> DET (the most frequent tag) wrong
    assert row["baseline"] == {
        "test": 40.0,
        "test_unseen": 0.0,
        "unseen_words": 2,
        "test_words": 5,
    }
    text = output.read_text()
    assert "## Part-of-speech tagging (UD_Hebrew-HTB, UPOS)" in text
    assert "| most frequent tag per word (computed by this script) | - | - | 40.00 | 0.00 |" in text
    assert "UDPipe 2" in text and "5,178 of the release's 5,241" in text
