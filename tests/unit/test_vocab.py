"""Vocabulary: special ids, deterministic order, limits, JSON round trip, bad files."""

from __future__ import annotations

import json

import pytest

from mxtrain.data.vocab import EOS, PAD, UNK, Vocab
from mxtrain.errors import DataError, ExitCode

SENTENCES = [["b", "a", "c", "a"], ["c", "a", "d"], ["b", UNK, "e"]]


def test_specials_come_first_then_count_desc_then_token() -> None:
    vocab = Vocab.build(SENTENCES)
    # a:3, b:2, c:2, d:1, e:1; ties broken alphabetically; the literal <unk> is not counted
    assert vocab.tokens == [PAD, UNK, EOS, "a", "b", "c", "d", "e"]
    assert (vocab.pad_id, vocab.unk_id, vocab.eos_id) == (0, 1, 2)
    assert len(vocab) == 8


def test_build_is_independent_of_sentence_order() -> None:
    assert Vocab.build(SENTENCES).tokens == Vocab.build(SENTENCES[::-1]).tokens


def test_min_count_and_max_size() -> None:
    assert Vocab.build(SENTENCES, min_count=2).tokens == [PAD, UNK, EOS, "a", "b", "c"]
    # max_size counts the three specials
    assert Vocab.build(SENTENCES, max_size=5).tokens == [PAD, UNK, EOS, "a", "b"]


def test_encode_decode_and_special_literals() -> None:
    vocab = Vocab.build(SENTENCES)
    assert vocab.encode(["a", "zzz", UNK, EOS]) == [3, 1, 1, 2]
    # a literal <pad> in the text must not turn into (ignored) padding
    assert vocab.encode([PAD]) == [vocab.unk_id]
    assert vocab.decode([3, 4.0, 0]) == ["a", "b", PAD]
    assert vocab.token_id("c") == 5
    assert "a" in vocab and "zzz" not in vocab
    with pytest.raises(IndexError):
        vocab.decode([len(vocab)])


def test_constructor_rejects_bad_token_lists() -> None:
    with pytest.raises(ValueError, match="start with"):
        Vocab(["a", "b"])
    with pytest.raises(ValueError, match="twice"):
        Vocab([PAD, UNK, EOS, "a", "a"])


def test_save_load_round_trip(tmp_path) -> None:
    vocab = Vocab.build([["é", " ", "x", '"q"']], level="char", lowercase=True)
    path = tmp_path / "vocab.json"
    vocab.save(path)
    loaded = Vocab.load(path)
    assert loaded == vocab
    assert loaded.tokens == vocab.tokens
    assert (loaded.level, loaded.lowercase) == ("char", True)
    assert json.loads(path.read_text(encoding="utf-8"))["version"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["vocab.json"]  # no temporary left


def _good(tmp_path) -> dict:
    path = tmp_path / "good.json"
    Vocab.build(SENTENCES).save(path)
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: "{not json", "not valid JSON"),
        (lambda d: [1, 2], "not an mxtrain vocabulary"),
        (lambda d: {**d, "version": 99}, "format version 99"),
        (lambda d: {**d, "specials": {"pad": "P"}}, "unexpected specials"),
        (lambda d: {**d, "tokens": "abc"}, '"tokens" list'),
        (lambda d: {**d, "tokens": d["tokens"][3:]}, "does not start with the special"),
        (lambda d: {**d, "tokens": [*d["tokens"], "a"]}, "token 'a' twice"),
        (lambda d: {**d, "level": 3}, '"level"'),
    ],
)
def test_load_bad_file_names_file_and_fault(tmp_path, mutate, expected) -> None:
    content = mutate(_good(tmp_path))
    path = tmp_path / "bad_vocab.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content), "utf-8")
    with pytest.raises(DataError) as info:
        Vocab.load(path)
    assert str(path) in str(info.value)
    assert expected in str(info.value)
    assert info.value.exit_code == ExitCode.DATA


def test_load_missing_directory_and_binary(tmp_path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        Vocab.load(tmp_path / "nope.json")
    with pytest.raises(DataError, match="is a directory"):
        Vocab.load(tmp_path)
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(DataError, match="not UTF-8"):
        Vocab.load(binary)
