"""Cutting one bucket's padded matrices into DataBatches (shared by the sequence iterators)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from itertools import chain
from typing import Any

import mxnet as mx
import numpy as np

#: Buckets beyond the largest (predict) grow in steps of 1/LONG_BUCKET_STEPS of the largest.
LONG_BUCKET_STEPS = 4


log = logging.getLogger(__name__)


def choose_buckets(
    explicit: Sequence[int] | str,
    context: Any,
    source: str,
    derive: Callable[[], list[int]],
) -> list[int]:
    """The buckets of a sequence iterator: the config's list (``explicit``), else for eval and
    predict the train iterator's (or the run's recorded ones, ``context.buckets``), for a
    resumed train iterator the recorded ones, else ``derive()`` from the data. An explicit list
    whose largest bucket exceeds the train iterator's is warned about: the model then binds a
    shape bigger than its default bucket.
    """
    train = context.train if context.role != "train" else None
    if not isinstance(explicit, str):  # a list of lengths; otherwise "auto"
        buckets = list(explicit)
        train_largest = getattr(train, "default_bucket_key", None)
        if train_largest is None and context.buckets and context.role != "train":
            train_largest = max(context.buckets)
        if isinstance(train_largest, int) and buckets[-1] > train_largest:
            log.warning(
                "%s: largest eval bucket %d exceeds the train iterator's %d; the model binds a "
                "bigger shape than its default bucket, which costs memory",
                source,
                buckets[-1],
                train_largest,
            )
        return buckets
    if context.role != "train":
        known = getattr(train, "buckets", None) or None
        if known is None and context.buckets:
            known = list(context.buckets)
        if known:
            return sorted(int(b) for b in known)
    elif context.buckets:
        # a resumed run keeps the buckets it was trained with, even where a newer mxtrain
        # derives other ones: its batches, and so its saved position, stay the same
        return sorted(int(b) for b in context.buckets)
    return derive()


def long_bucket(length: int, largest: int) -> int:
    """The bucket a predict iterator gives a sentence of ``length`` data tokens > ``largest``.

    The length rounded up to ``largest + j * step`` with ``step = ceil(largest / 4)``: at most
    a quarter of the largest bucket is padding, and long sentences of similar lengths share
    a bucket (each extra bucket binds its own executor memory).
    """
    step = max(1, math.ceil(largest / LONG_BUCKET_STEPS))
    return largest + step * math.ceil((length - largest) / step)


def long_bucket_rows(sequences: int, length: int, room: int, min_batch: int = 1) -> int:
    """Rows per batch of a predict bucket beyond the largest: just its ``sequences``, at most
    ``room // length`` (the default bucket's positions, so it binds in that memory), at least
    ``min_batch`` (one row per device)."""
    return max(min_batch, max(1, min(sequences, room // length)))


def last_batch_rows(last_batch: str, rows: int, nbatch: int, bsz: int, min_batch: int) -> int:
    """Rows of a part's last batch when the part holds ``rows`` real rows in ``nbatch``
    batches of ``bsz``: all ``bsz`` with ``last_batch: pad`` (or no batch), else just the
    remaining real rows, at least ``min_batch`` (one per device) and at most ``bsz``."""
    if last_batch == "pad" or nbatch == 0:
        return bsz
    return min(bsz, max(min_batch, rows - (nbatch - 1) * bsz))


def bucket_batches(
    data: np.ndarray,
    label: np.ndarray,
    row_tokens: np.ndarray,
    index: np.ndarray,
    *,
    length: int,
    batch_size: int,
    real_rows: int,
    desc_data: list[Any],
    desc_label: list[Any],
    last_descs: tuple[list[Any], list[Any]] | None = None,
) -> list[Any]:
    """DataBatches of ``batch_size`` rows over padded matrices of one bucket.

    The matrices hold ``real_rows`` real rows followed by padding rows. Every batch but the
    last has ``batch_size`` rows; the last has the rest (``last_descs`` describe it when
    that is fewer). Each batch carries ``pad`` (its padding rows), ``index`` (source line of
    each row, -1 for padding), ``bucket_key`` and ``num_tokens`` (the real label tokens,
    counted here once so ``next()`` does no work).
    """
    nd_data = mx.nd.array(data, dtype=np.float32)
    nd_label = mx.nd.array(label, dtype=np.float32)
    total = data.shape[0]
    starts = np.arange(0, total, batch_size)
    tokens = np.add.reduceat(row_tokens, starts) if total else np.zeros(0, dtype=np.int64)
    batches = []
    for j, lo in enumerate(starts):
        hi = min(total, int(lo) + batch_size)
        descs = (desc_data, desc_label)
        if hi - lo < batch_size and last_descs is not None:
            descs = last_descs
        batch = mx.io.DataBatch(
            data=[nd_data[lo:hi]],
            label=[nd_label[lo:hi]],
            pad=max(0, hi - max(int(lo), real_rows)),
            index=index[lo:hi],
            bucket_key=length,
            provide_data=descs[0],
            provide_label=descs[1],
        )
        batch.num_tokens = int(tokens[j])
        batches.append(batch)
    return batches


def check_bucket_arguments(buckets: Sequence[int], batch_size: int, policy: str) -> list[int]:
    """The sorted, distinct bucket lengths; ``ValueError`` on arguments no iterator can use."""
    lengths = sorted({int(b) for b in buckets})
    if not lengths or lengths[0] < 1:
        raise ValueError(f"buckets must be positive lengths, got {lengths}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if policy not in ("split", "truncate", "drop", "bucket"):
        raise ValueError(f"unknown long_sentences policy {policy!r}")
    return lengths


def flatten_sequences(
    sequences: Sequence[Sequence[int]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sizes, flat ids, offsets): every sequence's ids in one int64 array and where each starts."""
    sizes = np.fromiter((len(s) for s in sequences), dtype=np.int64, count=len(sequences))
    flat = np.fromiter(chain.from_iterable(sequences), dtype=np.int64, count=int(sizes.sum()))
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    return sizes, flat, offsets


