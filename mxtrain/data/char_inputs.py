"""Each word's characters as a second input (character-aware words), for the iterators of
word sequences: ``tagged_sequences`` and ``bucket_sentence``.

A model that asks for them (``char_embed > 0``; fit, score and predict set
``DataContext.char_max_len``) gets, beside ``data`` (batch, length), an input ``chars``
(batch, length, characters) of character ids, 0 padding. The train iterator builds the
character vocabulary from its words as written (characters seen twice; the others become
``<unk>``, so the model learns that one too), kept in the run folder as ``char_vocab.json``;
eval iterators reuse it, and iterators built from a run folder load it. Each batch pads
characters to its own longest word, rounded up to ``CHAR_STEP`` and at most ``char_max_len``
(a word's first characters), so the bucket key stays the sentence length and the module
reshapes within a bucket for another width.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import mxnet as mx
import numpy as np

from mxtrain.data.base import DataContext
from mxtrain.data.vocab import Vocab
from mxtrain.errors import DataError

#: the characters' input and the run folder's character vocabulary
CHARS_INPUT = "chars"
CHAR_VOCAB_FILE = "char_vocab.json"
#: batches pad their words' characters to a multiple of this (fewer distinct input shapes)
CHAR_STEP = 4
#: characters a word needs in the training data to get an id of its own
CHAR_MIN_COUNT = 2


@dataclass(frozen=True)
class CharInputs:
    """Each word's character ids (``ids[sentence][word]``, at most ``max_len`` of them)."""

    vocab: Vocab
    max_len: int
    ids: list[list[list[int]]]
    #: ids the iterator puts after each sentence's words (its ``<eos>``): no characters
    tails: int = 0

    def flat(self) -> tuple[np.ndarray, np.ndarray]:
        """Every word's ids, (words, max_len) padded with 0, and their counts, in sentence
        order, with an all-padding row for each of a sentence's ``tails``: the layout of the
        iterator's flat word ids."""
        tails = self.tails
        total = sum(len(s) + tails for s in self.ids)
        flat = np.zeros((max(total, 1), self.max_len), dtype=np.int64)
        counts = np.zeros(max(total, 1), dtype=np.int64)
        row = 0
        for sentence in self.ids:
            for word in sentence:
                flat[row, : len(word)] = word
                counts[row] = len(word)
                row += 1
            row += tails
        return flat, counts

    def desc(self, rows: int, length: int, width: int) -> Any:
        return mx.io.DataDesc(CHARS_INPUT, (rows, length, width), np.float32, layout="NTC")

    def attach(
        self, batches: list[Any], chars: np.ndarray, longest: np.ndarray, rows: int
    ) -> list[Any]:
        """``batches`` (of ``rows`` rows of ``chars`` each, the last maybe fewer) with their
        words' characters as a second input, padded to the batch's longest word (rounded up
        to CHAR_STEP, at most max_len); ``longest``: each row's longest word."""
        for j, batch in enumerate(batches):
            lo = j * rows
            hi = lo + batch.data[0].shape[0]
            most = max(int(longest[lo:hi].max(initial=1)), 1)
            width = min(self.max_len, -(-most // CHAR_STEP) * CHAR_STEP)
            batch.data.append(mx.nd.array(chars[lo:hi, :, :width], dtype=np.float32))
            described, length = batch.provide_data[0].shape[:2]
            batch.provide_data = [*batch.provide_data, self.desc(described, length, width)]
        return batches


def padded_chars(
    flat: np.ndarray, counts: np.ndarray, idx: np.ndarray, mask: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The (rows, length, max_len) character ids of the word positions ``idx`` (those where
    ``mask`` is False: padding) and each row's longest word."""
    chars = np.where(mask[..., None], flat[idx], 0).astype(np.float32)
    longest = np.where(mask, counts[idx], 0).max(axis=1, initial=0)
    return chars, longest


def char_inputs(
    context: DataContext, sentences: Sequence[Sequence[str]], source: str, tails: int = 0
) -> CharInputs | None:
    """The characters of ``sentences``' words as written (their first ``char_max_len``) when
    the model reads them (``context.char_max_len``), else None; ``tails``: see CharInputs."""
    if not context.char_max_len:
        return None
    max_len = int(context.char_max_len)
    words = (word for sentence in sentences for word in sentence)
    vocab = char_vocabulary(context, words, source)
    ids = [[vocab.encode(word[:max_len]) for word in sentence] for sentence in sentences]
    return CharInputs(vocab, max_len, ids, tails)


def char_vocabulary(context: DataContext, words: Iterable[str], source: str) -> Vocab:
    """The character vocabulary: the train iterator's, else the run folder's file, else
    (training) built from ``words``."""
    if context.role != "train":
        train_chars = getattr(context.train, "chars", None)
        if isinstance(train_chars, CharInputs):
            return train_chars.vocab
    saved = context.artifact(CHAR_VOCAB_FILE)
    if saved is not None and saved.is_file():  # a resumed run, or its score and predict
        return Vocab.load(saved)
    if context.role == "train":
        return Vocab.build((list(w) for w in words), min_count=CHAR_MIN_COUNT, level="char")
    raise DataError(
        f"The {context.role} data {source} needs the character vocabulary the model was "
        f"trained with, but {saved or CHAR_VOCAB_FILE} does not exist.",
        hint="mxtrain fit writes it into the run folder of a model with char_embed; score and "
        "predict with that run folder.",
    )
