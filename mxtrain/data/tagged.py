"""Bucketed token/label batches for sequence labelling, from CoNLL or CoNLL-U files.

Every sentence becomes token ids (data) and label ids (label) of the same length, padded
with ``<pad>`` (id 0 in both vocabularies) to the smallest bucket that holds it; the loss and
the metrics skip label 0. A batch is ``batch_size`` sentences; a bucket's last batch is
filled up with all-padding rows (``batch.pad`` counts them). The order of an epoch depends
only on ``(seed, epoch)``: a resumed run replays it.

Vocabularies: the train iterator builds the token vocabulary (:class:`~mxtrain.data.vocab.Vocab`;
``vocab``, saved as vocab.json by ``mxtrain fit``) and the label vocabulary
(:class:`~mxtrain.data.label_vocab.LabelVocab`; ``label_vocab``, saved as label_vocab.json
through :meth:`TaggedSequenceIter.artifacts`). Eval iterators reuse the train iterator's;
built from a run folder (score, predict, resume), they load the saved files (``vocab_file``,
and ``label_vocab.json`` from ``DataContext.artifacts_dir`` or beside ``vocab_file``).
Unknown tokens become ``<unk>``; labels the training data did not have become the label
``<unk>`` (they count as errors) and are counted and reported.

Roles as for ``bucket_sentence``: ``eval`` reuses the train iterator's buckets (or
``DataContext.buckets``); ``predict`` reads every sentence in file order, ignores the label
column and ``max_sentences``, and gives a sentence longer than every bucket a bucket of its own
(batches carry ``index``, the 0-based sentence of each row).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from itertools import chain
from pathlib import Path
from typing import Any

import mxnet as mx
import numpy as np

from mxtrain.data import batching
from mxtrain.data.base import TASK_TAG, DataContext, DataInfo
from mxtrain.data.bucket_sentence import automatic_buckets
from mxtrain.data.char_inputs import CHAR_VOCAB_FILE, CharInputs, char_inputs, padded_chars
from mxtrain.data.conll import TaggedSentence, read_conll
from mxtrain.data.label_vocab import FILE_NAME as LABEL_VOCAB_FILE
from mxtrain.data.label_vocab import LabelVocab
from mxtrain.data.tagged_options import TaggedSequencesOptions
from mxtrain.data.vocab import Vocab
from mxtrain.errors import DataError

log = logging.getLogger(__name__)

LEVEL = "word"  # recorded in the token vocabulary: tokens are whole words


def build_tagged_iter(options: TaggedSequencesOptions, context: DataContext) -> TaggedSequenceIter:
    """Read ``options.source`` and bucket it for ``context.role`` (train, eval, predict)."""
    predict = context.role == "predict"
    if predict and options.max_sentences is not None:
        options = dataclasses.replace(options, max_sentences=None)  # every sentence a record
    source, fmt, sentences = read_conll(
        options, context.base_dir, labels=not predict, max_sentences=options.max_sentences
    )
    vocab = _token_vocab(options, context, sentences, source)
    label_vocab = _label_vocab(context, sentences, source)

    lower = options.lowercase
    token_ids = [vocab.encode(_lowered(s.tokens, lower)) for s in sentences]
    # the words as written: case tells a tagger much
    chars = char_inputs(context, [s.tokens for s in sentences], source)
    label_ids: list[list[int]] | None = None
    unknown: dict[str, int] = {}
    if not predict:
        label_ids = []
        for s in sentences:
            assert s.labels is not None
            ids = label_vocab.encode(s.labels)
            if label_vocab.unk_id in ids:
                for label, i in zip(s.labels, ids, strict=True):
                    if i == label_vocab.unk_id:
                        unknown[label] = unknown.get(label, 0) + 1
            label_ids.append(ids)
    if unknown:
        shown = ", ".join(
            f"{k!r} ({v})" for k, v in sorted(unknown.items(), key=lambda kv: (-kv[1], kv[0]))
        )
        log.warning(
            "%s: %d tokens have labels the training data does not have; they become the label "
            "<unk> and count as errors: %s",
            source,
            sum(unknown.values()),
            shown if len(shown) < 300 else shown[:300] + " ...",
        )

    lengths = np.asarray([len(ids) for ids in token_ids], dtype=np.int64)
    buckets = batching.choose_buckets(
        options.buckets,
        context,
        source,
        lambda: automatic_buckets(
            lengths,
            rule=options.auto_buckets,
            num_buckets=options.num_buckets,
            max_padding=options.max_padding,
            batch_size=options.batch_size,
        ),
    )
    data_iter = TaggedSequenceIter(
        token_ids,
        label_ids,
        vocab=vocab,
        label_vocab=label_vocab,
        buckets=buckets,
        batch_size=options.batch_size,
        long_sentences="bucket" if predict else options.long_sentences,
        shuffle=options.shuffle and context.role == "train",
        seed=context.seed,
        source=source,
        file_format=fmt,
        unknown_labels=unknown,
        sentences=sentences if predict else None,
        min_batch=context.min_batch,
        chars=chars,
    )
    if context.role == "train":
        batching.warn_about_padding(
            log, source, data_iter.stats, buckets=options.buckets, rule=options.auto_buckets
        )
    return data_iter


def _lowered(tokens: Sequence[str], lowercase: bool) -> Sequence[str]:
    return [t.lower() for t in tokens] if lowercase else tokens


def _token_vocab(
    options: TaggedSequencesOptions,
    context: DataContext,
    sentences: list[TaggedSentence],
    source: str,
) -> Vocab:
    vocab_file = context.vocab_file
    if vocab_file is None and context.role == "train" and options.vocab is not None:
        # a saved vocab.json (e.g. a pretrained model's, to reuse its embedding rows); a
        # resumed run's own file (context.vocab_file) wins
        vocab_file = Path(options.vocab).expanduser()
    if vocab_file is not None and not Path(vocab_file).is_absolute():
        vocab_file = context.base_dir / vocab_file
    train_vocab = getattr(context.train, "vocab", None) if context.role != "train" else None
    if isinstance(train_vocab, Vocab):
        vocab, origin = train_vocab, "the training data's vocabulary"
    elif vocab_file is not None:
        vocab, origin = Vocab.load(vocab_file), f"the vocabulary file {vocab_file}"
    elif context.role == "train":
        return Vocab.build(
            (_lowered(s.tokens, options.lowercase) for s in sentences),
            min_count=options.min_count,
            max_size=options.max_vocab,
            level=LEVEL,
            lowercase=options.lowercase,
            extra=context.extra_words,
        )
    else:
        raise DataError(
            f"The {context.role} data {source} needs the training vocabulary, but there is no "
            "train iterator with one and no vocabulary file.",
            hint="Score or predict with a run folder (it holds vocab.json and label_vocab.json).",
        )
    if vocab.level is not None and vocab.level != LEVEL:
        raise DataError(
            f"The data {source} is read as words, but {origin} was built at level {vocab.level!r}.",
            hint="Give a word-level vocabulary (the vocab.json of a word-level run).",
        )
    vocab.check_lowercase(options.lowercase, source, origin)
    return vocab


def _label_vocab(context: DataContext, sentences: list[TaggedSentence], source: str) -> LabelVocab:
    if context.role != "train":
        train_labels = getattr(context.train, "label_vocab", None)
        if isinstance(train_labels, LabelVocab):
            return train_labels
    saved = context.artifact(LABEL_VOCAB_FILE)
    if context.role == "train":
        if saved is not None and saved.is_file():  # resuming a run: keep its label ids
            return LabelVocab.load(saved)
        return LabelVocab.build(s.labels for s in sentences if s.labels is not None)
    if saved is None:
        raise DataError(
            f"The {context.role} data {source} needs the training label vocabulary, but there "
            "is no train iterator with one and no run folder to load it from.",
            hint="Score or predict with a run folder (it holds vocab.json and "
            f"{LABEL_VOCAB_FILE}).",
        )
    if not saved.is_file():
        raise DataError(
            f"The {context.role} data {source} needs the label vocabulary the model was "
            f"trained with, but {saved} does not exist.",
            hint="mxtrain fit writes it into the run folder from the train iterator's "
            "artifacts(); without it the model's outputs cannot be named: train again.",
        )
    return LabelVocab.load(saved)


class TaggedSequenceIter(batching.PrebuiltBatchIter):
    """Batches of (data, softmax_label), shape (batch_size, bucket), float32 ids.

    ``token_ids`` and ``label_ids`` hold one list per sentence (``label_ids`` None: labels
    unknown, as when predicting; the label input is then all ``<pad>``). Each batch has
    ``bucket_key``, ``pad`` (all-padding rows at the end), ``num_tokens`` (real tokens) and
    ``index`` (the sentence of each row, -1 for padding rows). Call ``set_epoch(e)`` and then
    ``reset()`` to get epoch ``e``'s order.

    ``long_sentences``: what happens to sentences longer than the largest bucket: ``split``
    into chunks, ``truncate``, ``drop``, or ``bucket`` (each gets a bucket of its own beyond
    the largest, see :func:`~mxtrain.data.batching.long_bucket`; for prediction).
    """

    def __init__(
        self,
        token_ids: Sequence[Sequence[int]],
        label_ids: Sequence[Sequence[int]] | None,
        *,
        vocab: Vocab,
        label_vocab: LabelVocab,
        buckets: Sequence[int],
        batch_size: int,
        long_sentences: str = "split",
        shuffle: bool = False,
        seed: int = 0,
        source: str = "<sentences>",
        file_format: str = "conll",
        unknown_labels: dict[str, int] | None = None,
        sentences: Sequence[TaggedSentence] | None = None,
        data_name: str = "data",
        label_name: str = "softmax_label",
        min_batch: int = 1,
        chars: CharInputs | None = None,
    ) -> None:
        super().__init__(batch_size)
        buckets = batching.check_bucket_arguments(buckets, batch_size, long_sentences)
        self.min_batch = max(1, int(min_batch))
        if label_ids is not None and len(label_ids) != len(token_ids):
            raise ValueError(f"{len(token_ids)} token sequences but {len(label_ids)} label ones")
        self.batch_size = batch_size
        self.buckets = buckets
        self.default_bucket_key = buckets[-1]
        self.vocab = vocab
        self.label_vocab = label_vocab
        self.pad_id = vocab.pad_id
        if label_vocab.pad_id != vocab.pad_id:
            raise ValueError("the token and label vocabularies must share the padding id")
        self.chars = chars
        self.data_info = DataInfo(
            vocab_size=len(vocab),
            num_classes=len(label_vocab),
            pad_id=vocab.pad_id,
            task=TASK_TAG,
            char_vocab_size=len(chars.vocab) if chars is not None else None,
        )
        self.source = source
        self.file_format = file_format
        self.shuffle = shuffle
        self.seed = int(seed)
        self.unknown_labels = dict(unknown_labels or {})
        # predicting: the sentences as read (original tokens, file lines) for the records
        self.sentences = list(sentences) if sentences is not None else None
        self._set_inputs(data_name, label_name)
        if chars is not None:
            rows = self.provide_data[0].shape[0]
            self.provide_data.append(chars.desc(rows, self.default_bucket_key, chars.max_len))

        self._pack(token_ids, label_ids, long_sentences)
        self.reset()

    def artifacts(self) -> dict[str, Callable[[Path], None]]:
        """Files to keep in the run folder besides vocab.json: ``{file name: save(path)}``."""
        files: dict[str, Callable[[Path], None]] = {LABEL_VOCAB_FILE: self.label_vocab.save}
        if self.chars is not None:
            files[CHAR_VOCAB_FILE] = self.chars.vocab.save
        return files

    def _desc(self, name: str, length: int) -> Any:
        rows = getattr(self, "bucket_batch_sizes", {}).get(length, self.batch_size)
        return mx.io.DataDesc(name, (rows, length), np.float32, layout="NT")

    def _pack(
        self,
        token_ids: Sequence[Sequence[int]],
        label_ids: Sequence[Sequence[int]] | None,
        policy: str,
    ) -> None:
        """Cut sentences into (start, length) chunks of flat id arrays, pad into buckets."""
        num = len(token_ids)
        sizes, flat, offsets = batching.flatten_sequences(token_ids)
        total_tokens = flat.size
        if label_ids is None:
            flat_labels = np.full(total_tokens, self.label_vocab.pad_id, dtype=np.int64)
        else:
            flat_labels = np.fromiter(
                chain.from_iterable(label_ids), dtype=np.int64, count=total_tokens
            )
            if flat_labels.size != total_tokens:
                raise ValueError("every sentence needs as many labels as tokens")
        largest = self.default_bucket_key

        long = sizes > largest
        chunk_start, chunk_len, chunk_row, which, lost, self.buckets = batching.place_in_buckets(
            offsets, sizes, self.buckets, largest, policy
        )
        if chunk_len.size == 0:
            raise DataError(
                f"None of the {num} sentences in {self.source} can be used: all are longer "
                f"than the largest bucket ({largest}) and long_sentences is drop.",
                hint="Use long_sentences: split or truncate, or larger buckets.",
            )

        pad = self.pad_id
        # predict's buckets beyond the largest: a batch of just their sentences, within the
        # default bucket's positions (see BucketSentenceIter), at least one row per device
        found = np.bincount(which, minlength=len(self.buckets))
        room = self.batch_size * largest
        self.bucket_batch_sizes = {
            length: (
                batching.long_bucket_rows(int(found[b]), length, room, self.min_batch)
                if length > largest
                else self.batch_size
            )
            for b, length in enumerate(self.buckets)
        }
        flat_chars = self.chars.flat() if self.chars is not None else None
        self._packed: list[tuple[int, int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        #: per packed bucket, with characters: (batch rows, length, max_len) ids and each
        #: row's longest word
        self._packed_chars: list[tuple[np.ndarray, np.ndarray] | None] = []
        counts: dict[int, int] = {}
        batches_per_bucket: dict[int, int] = {}
        unk = 0
        unk_labels = 0
        for b, length in enumerate(self.buckets):
            sel = which == b
            n = int(sel.sum())
            counts[length] = n
            bsz = self.bucket_batch_sizes[length]
            nbatch = -(-n // bsz)
            batches_per_bucket[length] = nbatch
            if n == 0:
                continue
            total = nbatch * bsz  # padded up to whole batches with all-pad rows
            pos = np.arange(length)
            mask = np.zeros((total, length), dtype=bool)
            mask[:n] = pos[None, :] < chunk_len[sel][:, None]
            idx = np.zeros((total, length), dtype=np.int64)
            idx[:n] = chunk_start[sel][:, None] + pos[None, :]
            idx = np.minimum(idx, max(total_tokens - 1, 0))
            data = np.where(mask, flat[idx], pad).astype(np.float32)
            label = np.where(mask, flat_labels[idx], self.label_vocab.pad_id).astype(np.float32)
            row_tokens = mask.sum(axis=1)
            unk += int((data[mask] == self.vocab.unk_id).sum())
            unk_labels += int((label[mask] == self.label_vocab.unk_id).sum())
            index = np.full(total, -1, dtype=np.int64)
            index[:n] = chunk_row[sel]
            self._packed.append((length, n, data, label, row_tokens, index))
            self._packed_chars.append(
                None if flat_chars is None else padded_chars(*flat_chars, idx, mask)
            )

        tokens = int(sum(p[4].sum() for p in self._packed))
        positions = sum(p[2].size for p in self._packed)
        self.num_batches = sum(batches_per_bucket.values())
        self.stats: dict[str, Any] = {
            "sentences": num,
            "sequences": int(chunk_len.size),
            "tokens": tokens,
            "long_sentences": int(long.sum()),
            "long_policy": policy,
            "long_tokens_lost": lost,
            "padding_ratio": 1.0 - tokens / positions,
            "unk_ratio": unk / tokens if tokens else 0.0,
            "unk_labels": unk_labels,
            "bucket_counts": counts,
            "bucket_batches": batches_per_bucket,
        }
        batching.log_long_sentences(log, self.source, self.stats, largest)

    def _epoch_batches(self, rng: np.random.Generator | None) -> list[Any]:
        batches = []
        for (length, n, data, label, row_tokens, index), packed_chars in zip(
            self._packed, self._packed_chars, strict=True
        ):
            if rng is not None:
                perm = np.concatenate([rng.permutation(n), np.arange(n, data.shape[0])])
                data, label, row_tokens, index = (
                    data[perm],
                    label[perm],
                    row_tokens[perm],
                    index[perm],
                )
                if packed_chars is not None:
                    packed_chars = (packed_chars[0][perm], packed_chars[1][perm])
            made = batching.bucket_batches(
                data,
                label,
                row_tokens,
                index,
                length=length,
                batch_size=self.bucket_batch_sizes[length],
                real_rows=n,
                desc_data=[self._desc(self.data_name, length)],
                desc_label=[self._desc(self.label_name, length)],
            )
            if packed_chars is not None and self.chars is not None:
                made = self.chars.attach(made, *packed_chars, self.bucket_batch_sizes[length])
            batches += made
        return batches

    def describe(self) -> str:
        """One line for the log."""
        s = self.stats
        labels = len(self.label_vocab) - 2
        return (
            f"{self.source} ({self.file_format}): {s['sentences']} sentences -> "
            f"{s['sequences']} sequences, {s['tokens']} tokens, vocab {len(self.vocab)}, "
            f"unk {s['unk_ratio']:.1%}; {labels} labels, unknown labels: {s['unk_labels']}; "
            f"buckets {self.buckets}; {self.num_batches} batches of {self.batch_size}, "
            f"padding {s['padding_ratio']:.1%}; long sentences (> {self.default_bucket_key}): "
            f"{s['long_sentences']} ({s['long_policy']}, {s['long_tokens_lost']} tokens lost)"
        )