def log_long_sentences(
    logger: logging.Logger, source: str, stats: dict[str, Any], largest: int
) -> None:
    """Say how many sentences were longer than the largest bucket and what that cost."""
    if stats["long_sentences"]:
        logger.info(
            "%s: %d sentences longer than %d tokens (%s), %d tokens lost",
            source,
            stats["long_sentences"],
            largest,
            stats["long_policy"],
            stats["long_tokens_lost"],
        )


#: a train iterator whose batches are more padding than this says so, with the key to change
PADDING_WARNING = 0.2


def warn_about_padding(
    logger: logging.Logger,
    source: str,
    stats: dict[str, Any],
    *,
    buckets: Sequence[int] | str,
    rule: str,
    batch_key: str = "batch_size",
) -> None:
    """Warn when more than :data:`PADDING_WARNING` of the positions a train iterator computes
    are padding, naming the data.train key that would lower it."""
    share = float(stats["padding_ratio"])
    if share <= PADDING_WARNING:
        return
    rounding = stats.get("bucket_padding")
    if not isinstance(buckets, str):
        advice = "set data.train.buckets: auto with auto_buckets: padding"
    elif rule != "padding":
        advice = "set data.train.auto_buckets: padding (the fewest buckets within max_padding)"
    elif rounding is not None and rounding > share / 2:
        advice = "raise data.train.num_buckets (or set it to null)"
    else:
        advice = f"most of it fills each bucket's last batch: lower data.train.{batch_key}"
    where = "" if rounding is None else f" ({rounding:.1%} from rounding lengths up to buckets)"
    logger.warning(
        "%s: %.1f%% of the positions computed are padding%s, which costs as much time as "
        "real tokens; %s",
        source,
        100 * share,
        where,
        advice,
    )


def chunk_sequences(
    offsets: np.ndarray, lengths: np.ndarray, largest: int, policy: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, list[int]]:
    """Apply the long-sequence policy: which (start, length) chunks go into buckets.

    ``offsets``/``lengths`` locate each sequence's tokens in one flat array; sequences of
    length 0 are left out (the caller counts them). Sequences longer than ``largest`` are
    ``split`` into chunks of at most ``largest``, ``truncate``d to it, given a ``bucket`` of
    their own (predict keeps every line whole), or dropped (``drop``). Returns the chunk
    starts, lengths and source rows, the number of tokens lost, and the extra bucket keys the
    ``bucket`` policy needs.
    """
    fits = (lengths >= 1) & (lengths <= largest)
    long_ids = np.flatnonzero(lengths > largest)
    starts, lens, rows = [offsets[fits]], [lengths[fits]], [np.flatnonzero(fits)]
    lost = 0
    extra: list[int] = []
    if policy == "split":
        for i in long_ids:  # a loop over long sequences only, not over tokens
            k = np.arange(0, lengths[i], largest)
            starts.append(offsets[i] + k)
            lens.append(np.minimum(largest, lengths[i] - k))
            rows.append(np.full(k.size, i))
    elif policy == "truncate":
        starts.append(offsets[long_ids])
        lens.append(np.full(long_ids.size, largest))
        rows.append(long_ids)
        lost = int((lengths[long_ids] - largest).sum())
    elif policy == "bucket":
        starts.append(offsets[long_ids])
        lens.append(lengths[long_ids])
        rows.append(long_ids)
        extra = sorted({long_bucket(int(n), largest) for n in lengths[long_ids]})
    else:
        lost = int(lengths[long_ids].sum())
    return (
        np.concatenate(starts).astype(np.int64),
        np.concatenate(lens).astype(np.int64),
        np.concatenate(rows).astype(np.int64),
        lost,
        extra,
    )


