"""model.pretrained_embedding end to end: a tagger starts from word vectors (frozen: they stay
as read), the coverage is logged and kept in run.json, and a size that cannot fit is refused
at the config line."""

from __future__ import annotations

import json
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest
from click.testing import CliRunner

from mxtrain.cli.main import cli
from mxtrain.data.vocab import Vocab
from mxtrain.errors import ExitCode

WORDS = ["boring", "kally", "mipness", "tusful", "zening", "kalness"]
LABELS = {"ing": "VERB", "ly": "ADV", "ness": "NOUN", "ful": "ADJ"}


def write_data(folder: Path) -> tuple[Path, Path]:
    rng = np.random.RandomState(0)
    lines = []
    for _ in range(40):
        for word in rng.choice(WORDS, size=rng.randint(3, 7)):
            label = next(y for s, y in LABELS.items() if word.endswith(s))
            lines.append(f"{word} {label}")
        lines.append("")
    (folder / "train.conll").write_text("\n".join(lines) + "\n", encoding="utf-8")
    # GloVe-style: no header; two vocabulary words and one that is not in the data
    vectors = folder / "vectors.txt"
    vectors.write_text("boring 0.5 -1 2 0\nKally 1 1 1 1\nother 3 3 3 3\n", encoding="utf-8")
    return folder / "train.conll", vectors


def config(
    folder: Path, train: Path, vectors: Path, num_embed: int, freeze: bool, extra: str = ""
) -> Path:
    path = folder / f"tagger{num_embed}.yaml"
    path.write_text(
        f"""\
experiment: {{name: tagger, seed: 1, runs_dir: {folder / "runs"}}}
model:
  name: rnn_tagger
  num_embed: {num_embed}
  num_hidden: 6
  pretrained_embedding:
    source: {vectors.name}
    freeze: {str(freeze).lower()}{extra}
data:
  train: {{iterator: tagged_sequences, source: {train.name}, batch_size: 8, lowercase: true}}
optimizer: {{name: adam, learning_rate: 0.05}}
fit: {{num_epoch: 2}}
""",
        encoding="utf-8",
    )
    return path


def test_a_frozen_pretrained_embedding_keeps_the_vectors_it_read(tmp_path: Path) -> None:
    train, vectors = write_data(tmp_path)
    path = config(tmp_path, train, vectors, num_embed=4, freeze=True)
    result = CliRunner().invoke(cli, ["fit", str(path), "--progress", "plain"])
    assert result.exit_code == 0, result.output
    assert "pretrained embedding: 2 of 6 vocabulary words (33.3%)" in result.output
    assert "frozen: the embedding is not trained" in result.output
    run = tmp_path / "runs/tagger"
    report = json.loads((run / "run.json").read_text())["pretrained_embedding"]
    assert report["words_with_a_vector"] == 2 and report["vectors_in_file"] == 3
    assert report["parameter"] == "embed_weight" and report["freeze"] is True
    tokens = json.loads((run / "vocab.json").read_text())["tokens"]
    params = {
        k.split(":", 1)[1]: v.asnumpy()
        for k, v in mx.nd.load(str(run / "model-0002.params")).items()
    }
    embed = params["embed_weight"]
    np.testing.assert_array_equal(embed[tokens.index("boring")], np.float32([0.5, -1, 2, 0]))
    np.testing.assert_array_equal(embed[tokens.index("kally")], np.float32([1, 1, 1, 1]))
    # the other rows are the initializer's, not zeros
    assert np.abs(embed[tokens.index("zening")]).sum() > 0


def test_add_words_makes_the_vectors_words_known_at_predict_time(tmp_path: Path) -> None:
    train, vectors = write_data(tmp_path)
    path = config(tmp_path, train, vectors, 4, freeze=True, extra="\n    add_words: true")
    result = CliRunner().invoke(cli, ["fit", str(path), "--progress", "plain"])
    assert result.exit_code == 0, result.output
    told = "add_words: the vocabulary holds 10 words: the training data's and the vectors' first 3"
    assert told in result.output
    assert "pretrained embedding: 3 of 7 vocabulary words" in result.output
    run = tmp_path / "runs/tagger"
    tokens = json.loads((run / "vocab.json").read_text())["tokens"]
    assert tokens[-1] == "other"  # after the training data's words; "Kally" was one of them
    assert tokens.count("kally") == 1
    params = mx.nd.load(str(run / "model-0002.params"))
    embed = params["arg:embed_weight"].asnumpy()
    np.testing.assert_array_equal(embed[tokens.index("other")], np.float32([3, 3, 3, 3]))
    sentence = tmp_path / "in.txt"
    sentence.write_text("other\nboring\n\n", encoding="utf-8")  # CoNLL: a token a line
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(
        cli, ["predict", "--checkpoint", str(run), "--input", str(sentence), "--output", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert len(json.loads(out.read_text())["labels"]) == 2


def test_add_words_with_a_given_vocabulary_is_refused(tmp_path: Path) -> None:
    train, vectors = write_data(tmp_path)
    given = Vocab(["<pad>", "<unk>", "<eos>", "boring"], level="word", lowercase=True)
    given.save(tmp_path / "vocab.json")
    path = config(tmp_path, train, vectors, 4, freeze=False, extra="\n    add_words: 2")
    path.write_text(
        path.read_text().replace("lowercase: true", "lowercase: true, vocab: vocab.json")
    )
    result = CliRunner().invoke(cli, ["fit", str(path), "--progress", "plain"])
    assert result.exit_code == ExitCode.CONFIG, result.output
    assert f"{path}:9: model.pretrained_embedding.add_words adds words" in result.output
    assert "data.train.vocab gives one" in result.output and "Traceback" not in result.output


def test_vectors_of_another_size_are_refused_at_the_config_line(tmp_path: Path) -> None:
    train, vectors = write_data(tmp_path)
    path = config(tmp_path, train, vectors, num_embed=5, freeze=False)
    result = CliRunner().invoke(cli, ["fit", str(path), "--progress", "plain"])
    assert result.exit_code == ExitCode.CONFIG, result.output
    assert f"{path}:7: model.pretrained_embedding.source" in result.output
    assert "holds vectors of 4 numbers, and the model's embedding (embed_weight) has 5" in (
        result.output
    )
    assert "Set model.num_embed: 4" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "runs/tagger").exists()


@pytest.mark.parametrize(
    ("shared", "name"), [(False, "source_embed_weight"), (True, "embed_weight")]
)
def test_a_seq2seq_model_starts_its_source_embedding_from_vectors(shared: bool, name: str) -> None:
    from mxtrain.data.base import Seq2SeqInfo
    from mxtrain.models.rnn_seq2seq import build_rnn_seq2seq
    from mxtrain.models.seq2seq_options import RnnSeq2SeqOptions

    info = Seq2SeqInfo(vocab_size=9, num_classes=9, pad_id=0, shared_vocab=shared)
    options = RnnSeq2SeqOptions(num_embed=4, num_hidden=4, share_embeddings=shared)
    assert build_rnn_seq2seq(options, info).word_embedding == name
