"""End-to-end: the example configs of the RNN models, from YAML alone.

``configs/conll_tagger.yaml`` learns a toy tagging rule from generated CoNLL files; ``mxtrain
score`` reproduces its logged eval accuracy and ``mxtrain predict`` labels new sentences in
input order. ``configs/ptb_char_lstm.yaml`` and ``configs/ptb_gru.yaml`` pass ``mxtrain check``
and train a few batches.
"""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from mxtrain.cli.main import cli
from mxtrain.run.folder import read_metrics

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
STEMS = ["bor", "kal", "mip", "tus", "zen", "fal", "dor", "pim", "rak", "sul"]
SUFFIXES = {"ing": "VERB", "ly": "ADV", "ness": "NOUN", "ful": "ADJ"}
FUNCTION_WORDS = {"the": "DET", "and": "CONJ", "#": "SYM"}  # "#" only in the eval data


def label_of(previous: str | None, token: str) -> str:
    """The toy rule: the class of a word's suffix; "set" is a NOUN after "the", else a VERB."""
    if token == "set":
        return "NOUN" if previous == "the" else "VERB"
    if token in FUNCTION_WORDS:
        return FUNCTION_WORDS[token]
    return next(label for suffix, label in SUFFIXES.items() if token.endswith(suffix))


WORDS = ["the", "and", "set", *(s + x for s in STEMS for x in SUFFIXES)]
# eval only: an unknown word (its suffix says NOUN) and a label the training data lacks
EVAL_EXTRA = [["the", "zzzness", "set", "#"], ["#", "borly", "and", "kaling"]]


def sentences(n: int, seed: int, lengths: tuple[int, int] = (3, 12)) -> list[list[str]]:
    rng = random.Random(seed)
    return [[rng.choice(WORDS) for _ in range(rng.randint(*lengths))] for _ in range(n)]


def labelled(sentence: list[str]) -> list[str]:
    return [label_of(sentence[i - 1] if i else None, t) for i, t in enumerate(sentence)]


def write_conll(path: Path, sents: list[list[str]], *, with_labels: bool = True) -> Path:
    lines = []
    for sent in sents:
        tags = labelled(sent)
        lines += [f"{t} {y}" if with_labels else t for t, y in zip(sent, tags, strict=True)]
        lines.append("")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_conllu(path: Path, sents: list[list[str]]) -> Path:
    lines = []
    for k, sent in enumerate(sents, 1):
        lines.append(f"# sent_id = {k}")
        for i, token in enumerate(sent, 1):
            lines.append(f"{i}\t{token}\t{token}\t_\t_\t_\t0\tdep\t_\t_")
        lines.append("")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def invoke(*args: object) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


TAGGER_OVERRIDES = [
    "model.num_embed=16",
    "model.num_hidden=24",
    "model.dropout=0.0",
    "data.train.batch_size=16",
    "data.train.min_count=1",
    "data.eval.batch_size=16",
    "optimizer.learning_rate=0.03",
    "fit.num_epoch=6",
    "fit.log_interval=10",
]


@pytest.fixture(scope="module")
def tagger_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """configs/conll_tagger.yaml fitted once on generated data; tests only read the run."""
    folder = tmp_path_factory.mktemp("tagger")
    train = write_conll(folder / "train.conll", sentences(240, seed=1))
    dev = write_conll(folder / "dev.conll", sentences(50, seed=2) + EVAL_EXTRA)
    sets = [
        f"data.train.source={train}",
        f"data.eval.source={dev}",
        f"experiment.runs_dir={folder / 'runs'}",
        *TAGGER_OVERRIDES,
    ]
    code, out, err = invoke(
        "fit", CONFIGS / "conll_tagger.yaml", "--progress", "plain", *_sets(sets)
    )
    assert code == 0, out + err
    return folder / "runs" / "conll_tagger"


def _sets(values: list[str]) -> list[str]:
    return [a for v in values for a in ("--set", v)]


def epochs(run: Path) -> list[dict]:
    return [r for r in read_metrics(run / "metrics.jsonl") if r["event"] == "epoch"]


