"""Word vectors files (word2vec/fastText text, GloVe) mapped onto a vocabulary, and the clear
errors for files that are not such."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mxtrain.data.vocab import Vocab
from mxtrain.data.word_vectors import map_vectors, vector_size, vector_words
from mxtrain.errors import DataError

VOCAB = Vocab(["<pad>", "<unk>", "<eos>", "the", "cat", "new york", "sat"], lowercase=True)


def write(tmp_path: Path, text: str, name: str = "vectors.txt") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_a_word2vec_file_with_a_header_maps_the_vocabulary_words(tmp_path: Path) -> None:
    path = write(tmp_path, "4 3\nthe 1 2 3 \ndog 4 5 6 \ncat -1 0.5 1e-2 \n<unk> 9 9 9 \n")
    assert vector_size(path) == 3
    mapped = map_vectors(path, VOCAB)
    assert mapped.dims == 3 and mapped.vectors_read == 4 and mapped.words == 4
    assert sorted(mapped.rows) == [3, 4]  # the reserved <unk> takes no vector
    np.testing.assert_array_equal(mapped.rows[3], np.float32([1, 2, 3]))
    np.testing.assert_array_equal(mapped.rows[4], np.float32([-1, 0.5, 0.01]))
    assert mapped.coverage == 0.5
    assert mapped.report()["words_with_a_vector"] == 2


def test_a_glove_file_has_no_header_and_may_have_words_with_spaces(tmp_path: Path) -> None:
    path = write(tmp_path, "the 0.1 0.2\nnew york 1.5 -2\nsat 3 4\n\n")
    assert vector_size(path) == 2
    mapped = map_vectors(path, VOCAB)
    assert mapped.dims == 2 and mapped.vectors_read == 3
    np.testing.assert_array_equal(mapped.rows[5], np.float32([1.5, -2]))
    assert sorted(mapped.rows) == [3, 5, 6]


def test_a_lowercased_vocabulary_takes_the_first_case_variant_unless_the_word_has_one(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, "Cat 1 1\nCAT 2 2\nThe 3 3\nthe 4 4\n")
    mapped = map_vectors(path, VOCAB)
    np.testing.assert_array_equal(mapped.rows[4], np.float32([1, 1]))  # Cat, the first variant
    np.testing.assert_array_equal(mapped.rows[3], np.float32([4, 4]))  # the exact word wins
    cased = Vocab(["<pad>", "<unk>", "<eos>", "the", "cat"], lowercase=False)
    assert sorted(map_vectors(path, cased).rows) == [3]  # no variants for a cased vocabulary


def test_a_word_listed_twice_keeps_its_first_vector(tmp_path: Path) -> None:
    mapped = map_vectors(write(tmp_path, "cat 1 2\ncat 3 4\n"), VOCAB)
    np.testing.assert_array_equal(mapped.rows[4], np.float32([1, 2]))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("the 1 2\ncat 1\n", "vectors.txt:2: expected a word and 2 numbers"),
        ("the 1 2\ncat 1 x\n", "vectors.txt:2: 'x' in the vector of 'cat' is not a number"),
        ("the 1 2\ncat 1 inf\n", "vectors.txt:2: the vector of 'cat' holds an infinite or NaN"),
        ("the 1 2\ncat nan 1\n", "vectors.txt:2: the vector of 'cat' holds an infinite or NaN"),
        ("3 0\n", "vectors.txt:1: the header says the vectors have 0 numbers"),
        ("2 3\n", "holds no vectors"),
        ("", "holds no vectors"),
        ("\n\n", "holds no vectors"),
        ("word\n", "vectors.txt:1: a vector line holds a word and its numbers, this one 1"),
    ],
)
def test_what_is_not_a_vectors_file_is_named_with_its_line(
    tmp_path: Path, text: str, message: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(DataError) as caught:
        vector_size(path)
        map_vectors(path, VOCAB)
    assert message in caught.value.message


def test_a_binary_file_and_a_missing_one_are_refused_clearly(tmp_path: Path) -> None:
    binary = tmp_path / "vectors.bin"
    binary.write_bytes(b"2 2\nthe \x8f\xc2\x00\x01\xff\xfe\x00\x00\n")
    with pytest.raises(DataError) as caught:
        map_vectors(binary, VOCAB)
    assert "is not UTF-8 text" in caught.value.message
    assert "binary=False" in (caught.value.hint or "")
    with pytest.raises(DataError) as caught:
        vector_size(tmp_path / "absent.vec")
    assert "word vectors file" in caught.value.message and "does not exist" in caught.value.message


def test_the_vectors_words_join_a_built_vocabulary_after_its_own(tmp_path: Path) -> None:
    path = write(tmp_path, "3 2\nThe 1 1\nnew york 2 2\nzebra 3 3\nthe 4 4\nquark 5 5\n")
    assert vector_words(path, None, lowercase=True) == ["the", "zebra", "quark"]
    assert vector_words(path, 2, lowercase=False) == ["The", "zebra"]
    vocab = Vocab.build([["cat", "the", "cat"]], max_size=4, extra=["the", "zebra", "<unk>"])
    # max_size keeps "cat" only; "the" then joins from the vectors; reserved tokens stay once
    assert vocab.tokens == ["<pad>", "<unk>", "<eos>", "cat", "the", "zebra"]


def test_a_glove_file_of_one_number_vectors_has_no_header_line_to_skip(tmp_path: Path) -> None:
    mapped = map_vectors(write(tmp_path, "the 0.5\ncat 2\n"), VOCAB)
    assert mapped.dims == 1 and mapped.vectors_read == 2
    np.testing.assert_array_equal(mapped.rows[3], np.float32([0.5]))
