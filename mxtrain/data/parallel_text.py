"""Bucketed (source, target) batches from two parallel text files, for encoder-decoder models.

Line i of ``source`` pairs with line i of ``target``. Tokens are whitespace-separated words,
or characters with one space token between words (``tokens: chars``, as ``bucket_sentence``
reads characters). A pair of ``s`` source tokens and ``m`` target tokens becomes the source
row ``w1 .. ws`` (no ``<bos>``/``<eos>``), the decoder inputs ``<bos> v1 .. vm`` and the
labels ``v1 .. vm <eos>``, all padded with ``<pad>`` (0) to the bucket ``(S, T)`` that holds
it with the fewest positions (``s <= S``, ``m + 1 <= T``; see :mod:`mxtrain.data.pair_buckets`).
Batches: data ``source`` (N, S) and ``target`` (N, T), label ``target_label`` (N, T),
``bucket_key`` ``(S, T)``; ``num_tokens`` counts real labels (target tokens and ``<eos>``).
With ``reverse_target`` (a right-to-left model) each target's tokens are read last first,
``v1`` being the line's last token; :meth:`ParallelTextIter.detokenize` turns them back.

Batch sizes: ``batch_size`` pairs, or, when ``batch_tokens`` is set, target tokens per batch
(:func:`~mxtrain.data.pair_buckets.bucket_rows`). ``last_batch``, sharding (``num_parts``,
``part_index``: every part gets the same number of batches per epoch, all-padding rows and
batches making up a part with fewer pairs) and the epoch order, drawn from ``(seed, epoch)``
alone so a resumed run replays it, work as in ``bucket_sentence``.

Long pairs (no bucket holds them, or beyond ``max_source_length``/``max_target_length``):
``long_pairs: skip`` leaves them out and counts them in one log line, ``error`` stops with a
DataError naming the first one's line.

Vocabularies (:class:`~mxtrain.data.vocab.Vocab` with the extra special ``<bos>``: pad 0,
unk 1, eos 2, bos 3): the train iterator builds one per side, or one from both sides with
``shared_vocab``, or loads ``vocab`` (and ``target_vocab.json`` beside it). ``vocab`` is the
source vocabulary (fit saves it as vocab.json), ``target_vocab`` the target one (saved as
target_vocab.json through :meth:`ParallelTextIter.artifacts`; the same object with
``shared_vocab``). Eval iterators reuse the train iterator's vocabularies and buckets; built
from a run folder (score, predict, resume) they load ``vocab_file`` and target_vocab.json from
``DataContext.artifacts_dir`` or beside ``vocab_file``.

Role ``predict`` reads only the source file, every line in file order (batches carry ``index``,
the 0-based line of each row; a blank line gets no row but is counted in ``num_sentences``).
Its keys are ``(S, T)`` with ``T`` nominal, the largest training ``T``: decoding sets its own
lengths. A line longer than every bucket gets a bucket of its own (``batching.long_bucket``).
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

from mxtrain.data import batching, pair_buckets
from mxtrain.data.base import DataContext, Seq2SeqInfo, resolve_source
from mxtrain.data.bucket_sentence import padding_buckets, tokenize
from mxtrain.data.parallel_text_options import SPECIALS, ParallelTextOptions
from mxtrain.data.text_files import read_data_text
from mxtrain.data.vocab import Vocab
from mxtrain.errors import DataError

log = logging.getLogger(__name__)

TARGET_VOCAB_FILE = "target_vocab.json"  # its name in the run folder
#: how each ``tokens`` setting is recorded in the vocabularies (bucket_sentence's levels)
LEVELS = {"whitespace": "word", "chars": "char"}
SOURCE, TARGET, TARGET_LABEL = "source", "target", "target_label"

Bucket = pair_buckets.Bucket


@dataclasses.dataclass(frozen=True)
class Side:
    """One file of the pair as read: its name for messages, its tokenized lines and the
    lines themselves."""

    name: str
    tokens: list[list[str]]
    lines: list[str]


@dataclasses.dataclass(frozen=True)
class TextPair:
    """One pair of an eval iterator as read (:meth:`ParallelTextIter.pairs`)."""

    line: int  # 0-based, in both files
    source_ids: list[int]  # what the model reads
    source: str  # the source line as the iterator reads it (see ParallelTextIter.normalized)
    target: str  # the target line likewise: what a right output is, detokenized


def build_parallel_text_iter(
    options: ParallelTextOptions, context: DataContext
) -> ParallelTextIter:
    """Read, tokenize and bucket the pair of files for ``context.role`` (train, eval, predict)."""
    predict = context.role == "predict"
    if predict:
        if options.num_parts > 1:
            log.warning("predict reads every line: num_parts/part_index are ignored")
        options = dataclasses.replace(options, max_pairs=None, num_parts=1, part_index=0)
    source, target = read_pair(options, context.base_dir, with_target=not predict)
    source_vocab, target_vocab = vocabularies(options, context, source, target)
    source_ids = [source_vocab.encode(tokens) for tokens in source.tokens]
    target_ids = None if target is None else [target_vocab.encode(t) for t in target.tokens]
    s_lens = np.fromiter((len(ids) for ids in source_ids), dtype=np.int64, count=len(source_ids))
    if target is None or target_ids is None:
        buckets = predict_buckets(options, context, s_lens)
        keep = s_lens > 0
        skipped = 0
    else:
        t_lens = np.fromiter((len(ids) + 1 for ids in target_ids), np.int64, len(target_ids))
        buckets = choose_buckets(options, context, s_lens, t_lens, source.name)
        keep = held_pairs(options, buckets, s_lens, t_lens, source, target)
        skipped = int((~keep).sum())
    data_iter = ParallelTextIter(
        source_ids,
        target_ids,
        keep=keep,
        source_vocab=source_vocab,
        target_vocab=target_vocab,
        buckets=buckets,
        batch_size=options.batch_size,
        batch_tokens=options.batch_tokens,
        num_parts=options.num_parts,
        part_index=options.part_index,
        shuffle=options.shuffle and context.role == "train",
        seed=context.seed,
        source=source.name,
        target=None if target is None else target.name,
        tokens=options.tokens,
        shared_vocab=options.shared_vocab,
        min_batch=context.min_batch,
        last_batch="short" if predict else context.last_batch or options.last_batch,
        skipped_long=skipped,
        texts=(source.lines, target.lines)
        if target is not None and context.role == "eval"
        else None,
        lowercase=options.lowercase,
        reverse_target=options.reverse_target,
    )
    if context.role == "train" and options.buckets == "auto":  # explicit ones were chosen
        batching.warn_about_padding(
            log,
            source.name,
            data_iter.stats,
            buckets="auto",
            rule="padding",
            batch_key="batch_tokens" if options.batch_tokens is not None else "batch_size",
        )
    return data_iter


def read_lines(name: str, base_dir: Path, side: str) -> tuple[str, list[str]]:
    """(the file's path for messages, its lines): the ``side`` ("source", "target") file."""
    path = resolve_source(name, base_dir)
    text = read_data_text(path, name, expected=f"a text file of {side} sequences, one per line")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline does not start another line
    if not lines:
        raise DataError(
            f"The {side} file {path} is empty.",
            hint="Give a UTF-8 text file with one sequence per line.",
        )
    return str(path), lines


def read_pair(
    options: ParallelTextOptions, base_dir: Path, *, with_target: bool
) -> tuple[Side, Side | None]:
    """The tokenized source and (``with_target``) target files, checked to pair up line by
    line with no empty side; ``max_pairs`` applied."""
    level, lower = LEVELS[options.tokens], options.lowercase
    source_name, source_lines = read_lines(options.source, base_dir, "source")
    if not with_target:
        tokens = [tokenize(line, level, lower) for line in source_lines]
        return Side(source_name, tokens, source_lines), None
    target_name, target_lines = read_lines(options.target, base_dir, "target")
    if len(source_lines) != len(target_lines):
        raise DataError(
            f"The parallel files differ in length: the source {source_name} has "
            f"{len(source_lines)} lines and the target {target_name} has {len(target_lines)}; "
            "line i of one must be the translation of line i of the other.",
            hint="Find the missing or extra line (e.g. `paste SOURCE TARGET | grep -n -P "
            "'^\\t|\\t$'` shows lines empty on one side) and fix the files.",
        )
    if options.max_pairs is not None:
        source_lines = source_lines[: options.max_pairs]
        target_lines = target_lines[: options.max_pairs]
    sides = []
    for name, lines, other, reverse in (
        (source_name, source_lines, target_name, False),
        (target_name, target_lines, source_name, options.reverse_target),
    ):
        tokens = [tokenize(line, level, lower) for line in lines]
        if reverse:  # a right-to-left model: the target's tokens last first
            tokens = [t[::-1] for t in tokens]
        empty = next((i for i, t in enumerate(tokens) if not t), None)
        if empty is not None:
            raise DataError(
                f"{name}:{empty + 1}: line {empty + 1} is empty, so the pair with line "
                f"{empty + 1} of {other} has an empty side.",
                hint="Every pair needs at least one token on each side: remove the line from "
                "both files (or fill it in).",
            )
        sides.append(Side(name, tokens, lines))
    return sides[0], sides[1]


def _vocab_file(options: ParallelTextOptions, context: DataContext) -> Path | None:
    """The saved source vocabulary to load, if any: a resumed run's or a run folder's
    (``context.vocab_file``), else for training the options' ``vocab``."""
    if context.vocab_file is not None:
        return resolve_source(str(context.vocab_file), context.base_dir)
    if context.role == "train" and options.vocab is not None:
        return resolve_source(options.vocab, context.base_dir)
    return None


def _target_vocab_file(context: DataContext, vocab_file: Path) -> Path:
    """Where the target vocabulary of a saved source vocabulary is: in the run folder
    (``context.artifacts_dir``), else beside ``vocab_file``."""
    folder = context.artifacts_dir if context.artifacts_dir is not None else vocab_file.parent
    return Path(folder) / TARGET_VOCAB_FILE


def load_vocabularies(
    options: ParallelTextOptions, context: DataContext, vocab_file: Path
) -> tuple[Vocab, Vocab]:
    """The saved source vocabulary and its target one (the same with ``shared_vocab``)."""
    source_vocab = Vocab.load(vocab_file)
    if options.shared_vocab:
        return source_vocab, source_vocab
    target_file = _target_vocab_file(context, vocab_file)
    if not target_file.exists():
        raise DataError(
            f"The source vocabulary {vocab_file} has no target vocabulary beside it: "
            f"{target_file} does not exist.",
            hint="mxtrain fit writes target_vocab.json into the run folder beside vocab.json; "
            "copy both, or set shared_vocab: true if the model was trained with one "
            "vocabulary for both sides.",
        )
    return source_vocab, Vocab.load(target_file)


def vocabularies(
    options: ParallelTextOptions, context: DataContext, source: Side, target: Side | None
) -> tuple[Vocab, Vocab]:
    """(source, target) vocabularies for ``context.role``: the train iterator's, the saved
    ones, or (training) built from the data; checked against the options."""
    train = context.train if context.role != "train" else None
    known_source = getattr(train, "vocab", None)
    known_target = getattr(train, "target_vocab", None)
    vocab_file = _vocab_file(options, context)
    if isinstance(known_source, Vocab) and isinstance(known_target, Vocab):
        source_vocab, target_vocab = known_source, known_target
        origin = "the training data's vocabularies"
    elif vocab_file is not None:
        source_vocab, target_vocab = load_vocabularies(options, context, vocab_file)
        origin = f"the vocabulary file {vocab_file}"
    elif context.role == "train":
        assert target is not None  # training reads both files
        return build_vocabularies(options, source, target)
    else:
        raise DataError(
            f"The {context.role} data {source.name} needs the training vocabularies, but there "
            "is no train iterator with them and no vocabulary file.",
            hint="Score or predict with a run folder (it holds vocab.json and "
            f"{TARGET_VOCAB_FILE}).",
        )
    for vocab in (source_vocab, target_vocab):
        check_vocab(vocab, options, source.name, origin)
    if options.shared_vocab != (source_vocab is target_vocab):
        raise DataError(
            f"The data {source.name} has shared_vocab: {str(options.shared_vocab).lower()}, "
            f"but {origin} {'are two' if options.shared_vocab else 'is one'} vocabular"
            f"{'ies' if options.shared_vocab else 'y'}.",
            hint="Use the shared_vocab setting the model was trained with.",
        )
    return source_vocab, target_vocab


def build_vocabularies(
    options: ParallelTextOptions, source: Side, target: Side
) -> tuple[Vocab, Vocab]:
    """The training data's vocabularies: one per side, or one of both (``shared_vocab``)."""

    def build(sentences: Sequence[list[str]]) -> Vocab:
        return Vocab.build(
            sentences,
            min_count=options.min_count,
            max_size=options.max_vocab,
            level=LEVELS[options.tokens],
            lowercase=options.lowercase,
            specials=SPECIALS,
        )

    if options.shared_vocab:
        vocab = build([*source.tokens, *target.tokens])
        return vocab, vocab
    return build(source.tokens), build(target.tokens)


def check_vocab(vocab: Vocab, options: ParallelTextOptions, source: str, origin: str) -> None:
    """DataError when ``vocab`` was not built for parallel text read as ``options`` say."""
    if vocab.specials[: len(SPECIALS)] != SPECIALS:
        raise DataError(
            f"{origin} (read for {source}) does not reserve <bos> at id 3, which the decoder "
            "of an encoder-decoder model starts from.",
            hint="Use the vocab.json (and target_vocab.json) of a parallel_text run, or build "
            "the vocabularies from the data (no vocab setting).",
        )
    level = LEVELS[options.tokens]
    if vocab.level is not None and vocab.level != level:
        tokens = {v: k for k, v in LEVELS.items()}.get(vocab.level, vocab.level)
        raise DataError(
            f"The data {source} is read with tokens: {options.tokens}, but {origin} was built "
            f"with tokens: {tokens}.",
            hint=f"Set tokens: {tokens} for this data.",
        )
    vocab.check_lowercase(options.lowercase, source, origin)


def _known_buckets(context: DataContext) -> list[Bucket] | None:
    """The buckets the model was trained with, when this context knows them: the train
    iterator's (eval), else the recorded ones (a resumed run, a run folder) if they are pairs."""
    known = getattr(context.train, "buckets", None) if context.role != "train" else None
    if not known and context.buckets:
        known = context.buckets
    if known and all(isinstance(k, tuple | list) and len(k) == 2 for k in known):
        return pair_buckets.sort_buckets(known)
    return None


def choose_buckets(
    options: ParallelTextOptions,
    context: DataContext,
    s_lens: np.ndarray,
    t_lens: np.ndarray,
    source: str,
) -> list[Bucket]:
    """The config's buckets, else the training ones (eval, resume), else ``auto`` from the
    pairs within the length caps."""
    if not isinstance(options.buckets, str):
        return pair_buckets.sort_buckets(options.buckets)
    known = _known_buckets(context)
    if known is not None:
        return known
    within = _within_caps(options, s_lens, t_lens)
    if not within.any():
        raise DataError(
            f"None of the {s_lens.size} pairs of {source} is within max_source_length "
            f"{options.max_source_length} and max_target_length {options.max_target_length}.",
            hint="Raise the caps (or remove them).",
        )
    return pair_buckets.auto_pair_buckets(
        s_lens[within], t_lens[within], options.max_padding, options.num_buckets
    )


def _within_caps(
    options: ParallelTextOptions, s_lens: np.ndarray, t_lens: np.ndarray
) -> np.ndarray:
    """Which pairs the length caps allow (``t_lens`` counts decoder positions: tokens + 1)."""
    within = np.ones(s_lens.shape, dtype=bool)
    if options.max_source_length is not None:
        within &= s_lens <= options.max_source_length
    if options.max_target_length is not None:
        within &= t_lens <= options.max_target_length + 1
    return within


def held_pairs(
    options: ParallelTextOptions,
    buckets: Sequence[Bucket],
    s_lens: np.ndarray,
    t_lens: np.ndarray,
    source: Side,
    target: Side,
) -> np.ndarray:
    """Which pairs a bucket holds within the caps; the others are skipped and counted in one
    log line, or (``long_pairs: error``) the first one is a DataError."""
    largest = pair_buckets.largest_bucket(buckets)
    keep = _within_caps(options, s_lens, t_lens) & (s_lens <= largest[0]) & (t_lens <= largest[1])
    if keep.all():
        return keep
    first = int(np.flatnonzero(~keep)[0])
    limits = (
        f"the largest bucket holds {largest[0]} source and {largest[1] - 1} target tokens"
        f"{_caps_words(options)}"
    )
    if options.long_pairs == "error":
        raise DataError(
            f"{source.name}:{first + 1} and {target.name}:{first + 1}: the pair has "
            f"{s_lens[first]} source and {t_lens[first] - 1} target tokens; {limits}.",
            hint="Set long_pairs: skip to leave such pairs out (they are counted in the log), "
            "or allow longer pairs (buckets, max_source_length, max_target_length).",
        )
    if not keep.any():
        raise DataError(
            f"None of the {keep.size} pairs of {source.name} and {target.name} can be used: "
            f"all are longer than {limits}.",
            hint="Allow longer pairs (buckets, max_source_length, max_target_length).",
        )
    log.info(
        "%s: %d of %d pairs skipped as longer than every bucket (%s; long_pairs: skip), the "
        "first at line %d",
        source.name,
        int((~keep).sum()),
        keep.size,
        limits,
        first + 1,
    )
    return keep


def _caps_words(options: ParallelTextOptions) -> str:
    caps = [
        f"{key} {value}"
        for key, value in (
            ("max_source_length", options.max_source_length),
            ("max_target_length", options.max_target_length),
        )
        if value is not None
    ]
    return f", and {' and '.join(caps)}" if caps else ""


def predict_buckets(
    options: ParallelTextOptions, context: DataContext, s_lens: np.ndarray
) -> list[Bucket]:
    """Predict's keys ``(S, T)``: the training buckets' source lengths (or, when they are not
    known, ``auto`` buckets of the input's own lengths) with the nominal ``T``, the largest
    training one (else ``max_target_length + 1``, else the largest ``S + 1``)."""
    known = _known_buckets(context)
    if known is None and not isinstance(options.buckets, str):
        known = pair_buckets.sort_buckets(options.buckets)
    if known is not None:
        lengths = sorted({s for s, _ in known})
        nominal = max(t for _, t in known)
    else:
        present = s_lens[s_lens > 0]
        if present.size == 0:
            raise DataError(
                f"The input {options.source} has no tokens (it is only blank lines).",
                hint="Give one source sequence per line.",
            )
        lengths = padding_buckets(present, options.max_padding, options.num_buckets)
        cap = options.max_target_length
        nominal = cap + 1 if cap is not None else lengths[-1] + 1
    return [(s, nominal) for s in lengths]


def _padded(rows: Sequence[Sequence[int]], width: int) -> np.ndarray:
    """``rows`` of ids as a float32 matrix ``width`` wide, ``<pad>`` (0) after each row."""
    sizes, flat, offsets = batching.flatten_sequences(rows)
    pos = np.arange(width)
    mask = pos[None, :] < sizes[:, None]
    index = np.minimum(offsets[:, None] + pos[None, :], max(flat.size - 1, 0))
    values = flat[index] if flat.size else np.zeros(mask.shape, dtype=np.int64)
    return np.where(mask, values, Vocab.pad_id).astype(np.float32)


@dataclasses.dataclass
class PackedBucket:
    """The real rows of one bucket, in line order: padded matrices and each row's line."""

    key: Bucket
    rows: int  # pairs per batch
    batches: int  # batches per epoch, the same for every part
    arrays: list[np.ndarray]  # source, target, target_label (predict: source only)
    tokens: np.ndarray  # real labels (target tokens + eos) per row; 0 when predicting
    index: np.ndarray  # the 0-based line of each row

    @property
    def count(self) -> int:
        return int(self.index.size)


class ParallelTextIter(batching.PrebuiltBatchIter):
    """Batches of (source, target; target_label), bucket keys ``(S, T)``, float32 ids.

    ``source_ids``/``target_ids`` hold one list of ids per line (``target_ids`` None when
    predicting: batches then carry only ``source``); ``keep`` says which lines become rows
    (the others were long pairs, or blank lines when predicting). ``buckets`` are sorted by
    :func:`~mxtrain.data.pair_buckets.sort_buckets`; ``default_bucket_key`` is their
    elementwise maximum. Each batch has ``bucket_key``, ``pad`` (all-padding rows at its end),
    ``num_tokens`` (real labels) and ``index`` (the line of each row, -1 for padding rows).
    Call ``set_epoch(e)`` and then ``reset()`` to get epoch ``e``'s order.
    """

    def __init__(
        self,
        source_ids: Sequence[Sequence[int]],
        target_ids: Sequence[Sequence[int]] | None,
        *,
        keep: np.ndarray,
        source_vocab: Vocab,
        target_vocab: Vocab,
        buckets: Sequence[Bucket],
        batch_size: int,
        batch_tokens: int | None = None,
        num_parts: int = 1,
        part_index: int = 0,
        shuffle: bool = False,
        seed: int = 0,
        source: str = "<source>",
        target: str | None = None,
        tokens: str = "whitespace",
        shared_vocab: bool = False,
        min_batch: int = 1,
        last_batch: str = "short",
        skipped_long: int = 0,
        texts: tuple[Sequence[str], Sequence[str]] | None = None,
        lowercase: bool = False,
        reverse_target: bool = False,
    ) -> None:
        super().__init__(batch_size)
        if num_parts < 1 or not 0 <= part_index < num_parts:
            raise ValueError(f"need 0 <= part_index < num_parts, got {part_index}, {num_parts}")
        self.buckets: list[Bucket] = pair_buckets.sort_buckets(buckets)
        self.default_bucket_key: Bucket = pair_buckets.largest_bucket(self.buckets)  # type: ignore[assignment]
        if self.default_bucket_key not in self.buckets:
            raise ValueError(
                f"the buckets {self.buckets} lack their largest {self.default_bucket_key}"
            )
        self.batch_tokens = batch_tokens
        self._pairs_per_batch = batch_size
        self.batch_size = self.bucket_rows(self.default_bucket_key)
        self.num_parts, self.part_index = int(num_parts), int(part_index)
        self.min_batch = max(1, int(min_batch))
        self.last_batch = last_batch
        self.shuffle, self.seed = shuffle, int(seed)
        self.source, self.target = source, target
        self.tokens, self.lowercase = tokens, lowercase
        # the lines read and their source ids, kept by eval iterators for pairs()
        self._texts, self._source_ids = texts, source_ids
        self.predicting = target_ids is None
        self.vocab, self.target_vocab = source_vocab, target_vocab
        self.pad_id = Vocab.pad_id
        self.data_info = Seq2SeqInfo(
            vocab_size=len(source_vocab),
            num_classes=len(target_vocab),
            pad_id=Vocab.pad_id,
            eos_id=target_vocab.eos_id,
            bos_id=target_vocab.token_id(SPECIALS[0]),
            shared_vocab=shared_vocab,
            tokens=tokens,
            reverse_target=reverse_target,
        )
        self._pack(source_ids, target_ids, np.asarray(keep, dtype=bool), skipped_long)
        self.provide_data = self._descs(self.default_bucket_key, self.batch_size)[0]
        self.provide_label = self._descs(self.default_bucket_key, self.batch_size)[1]
        self.reset()

    def bucket_rows(self, key: Bucket) -> int:
        """Pairs per batch in the bucket ``key`` (see :func:`pair_buckets.bucket_rows`)."""
        return pair_buckets.bucket_rows(
            key, self.default_bucket_key, self._pairs_per_batch, self.batch_tokens
        )

    def artifacts(self) -> dict[str, Callable[[Path], None]]:
        """Files to keep in the run folder besides vocab.json: ``{file name: save(path)}``."""
        if self.data_info.shared_vocab:
            return {}
        return {TARGET_VOCAB_FILE: self.target_vocab.save}

    def detokenize(self, ids: Sequence[int] | np.ndarray) -> str:
        """Target ids as text: up to the first ``<eos>``, without ``<pad>``/``<bos>``, in
        reading order (``reverse_target`` turns them back); tokens joined with single spaces
        (``tokens: whitespace``) or nothing (``chars``, whose space token restores the spaces
        between words)."""
        skip = {self.data_info.pad_id, self.data_info.bos_id}
        kept: list[int] = []
        for value in ids:
            i = int(value)
            if i == self.data_info.eos_id:
                break
            if i not in skip:
                kept.append(i)
        if self.data_info.reverse_target:
            kept.reverse()
        return self._joined(self.target_vocab.decode(kept))

    def normalized(self, line: str) -> str:
        """``line`` as the iterator reads it, written as :meth:`detokenize` writes outputs:
        its tokens (lowercased with ``lowercase``) joined the same way, every word kept as
        it is (a word missing from the vocabulary stays itself, not ``<unk>``)."""
        return self._joined(tokenize(line, LEVELS[self.tokens], self.lowercase))

    def _joined(self, tokens: Sequence[str]) -> str:
        """Tokens as text: ``chars`` joined without spaces (a space token is one), words with
        single spaces."""
        return ("" if self.tokens == "chars" else " ").join(tokens)

    def pairs(self) -> list[TextPair]:
        """Every pair read, in file order, long pairs (left out of the batches) included:
        what the decoding metrics decode and compare with. Only eval iterators keep them."""
        if self._texts is None:
            raise ValueError("only an eval iterator of parallel text keeps its lines")
        sources, targets = self._texts
        return [
            TextPair(i, list(self._source_ids[i]), self.normalized(s), self.normalized(t))
            for i, (s, t) in enumerate(zip(sources, targets, strict=True))
        ]

    def _descs(self, key: Bucket, rows: int) -> tuple[list[Any], list[Any]]:
        """(provide_data, provide_label) of a batch of ``rows`` in bucket ``key``."""
        source_len, target_len = key

        def desc(name: str, width: int) -> Any:
            return mx.io.DataDesc(name, (rows, width), np.float32, layout="NT")

        if self.predicting:
            return [desc(SOURCE, source_len)], []
        return [desc(SOURCE, source_len), desc(TARGET, target_len)], [
            desc(TARGET_LABEL, target_len)
        ]

    def _last_rows(self, rows: int, nbatch: int, bsz: int) -> int:
        """:func:`~mxtrain.data.batching.last_batch_rows` under this iterator's settings."""
        return batching.last_batch_rows(self.last_batch, rows, nbatch, bsz, self.min_batch)

    def _pack(
        self,
        source_ids: Sequence[Sequence[int]],
        target_ids: Sequence[Sequence[int]] | None,
        keep: np.ndarray,
        skipped_long: int,
    ) -> None:
        """Put every kept line into its bucket as padded rows (``self._packed``) and count."""
        lines = np.flatnonzero(keep)
        s_lens = np.asarray([len(source_ids[i]) for i in lines], dtype=np.int64)
        self.bucket_batch_sizes = {key: self.bucket_rows(key) for key in self.buckets}
        if target_ids is None:
            t_lens = np.full(lines.size, self.default_bucket_key[1], dtype=np.int64)
            self._add_long_buckets(s_lens)
        else:
            t_lens = np.asarray([len(target_ids[i]) + 1 for i in lines], dtype=np.int64)
        which = pair_buckets.assign_buckets(s_lens, t_lens, self.buckets)
        if (which < 0).any():
            raise ValueError("every kept pair must fit a bucket")
        self._packed: list[PackedBucket] = []
        positions = 0  # positions computed over all parts' batches, both sides
        for b, key in enumerate(self.buckets):
            chosen = lines[which == b]
            rows = self.bucket_batch_sizes[key]
            nbatch = math.ceil(math.ceil(chosen.size / self.num_parts) / rows)
            for part in range(self.num_parts):
                held = len(range(part, chosen.size, self.num_parts))
                if nbatch:  # predict computes no decoder positions here
                    width = key[0] if self.predicting else key[0] + key[1]
                    positions += ((nbatch - 1) * rows + self._last_rows(held, nbatch, rows)) * width
            if chosen.size == 0:
                continue
            arrays = [_padded([source_ids[i] for i in chosen], key[0])]
            if target_ids is not None:
                bos, eos = self.data_info.bos_id, self.data_info.eos_id
                arrays.append(_padded([[bos, *target_ids[i]] for i in chosen], key[1]))
                arrays.append(_padded([[*target_ids[i], eos] for i in chosen], key[1]))
            tokens = (arrays[-1] != self.pad_id).sum(axis=1)
            self._packed.append(PackedBucket(key, rows, nbatch, arrays, tokens, chosen))
        self.num_batches = sum(p.batches for p in self._packed)
        self._count(source_ids, target_ids, s_lens, t_lens, positions, skipped_long)

    def _add_long_buckets(self, s_lens: np.ndarray) -> None:
        """Predict: sizes of the buckets, and a bucket of its own (``batching.long_bucket``)
        for each length of the lines longer than every bucket, with as many rows as its lines
        but no more positions than the default bucket (it binds within its memory)."""
        largest, nominal = self.default_bucket_key
        long = s_lens[s_lens > largest]
        if long.size == 0:
            return
        room = self.batch_size * largest
        extra = [batching.long_bucket(int(s), largest) for s in long]
        for length in sorted(set(extra)):
            key = (length, nominal)
            self.buckets.append(key)
            found = extra.count(length)
            self.bucket_batch_sizes[key] = batching.long_bucket_rows(
                found, length, room, self.min_batch
            )
        self.buckets = pair_buckets.sort_buckets(self.buckets)

    def _count(
        self,
        source_ids: Sequence[Sequence[int]],
        target_ids: Sequence[Sequence[int]] | None,
        s_lens: np.ndarray,
        t_lens: np.ndarray,
        positions: int,
        skipped_long: int,
    ) -> None:
        """``self.stats``: what was read, kept, padded and skipped (see ``describe``)."""
        counts = {p.key: p.count for p in self._packed}
        mine = {p.key: len(range(self.part_index, p.count, self.num_parts)) for p in self._packed}
        real = int(s_lens.sum() + (t_lens.sum() if target_ids is not None else 0))
        unk = sum(int((p.arrays[0] == Vocab.unk_id).sum()) for p in self._packed)
        target_unk = sum(int((p.arrays[-1] == Vocab.unk_id).sum()) for p in self._packed)
        self.stats: dict[str, Any] = {
            "sentences": len(source_ids),  # lines read: predict's index values are below it
            "pairs": int(s_lens.size),
            "skipped_long": int(skipped_long),
            "skipped_empty": len(source_ids) - int(s_lens.size) - int(skipped_long),
            "source_tokens": int(s_lens.sum()),
            "tokens": int(sum(p.tokens.sum() for p in self._packed)),
            "padding_ratio": 1.0 - real / positions if positions else 0.0,
            "bucket_padding": pair_buckets.padding_share(s_lens, t_lens, self.buckets)
            if target_ids is not None
            else 0.0,
            "unk_ratio": unk / max(1, int(s_lens.sum())),
            "target_unk_ratio": 0.0
            if target_ids is None
            else target_unk / max(1, int(t_lens.sum() - s_lens.size)),
            "bucket_counts": counts,
            "bucket_batch_sizes": dict(self.bucket_batch_sizes),
            "part_pairs": int(sum(mine.values())),
            "padding_batches": int(
                sum(p.batches - math.ceil(mine[p.key] / p.rows) for p in self._packed)
            ),
        }
        if self.num_parts > 1:
            log.info(
                "%s: part %d of %d: %d of %d pairs, %d batches per epoch like every part "
                "(%d of them all padding)",
                self.source,
                self.part_index,
                self.num_parts,
                self.stats["part_pairs"],
                self.stats["pairs"],
                self.num_batches,
                self.stats["padding_batches"],
            )

    def _epoch_batches(self, rng: np.random.Generator | None) -> list[Any]:
        batches: list[Any] = []
        for packed in self._packed:
            order = rng.permutation(packed.count) if rng is not None else np.arange(packed.count)
            mine = order[self.part_index :: self.num_parts]
            rows = packed.rows
            total = (packed.batches - 1) * rows + self._last_rows(mine.size, packed.batches, rows)
            arrays = []
            for array in packed.arrays:  # this part's rows, then all-padding rows
                filled = np.full((total, array.shape[1]), self.pad_id, dtype=np.float32)
                filled[: mine.size] = array[mine]
                arrays.append(filled)
            tokens = np.zeros(total, dtype=np.int64)
            tokens[: mine.size] = packed.tokens[mine]
            index = np.full(total, -1, dtype=np.int64)
            index[: mine.size] = packed.index[mine]
            batches += self._cut(packed.key, rows, arrays, tokens, index, mine.size)
        return batches

    def _cut(
        self,
        key: Bucket,
        rows: int,
        arrays: list[np.ndarray],
        tokens: np.ndarray,
        index: np.ndarray,
        real_rows: int,
    ) -> list[Any]:
        """DataBatches of ``rows`` rows (the last may have fewer) over one bucket's matrices."""
        arrays_nd = [mx.nd.array(a, dtype=np.float32) for a in arrays]
        inputs = 1 if self.predicting else 2
        total = arrays[0].shape[0]
        batches = []
        for lo in range(0, total, rows):
            hi = min(total, lo + rows)
            descs = self._descs(key, hi - lo)
            parts = [a[lo:hi] for a in arrays_nd]
            batch = mx.io.DataBatch(
                data=parts[:inputs],
                label=parts[inputs:],
                pad=max(0, hi - max(lo, real_rows)),
                index=index[lo:hi],
                bucket_key=key,
                provide_data=descs[0],
                provide_label=descs[1],
            )
            batch.num_tokens = int(tokens[lo:hi].sum())
            batches.append(batch)
        return batches

    def describe(self) -> str:
        """One line for the log."""
        s = self.stats
        vocab = (
            f"shared vocab {len(self.vocab)}"
            if self.data_info.shared_vocab
            else f"vocab {len(self.vocab)} source / {len(self.target_vocab)} target"
        )
        files = self.source if self.target is None else f"{self.source} + {self.target}"
        if self.batch_tokens is None:
            per_batch = f"{self.batch_size} pairs"
        else:
            per_batch = (
                f"<= {self.batch_tokens} target tokens (pairs per bucket {s['bucket_batch_sizes']})"
            )
        part = (
            f"; part {self.part_index} of {self.num_parts}: {s['part_pairs']} pairs, "
            f"{s['padding_batches']} all-padding batches"
            if self.num_parts > 1
            else ""
        )
        if self.predicting:
            return (
                f"{files} ({self.tokens}): {s['sentences']} lines ({s['skipped_empty']} blank), "
                f"{s['source_tokens']} tokens, {vocab}, unk {s['unk_ratio']:.1%}; buckets "
                f"{self.buckets}; {self.num_batches} batches of {per_batch}, padding "
                f"{s['padding_ratio']:.1%}"
            )
        return (
            f"{files} ({self.tokens}): {s['sentences']} lines -> {s['pairs']} pairs, "
            f"{s['source_tokens']} source tokens, {s['tokens']} target tokens (<eos> included), "
            f"{vocab}, unk {s['unk_ratio']:.1%} source / {s['target_unk_ratio']:.1%} target; "
            f"buckets {self.buckets}; {self.num_batches} batches of {per_batch}, padding "
            f"{s['padding_ratio']:.1%} ({s['bucket_padding']:.1%} from bucket lengths){part}; "
            f"long pairs skipped: {s['skipped_long']}"
        )