def test_fit_learns_the_rule_and_keeps_both_vocabularies(tagger_run: Path) -> None:
    records = epochs(tagger_run)
    assert [r["epoch"] for r in records] == list(range(1, 7))
    assert 0.97 < records[-1]["eval"]["accuracy"] < 1.0  # "#" is always wrong
    assert records[-1]["train"]["accuracy"] > records[0]["train"]["accuracy"]
    labels = json.loads((tagger_run / "label_vocab.json").read_text())["labels"]
    assert labels == ["<pad>", "<unk>", "ADJ", "ADV", "CONJ", "DET", "NOUN", "VERB"]
    tokens = json.loads((tagger_run / "vocab.json").read_text())["tokens"]
    assert set(WORDS) <= set(tokens)
    log = (tagger_run / "train.log").read_text()
    assert "6 labels, unknown labels: 0" in log  # train
    assert "6 labels, unknown labels: 2" in log  # eval: the two "#"
    assert "labels the training data does not have" in log and "'SYM' (2)" in log


def test_score_equals_the_logged_eval_accuracy(tagger_run: Path) -> None:
    records = epochs(tagger_run)
    code, out, err = invoke("score", tagger_run, "--json")
    assert code == 0, err
    scored = json.loads(out.strip().splitlines()[-1])
    assert scored["epoch"] == 6
    assert scored["metrics"]["accuracy"] == pytest.approx(
        records[-1]["eval"]["accuracy"], abs=1e-12
    )
    for epoch in (1, 3):
        code, out, err = invoke("score", f"{tagger_run}:{epoch}", "--batch-size", "5", "--json")
        assert code == 0, err
        assert json.loads(out)["metrics"]["accuracy"] == pytest.approx(
            records[epoch - 1]["eval"]["accuracy"], abs=1e-12
        )


def test_resume_continues_bit_identically(tagger_run: Path) -> None:
    """1 epoch + `mxtrain resume` to 2 gives the parameters of 2 epochs straight (the saved
    vocabularies are reloaded, the batch order replayed)."""
    import mxnet as mx

    assert json.loads((tagger_run / "run.json").read_text())["status"] == "finished"
    runs = tagger_run.parent.parent / "resumed_runs"
    data = tagger_run.parent.parent
    sets = [
        f"data.train.source={data / 'train.conll'}",
        f"data.eval.source={data / 'dev.conll'}",
        f"experiment.runs_dir={runs}",
        *TAGGER_OVERRIDES,
        "fit.num_epoch=1",
    ]
    code, out, err = invoke(
        "fit", CONFIGS / "conll_tagger.yaml", "--progress", "quiet", *_sets(sets)
    )
    assert code == 0, out + err
    run = runs / "conll_tagger"
    code, out, err = invoke("resume", run, "--set", "fit.num_epoch=2", "--progress", "quiet")
    assert code == 0, out + err
    straight = mx.nd.load(str(tagger_run / "model-0002.params"))
    resumed = mx.nd.load(str(run / "model-0002.params"))
    assert sorted(straight) == sorted(resumed)
    for name, value in straight.items():
        assert np.array_equal(value.asnumpy(), resumed[name].asnumpy()), name


def _new_sentences() -> list[list[str]]:
    """Lengths that reorder them across buckets, one longer than every training bucket, an
    unknown word and a one-word sentence."""
    sents = sentences(12, seed=9, lengths=(1, 12))
    sents.insert(3, sentences(1, seed=10, lengths=(40, 40))[0])
    sents.insert(7, ["the", "zzzful", "set"])
    sents.append(["set"])
    return sents