def sort_into_buckets(
    chunk_start: np.ndarray, chunk_len: np.ndarray, chunk_row: np.ndarray, buckets: Sequence[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The chunks of :func:`chunk_sequences` in source order (the chunks of a split sentence
    stay adjacent inside their bucket), and the index of the smallest bucket holding each."""
    order = np.lexsort((chunk_start, chunk_row))
    chunk_start, chunk_len, chunk_row = chunk_start[order], chunk_len[order], chunk_row[order]
    which = np.searchsorted(buckets, chunk_len, side="left")
    return chunk_start, chunk_len, chunk_row, which


def place_in_buckets(
    offsets: np.ndarray, lengths: np.ndarray, buckets: list[int], largest: int, policy: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, list[int]]:
    """:func:`chunk_sequences` then :func:`sort_into_buckets`: the chunks' starts, lengths,
    source rows and bucket indices, the tokens lost, and the buckets (``buckets`` plus those
    the ``bucket`` policy adds). No chunk at all is the caller's error to report."""
    chunk_start, chunk_len, chunk_row, lost, extra = chunk_sequences(
        offsets, lengths, largest, policy
    )
    if extra:
        buckets = [*buckets, *extra]
    chunk_start, chunk_len, chunk_row, which = sort_into_buckets(
        chunk_start, chunk_len, chunk_row, buckets
    )
    return chunk_start, chunk_len, chunk_row, which, lost, buckets


class PrebuiltBatchIter(mx.io.DataIter):
    """The part the sequence iterators share: one epoch's batches built at ``reset()``.

    Subclasses set ``seed``, ``shuffle``, ``stats``, ``num_batches`` and ``default_bucket_key``
    and implement ``_desc`` (an input's description in a bucket) and ``_epoch_batches(rng)``:
    one epoch's batches bucket by bucket, rows permuted with ``rng`` (None: in reading order).
    The epoch's order depends on (seed, epoch) alone, batches are shuffled across buckets here,
    and an unshuffled or unchanged epoch reuses what was built.
    """

    seed: int
    shuffle: bool
    num_batches: int
    stats: dict[str, Any]
    default_bucket_key: int

    def __init__(self, batch_size: int) -> None:
        super().__init__(batch_size)
        self.epoch = 0
        self._batches: list[Any] = []
        self._built_epoch: int | None = None
        self._cursor = 0

    @property
    def num_sentences(self) -> int:
        """Sentences (text lines, empty ones included) read from the source: ``index`` values
        are below it."""
        return int(self.stats["sentences"])

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next ``reset()`` produces."""
        self.epoch = int(epoch)

    def reset(self) -> None:
        """Start the epoch set by ``set_epoch``; its order depends on (seed, epoch) alone."""
        self._cursor = 0
        if self._batches and (not self.shuffle or self._built_epoch == self.epoch):
            return  # the same order again: the prebuilt batches are still valid
        rng = (
            np.random.default_rng([self.seed % 2**64, self.epoch % 2**64]) if self.shuffle else None
        )
        batches = self._epoch_batches(rng)
        if rng is not None:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        self._batches = batches
        self._built_epoch = self.epoch

    def _set_inputs(self, data_name: str, label_name: str) -> None:
        """Name the model's inputs and describe them in the default bucket."""
        self.data_name = data_name
        self.label_name = label_name
        self.provide_data = [self._desc(data_name, self.default_bucket_key)]
        self.provide_label = [self._desc(label_name, self.default_bucket_key)]

    def _desc(self, name: str, length: int) -> Any:
        raise NotImplementedError

    def _epoch_batches(self, rng: np.random.Generator | None) -> list[Any]:
        raise NotImplementedError

    def next(self) -> Any:
        """The next prebuilt batch."""
        if self._cursor >= len(self._batches):
            raise StopIteration
        batch = self._batches[self._cursor]
        self._cursor += 1
        return batch

    def __len__(self) -> int:
        return self.num_batches
