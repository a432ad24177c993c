"""Pretrained word vectors in the text formats of word2vec, fastText (``.vec``) and GloVe,
mapped onto a run's vocabulary (``model.pretrained_embedding``; no MXNet import).

One word a line, then its numbers, separated by spaces. word2vec and fastText files begin with
a ``count dims`` line; GloVe files do not, and their size is that of the first vector. Some
GloVe releases have words with spaces in them: the last ``dims`` fields are the numbers and
the rest is the word. The file is streamed: only the vectors of vocabulary words are kept,
whatever its size. A vocabulary word takes the vector of the same word; a lowercased
vocabulary (``lowercase: true``) also takes the vector of the first case variant in the file
(files list words by frequency, so the commonest variant) when the lowercase form has none.
Reserved tokens (``<pad>``, ``<unk>``, ``<eos>``, ``<bos>``) take no vector.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mxtrain.data.vocab import SPECIALS, Vocab
from mxtrain.errors import DataError
from mxtrain.user_files import RELATIVE_TO_CONFIG, open_file

WHAT = "word vectors file"
_FORMAT_HINT = (
    "Word vectors are read as text, one word and its numbers a line (word2vec/fastText text "
    "or GloVe); a binary word2vec file can be written as text with gensim's "
    "KeyedVectors.save_word2vec_format(path, binary=False)."
)


@dataclass
class MappedVectors:
    """The vectors of a vocabulary's words found in a file."""

    path: str
    dims: int
    vectors_read: int  # lines with a vector in the file
    rows: dict[int, np.ndarray] = field(default_factory=dict)  # vocabulary id -> vector
    words: int = 0  # vocabulary words that could take one (reserved tokens aside)

    @property
    def coverage(self) -> float:
        return len(self.rows) / self.words if self.words else 0.0

    def report(self) -> dict[str, Any]:
        """What run.json keeps."""
        return {
            "source": self.path,
            "dims": self.dims,
            "vectors_in_file": self.vectors_read,
            "vocabulary_words": self.words,
            "words_with_a_vector": len(self.rows),
        }


def map_vectors(path: Path, vocab: Vocab) -> MappedVectors:
    """The vectors of ``vocab``'s words in the file ``path`` (its reserved tokens take none).
    A DataError names the file and line of anything that is not a vector line."""
    reserved = len(SPECIALS) + len(vocab.specials)
    ids = {token: i for i, token in enumerate(vocab.tokens) if i >= reserved}
    variants: dict[str, np.ndarray] = {}  # lowercase form -> its first case variant's vector
    lowercase = bool(vocab.lowercase)
    mapped: MappedVectors | None = None
    number = 0
    with open_file(path, WHAT, missing_hint=RELATIVE_TO_CONFIG, encoding="utf-8") as handle:
        try:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue  # a blank line (the end of some files)
                fields = _fields(line)
                if mapped is None:
                    mapped = _first_line(path, number, fields)
                    if _is_header(fields):
                        continue
                word, vector = _vector(path, number, fields, mapped)
                mapped.vectors_read += 1
                wanted = ids.get(word)
                if wanted is not None and wanted not in mapped.rows:
                    mapped.rows[wanted] = vector
                elif lowercase and wanted is None:
                    variants.setdefault(word.lower(), vector)
        except UnicodeDecodeError as exc:
            raise DataError(
                f"The {WHAT} {path} is not UTF-8 text (byte {exc.start} of a read after line "
                f"{number}).",
                hint=_FORMAT_HINT,
            ) from None
    if mapped is None or mapped.vectors_read == 0:
        raise DataError(f"The {WHAT} {path} holds no vectors.", hint=_FORMAT_HINT)
    for word, i in ids.items():
        if i not in mapped.rows and word in variants:
            mapped.rows[i] = variants[word]
    mapped.words = len(ids)
    return mapped


def vector_words(path: Path, limit: int | None, lowercase: bool) -> list[str]:
    """The first ``limit`` distinct words of the file ``path`` (None: all), in file order;
    lowercased for a lowercased vocabulary. Words with spaces are left out: whitespace-split
    text never holds them."""
    words: list[str] = []
    seen: set[str] = set()
    dims = vector_size(path)
    with open_file(path, WHAT, missing_hint=RELATIVE_TO_CONFIG, encoding="utf-8") as handle:
        try:
            for number, line in enumerate(handle, start=1):
                fields = _fields(line)
                if (number == 1 and _is_header(fields)) or len(fields) != dims + 1:
                    continue  # the header, a blank line, a word with spaces
                word = fields[0].lower() if lowercase else fields[0]
                if word and word not in seen:
                    seen.add(word)
                    words.append(word)
                    if limit is not None and len(words) >= limit:
                        break
        except UnicodeDecodeError:
            raise DataError(f"The {WHAT} {path} is not UTF-8 text.", hint=_FORMAT_HINT) from None
    return words


def _is_header(fields: list[str]) -> bool:
    return len(fields) == 2 and all(f.isdigit() for f in fields)


def vector_size(path: Path) -> int:
    """The numbers per vector of the file ``path``, from its first line (the header, or
    the first vector), so a size that cannot fit is refused before the file is read."""
    with open_file(path, WHAT, missing_hint=RELATIVE_TO_CONFIG, encoding="utf-8") as handle:
        try:
            line = handle.readline()
        except UnicodeDecodeError:
            raise DataError(f"The {WHAT} {path} is not UTF-8 text.", hint=_FORMAT_HINT) from None
    if not line.strip():
        raise DataError(f"The {WHAT} {path} holds no vectors.", hint=_FORMAT_HINT)
    return _first_line(path, 1, _fields(line)).dims


def _fields(line: str) -> list[str]:
    fields = line.rstrip("\n\r").split(" ")
    if fields and fields[-1] == "":  # a trailing space (word2vec's own writer)
        fields.pop()
    return fields


def _first_line(path: Path, number: int, fields: list[str]) -> MappedVectors:
    """The file's size from its first line: a ``count dims`` header, or the first vector's."""
    if _is_header(fields):
        dims = int(fields[1])  # the count is not needed: the lines are read
        if dims < 1:
            raise DataError(
                f"{path}:{number}: the header says the vectors have {dims} numbers.",
                hint=_FORMAT_HINT,
            )
        return MappedVectors(str(path), dims, 0)
    if len(fields) < 2:
        raise DataError(
            f"{path}:{number}: a vector line holds a word and its numbers, this one "
            f"{len(fields)} field(s).",
            hint=_FORMAT_HINT,
        )
    return MappedVectors(str(path), len(fields) - 1, 0)


def _vector(
    path: Path, number: int, fields: list[str], mapped: MappedVectors
) -> tuple[str, np.ndarray]:
    dims = mapped.dims
    if len(fields) < dims + 1 or not fields[0]:
        raise DataError(
            f"{path}:{number}: expected a word and {dims} numbers (the size the file's "
            f"first line set), found {len(fields)} field(s).",
            hint=_FORMAT_HINT,
        )
    word = " ".join(fields[: len(fields) - dims])
    try:
        values = [float(f) for f in fields[len(fields) - dims :]]
    except ValueError:
        bad = next(f for f in fields[len(fields) - dims :] if not _is_number(f))
        raise DataError(
            f"{path}:{number}: {bad[:40]!r} in the vector of {word[:40]!r} is not a number.",
            hint=_FORMAT_HINT,
        ) from None
    if not all(math.isfinite(v) for v in values):
        raise DataError(
            f"{path}:{number}: the vector of {word[:40]!r} holds an infinite or NaN value.",
            hint="Remove that line or fix the value.",
        )
    return word, np.asarray(values, dtype=np.float32)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