def test_predict_labels_every_sentence_in_input_order(tagger_run: Path, tmp_path: Path) -> None:
    sents = _new_sentences()
    source = write_conll(tmp_path / "new.conll", sents, with_labels=False)  # tokens only
    out = tmp_path / "tags.jsonl"
    code, stdout, err = invoke(
        "predict", "--checkpoint", tagger_run, "--input", source, "--output", out, "--top-k", "2"
    )
    assert code == 0, err
    assert f"wrote {len(sents)} records" in stdout
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["sentence"] for r in records] == list(range(1, len(sents) + 1))
    assert [r["tokens"] for r in records] == sents
    starts = [1]
    for sent in sents[:-1]:
        starts.append(starts[-1] + len(sent) + 1)
    assert [r["line"] for r in records] == starts
    right = total = 0
    for sent, record in zip(sents, records, strict=True):
        assert len(record["labels"]) == len(sent) == len(record["probs"]) == len(record["top"])
        assert all(0.0 < p <= 1.0 for p in record["probs"])
        for label, prob, top in zip(record["labels"], record["probs"], record["top"], strict=True):
            assert label not in ("<pad>", "<unk>")
            assert top[0] == [label, prob] and top[1][1] <= prob
        for i, (label, token) in enumerate(zip(record["labels"], sent, strict=True)):
            if token in WORDS:
                right += label == label_of(sent[i - 1] if i else None, token)
                total += 1
    assert right / total > 0.97


def test_predict_reads_conllu_and_writes_csv_and_npy(tagger_run: Path, tmp_path: Path) -> None:
    sents = _new_sentences()
    base = tmp_path / "base.jsonl"
    code, _, err = invoke(
        "predict",
        "--checkpoint",
        tagger_run,
        "--input",
        write_conll(tmp_path / "a.conll", sents),  # labels present: ignored
        "--output",
        base,
    )
    assert code == 0, err
    expected = [json.loads(line) for line in base.read_text().splitlines()]
    # CoNLL-U input (format: auto detects it; FORM is the token column), other batch size
    conllu = write_conllu(tmp_path / "a.conllu", sents)
    table = tmp_path / "tags.csv"
    code, _, err = invoke(
        "predict", "--checkpoint", tagger_run, "--input", conllu, "--output", table,
        "--format", "csv", "--batch-size", "3",
    )  # fmt: skip
    assert code == 0, err
    with open(table, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["sentence", "line", "position", "token", "label", "prob"]
    flat = [(r["sentence"], r["position"], r["token"], r["label"]) for r in rows]
    assert flat == [
        (str(k), str(i), t, y)
        for k, rec in enumerate(expected, 1)
        for i, (t, y) in enumerate(zip(rec["tokens"], rec["labels"], strict=True), 1)
    ]
    array_file = tmp_path / "tags.npy"
    code, _, err = invoke(
        "predict", "--checkpoint", tagger_run, "--input", tmp_path / "a.conll",
        "--output", array_file, "--format", "npy",
    )  # fmt: skip
    assert code == 0, err
    array = np.load(array_file)
    assert array.dtype.names == (
        "sentence", "line", "position", "token", "label", "label_id", "prob",
    )  # fmt: skip
    assert array["token"].tolist() == [t for s in sents for t in s]
    assert array["label"].tolist() == [y for rec in expected for y in rec["labels"]]
    assert np.allclose(array["prob"], [p for rec in expected for p in rec["probs"]])


@pytest.mark.parametrize("name", ["ptb_char_lstm", "ptb_gru"])
def test_language_model_configs_check_and_train_a_few_batches(name: str, tmp_path: Path) -> None:
    config = CONFIGS / f"{name}.yaml"
    code, out, err = invoke("check", config)
    assert code == 0, err
    assert f"name: {name}" in out
    sets = [
        "fit.max_batches_per_epoch=3",
        "fit.num_epoch=1",
        "data.train.max_sentences=200",
        "data.eval.max_sentences=50",
        f"experiment.runs_dir={tmp_path / 'runs'}",
    ]
    code, out, err = invoke("fit", config, "--progress", "plain", *_sets(sets))
    assert code == 0, out + err
    (record,) = epochs(tmp_path / "runs" / name)
    assert record["batch"] == 3
    assert np.isfinite(record["eval"]["perplexity"])
    if name == "ptb_char_lstm":
        vocab = json.loads((tmp_path / "runs" / name / "vocab.json").read_text())
        assert vocab["level"] == "char" and len(vocab["tokens"]) < 80
