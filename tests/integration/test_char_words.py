"""Character-aware words in the tagger: word forms the vocabulary lacks get a representation
of their own from their characters (a tagger without them gives every unseen word the same
one), the character vocabulary is kept in the run folder, a word's vector does not depend on
how far its batch pads characters, and a resumed run continues bit-identically."""

from __future__ import annotations

import json
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest
from click.testing import CliRunner
from float_bounds import assert_close_at_scale

from mxtrain.cli.main import cli
from mxtrain.errors import ExitCode
from mxtrain.models.char_words import char_word_vectors

STEMS = ["bor", "kal", "mip", "tus", "zen", "fal", "gor", "hup", "lin", "mor", "nat", "pir"]
SUFFIXES = {"ing": "VERB", "ly": "ADV", "ness": "NOUN", "ful": "ADJ"}
UNSEEN = ["zorping", "qaxly", "bleeness", "wumful"]  # stems the training data never has


def write_project(folder: Path, model: str) -> Path:
    rng = np.random.RandomState(0)
    lines = []
    for _ in range(150):
        for _ in range(rng.randint(3, 8)):
            suffix = list(SUFFIXES)[rng.randint(4)]
            lines.append(f"{STEMS[rng.randint(len(STEMS))]}{suffix} {SUFFIXES[suffix]}")
        lines.append("")
    (folder / "train.conll").write_text("\n".join(lines) + "\n", encoding="utf-8")
    path = folder / "tagger.yaml"
    path.write_text(
        f"""\
experiment: {{name: tagger, seed: 1, runs_dir: {folder / "runs"}}}
model: {{name: rnn_tagger, num_embed: 8, num_hidden: 8, dropout: 0.0, {model}}}
data:
  train: {{iterator: tagged_sequences, source: train.conll, batch_size: 16, min_count: 2}}
  eval: {{iterator: tagged_sequences, source: train.conll, batch_size: 16}}
optimizer: {{name: adam, learning_rate: 0.03}}
fit: {{num_epoch: 4, metrics: [accuracy]}}
""",
        encoding="utf-8",
    )
    return path


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def tag_unseen_words(folder: Path, run: Path) -> list[str]:
    source = folder / "unseen.conll"
    source.write_text("\n".join(UNSEEN) + "\n\n", encoding="utf-8")
    code, output = invoke(
        "predict", "--checkpoint", str(run), "--input", str(source), "--output",
        str(folder / "tags.jsonl"), "--force",
    )  # fmt: skip
    assert code == 0, output
    return json.loads((folder / "tags.jsonl").read_text())["labels"]


@pytest.mark.parametrize("chars", [True, False], ids=["chars", "words-only"])
def test_unseen_word_forms_are_tagged_from_their_characters(tmp_path: Path, chars: bool) -> None:
    model = "char_embed: 8, char_filters: 12, char_max_len: 6" if chars else "char_embed: 0"
    config = write_project(tmp_path, model)
    code, output = invoke("fit", str(config), "--progress", "plain")
    assert code == 0, output
    run = tmp_path / "runs/tagger"
    labels = tag_unseen_words(tmp_path, run)
    if chars:
        assert (run / "char_vocab.json").is_file()
        assert labels == [SUFFIXES[s] for s in ("ing", "ly", "ness", "ful")]
    else:  # every unseen word is <unk>: one representation, one tag for all
        assert not (run / "char_vocab.json").exists()
        assert len(set(labels)) == 1


def reference_vectors(
    ids: np.ndarray, embed: np.ndarray, conv: np.ndarray, bias: np.ndarray
) -> np.ndarray:
    """The documented formula in float64: each word's characters embedded, zeros beyond
    them on both sides, a convolution, ReLU, and the maximum over the word's own characters;
    zero for a padding word."""
    rows, words, _ = ids.shape
    filters, _, kernel = conv.shape
    out = np.zeros((rows, words, filters))
    for r in range(rows):
        for w in range(words):
            chars = [int(c) for c in ids[r, w] if c > 0]
            if not chars:
                continue
            half = kernel // 2
            x = np.zeros((len(chars) + 2 * half, embed.shape[1]))
            x[half : half + len(chars)] = embed[chars]
            feats = [
                np.einsum("fek,ke->f", conv, x[i : i + kernel]) + bias for i in range(len(chars))
            ]
            out[r, w] = np.maximum(np.max(feats, axis=0), 0)
    return out


def test_a_words_vector_does_not_depend_on_how_far_its_batch_pads_characters() -> None:
    rng = np.random.default_rng(0)
    symbol = char_word_vectors(mx.sym.Variable("chars"), 3, 10, embed=4, filters=5, kernel=3)
    # two sentences of 3 words; words of 1-5 characters, the third word of row 1 padding
    ids = np.zeros((2, 3, 12), dtype="f4")
    for row, col, count in [(0, 0, 5), (0, 1, 1), (0, 2, 3), (1, 0, 4), (1, 1, 2)]:
        ids[row, col, :count] = rng.integers(1, 10, size=count)
    # the padding id's own row is not zero and the biases are large: padding positions
    # would change the vectors if they were read
    embed, conv = rng.normal(size=(10, 4)), rng.normal(size=(5, 4, 3))
    bias = rng.normal(size=5) + 4
    args = {
        "char_embed_weight": mx.nd.array(embed),
        "char_conv_weight": mx.nd.array(conv),
        "char_conv_bias": mx.nd.array(bias),
    }
    want = reference_vectors(ids, embed, conv, bias)
    for width in (5, 8, 12):
        bound = symbol.bind(mx.cpu(), {"chars": mx.nd.array(ids[:, :, :width]), **args})
        got = bound.forward()[0].asnumpy()
        # float32 sums of 3 x 4 products and a bias: a few roundings at the vectors' scale
        assert_close_at_scale(got, want, roundings=3 * 4 + 2, err_msg=f"width {width}")


def test_a_character_aware_tagger_resumes_bit_identically(tmp_path: Path) -> None:
    config = write_project(tmp_path, "char_embed: 8, char_filters: 12, char_max_len: 6")
    assert invoke("fit", str(config), "--name", "straight", "--set", "fit.num_epoch=2")[0] == 0
    assert invoke("fit", str(config), "--name", "split", "--set", "fit.num_epoch=1")[0] == 0
    code, output = invoke("resume", str(tmp_path / "runs/split"), "--set", "fit.num_epoch=2")
    assert code == 0, output
    a, b = (
        mx.nd.load(str(tmp_path / f"runs/{n}/model-0002.params")) for n in ("straight", "split")
    )
    assert sorted(a) == sorted(b) and "arg:char_conv_weight" in a
    for key in a:
        np.testing.assert_array_equal(a[key].asnumpy(), b[key].asnumpy(), err_msg=key)


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("word_embed: false", "model.word_embed false needs char_embed > 0"),
        ("char_embed: 8, char_kernel: 4", "model.char_kernel must be odd"),
        ("char_embed: -1", "model.char_embed must be an integer in 0..4096"),
    ],
)
def test_impossible_character_options_are_named_at_their_line(
    tmp_path: Path, model: str, message: str
) -> None:
    config = write_project(tmp_path, model)
    code, output = invoke("check", str(config))
    assert code == ExitCode.CONFIG, output
    assert f"{config}:2: {message}" in output


LM_CONFIG = """\
experiment: {{name: {name}, seed: 3, runs_dir: {runs}}}
model: {{name: lstm_lm, num_embed: 8, num_hidden: 12, num_layers: 1, char_embed: 6,
        char_filters: 8, char_max_len: 5}}
data:
  train: {{iterator: {iterator}, source: train.txt, batch_size: 8}}
  eval: {{iterator: {iterator}, source: valid.txt, batch_size: 8}}
optimizer: {{name: adam, learning_rate: 0.01}}
fit: {{num_epoch: {epochs}}}
"""


def lm_config(folder: Path, name: str, epochs: int, iterator: str = "bucket_sentence") -> Path:
    from conftest import write_corpus

    if not (folder / "train.txt").exists():
        write_corpus(folder / "train.txt", 120, seed=1)
        write_corpus(folder / "valid.txt", 30, seed=2)
    path = folder / f"{name}.yaml"
    path.write_text(
        LM_CONFIG.format(name=name, runs=folder / "runs", epochs=epochs, iterator=iterator)
    )
    return path


def test_a_character_aware_language_model_trains_resumes_scores_and_predicts(
    tmp_path: Path,
) -> None:
    assert invoke("fit", str(lm_config(tmp_path, "straight", 2)))[0] == 0
    assert invoke("fit", str(lm_config(tmp_path, "split", 1)))[0] == 0
    code, output = invoke("resume", str(tmp_path / "runs/split"), "--set", "fit.num_epoch=2")
    assert code == 0, output
    a, b = (
        mx.nd.load(str(tmp_path / f"runs/{n}/model-0002.params")) for n in ("straight", "split")
    )
    assert "arg:char_conv_weight" in a
    for key in a:
        np.testing.assert_array_equal(a[key].asnumpy(), b[key].asnumpy(), err_msg=key)
    run = tmp_path / "runs/straight"
    assert (run / "char_vocab.json").is_file()
    code, output = invoke("score", str(run), "--json")
    assert code == 0, output
    assert json.loads(output.strip().splitlines()[-1])["metrics"]["perplexity"] > 1
    source = tmp_path / "lines.txt"
    source.write_text("the cat sat\nzebras ran far away\n", encoding="utf-8")  # "zebras": unseen
    code, output = invoke("predict", "--checkpoint", str(run), "--input", str(source),
                          "--output", str(tmp_path / "out.jsonl"))  # fmt: skip
    assert code == 0, output
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert len(records) == 2
    code, output = invoke("predict", "--checkpoint", str(run), "--input", str(source), "--output",
                          str(tmp_path / "gen.jsonl"), "--task", "generate")  # fmt: skip
    assert code == ExitCode.CONFIG and "character-aware language models" in output


def test_streams_carry_no_characters_and_say_so(tmp_path: Path) -> None:
    code, output = invoke("fit", str(lm_config(tmp_path, "stream", 1, iterator="bptt_stream")))
    assert code == ExitCode.DATA, output
    assert "read as streams (bptt_stream), whose batches carry no characters" in output
