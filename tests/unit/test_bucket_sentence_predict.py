"""bucket_sentence for scoring and predicting from a run folder: the predict role, saved
vocabularies and buckets, and the training buckets recovered without building the iterator."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mxtrain.data.base import TASK_LM, DataContext
from mxtrain.data.batching import long_bucket
from mxtrain.data.bucket_sentence import build_bucket_sentence_iter, train_buckets
from mxtrain.data.bucket_sentence_options import BucketSentenceOptions
from mxtrain.data.vocab import Vocab

WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far"]


def write(folder: Path, lines: list[str], name: str = "data.txt") -> Path:
    path = folder / name
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


def sentence(n: int, offset: int = 0) -> str:
    return " ".join(WORDS[(offset + i) % len(WORDS)] for i in range(n))


def vocab_file(folder: Path) -> Path:
    path = folder / "vocab.json"
    Vocab.build([WORDS], level="word", lowercase=False).save(path)
    return path


def build(folder: Path, lines: list[str], role: str, context_buckets=None, **kw):
    options = BucketSentenceOptions(source=str(write(folder, lines)), **kw)
    context = DataContext(
        role=role,
        seed=0,
        base_dir=folder,
        vocab_file=vocab_file(folder),
        buckets=context_buckets,
    )
    return build_bucket_sentence_iter(options, context)


def rows(it) -> dict[int, tuple[np.ndarray, np.ndarray, int]]:
    """line -> (data row, label row, bucket) over one pass; each line at most once."""
    out: dict[int, tuple[np.ndarray, np.ndarray, int]] = {}
    it.reset()
    for batch in it:
        data, label = batch.data[0].asnumpy(), batch.label[0].asnumpy()
        for r, line in enumerate(batch.index):
            if line < 0:
                continue
            assert int(line) not in out, "a line came twice (split?)"
            out[int(line)] = (data[r], label[r], batch.bucket_key)
    return out


def test_long_bucket_rounds_up_in_quarters_of_the_largest() -> None:
    assert long_bucket(14, 13) == 17  # step ceil(13 / 4) = 4
    assert long_bucket(17, 13) == 17
    assert long_bucket(40, 13) == 41
    assert long_bucket(2, 1) == 2


def test_predict_keeps_every_line_whole_in_one_row(tmp_path: Path) -> None:
    lines = [sentence(3), "", sentence(30, 1), sentence(1), sentence(9, 2), "   ", sentence(5)]
    it = build(tmp_path, lines, "predict", buckets=[4, 8], batch_size=2, max_sentences=2)
    assert it.num_sentences == len(lines)  # max_sentences does not apply to predictions
    assert it.default_bucket_key == 8  # extra buckets do not change the default
    assert it.buckets == [4, 8, 10, 30]  # 9 -> 10, 30 -> 30 (steps of 2)
    assert it.data_info.task == TASK_LM
    got = rows(it)
    assert sorted(got) == [0, 2, 3, 4, 6]  # blank lines have no row
    for line, (data, label, bucket) in got.items():
        ids = [*it.vocab.encode(lines[line].split()), it.vocab.eos_id]
        n = len(ids) - 1
        assert bucket >= n
        assert list(data[:n]) == ids[:-1] and list(label[:n]) == ids[1:]
        assert not data[n:].any() and not label[n:].any()
    assert it.stats["long_policy"] == "bucket" and it.stats["long_tokens_lost"] == 0


def test_predict_without_eos_still_reads_the_last_word(tmp_path: Path) -> None:
    lines = [sentence(4), sentence(1)]
    it = build(tmp_path, lines, "predict", buckets=[6], add_eos=False)
    got = rows(it)
    vocab = it.vocab
    data, label, _ = got[0]
    ids = vocab.encode(lines[0].split())
    assert list(data[:4]) == ids  # all four words are input
    assert list(label[:4]) == [*ids[1:], vocab.pad_id]  # the last label is not counted
    data, label, _ = got[1]
    assert list(data[:1]) == vocab.encode(lines[1].split()) and not label.any()
    it.reset()
    assert sum(b.num_tokens for b in it) == 3


def test_eval_reuses_the_training_buckets_given_in_the_context(tmp_path: Path) -> None:
    lines = [sentence(n) for n in (2, 3, 6, 11)]
    it = build(tmp_path, lines, "eval", context_buckets=(3, 7), batch_size=2)
    assert it.buckets == [3, 7] and it.default_bucket_key == 7
    assert it.stats["long_sentences"] == 1 and it.stats["long_policy"] == "split"
    own = build(tmp_path, lines, "eval", batch_size=2)  # no buckets given: its own
    assert own.buckets != [3, 7]
    explicit = build(tmp_path, lines, "eval", buckets=[4, 12], context_buckets=(3, 7))
    assert explicit.buckets == [4, 12]  # explicit eval buckets win (fit warns about 12 > 7)


@pytest.mark.parametrize("buckets", ["auto", [3, 6, 9]])
@pytest.mark.parametrize("add_eos", [True, False])
def test_train_buckets_match_the_train_iterator(tmp_path: Path, buckets, add_eos: bool) -> None:
    rng = np.random.default_rng(0)
    lines = [sentence(int(n), i) for i, n in enumerate(rng.integers(1, 20, size=60))] + [""]
    lines.append(sentence(80))  # an outlier: capped by the auto rule
    options = BucketSentenceOptions(
        source=str(write(tmp_path, lines)), buckets=buckets, add_eos=add_eos, num_buckets=4
    )
    it = build_bucket_sentence_iter(options, DataContext(role="train", seed=0, base_dir=tmp_path))
    assert train_buckets(options, tmp_path) == it.buckets


def test_long_predict_lines_get_batches_of_their_own_size(tmp_path: Path) -> None:
    """A bucket beyond the largest holds a few long lines: its batch has just those rows (at
    least min_batch, one per device), within the default bucket's positions, so predicting
    a file with a few long lines costs about what scoring it does."""
    lines = [sentence(4, i) for i in range(20)] + [sentence(30), sentence(31), sentence(45)]
    it = build(tmp_path, lines, "predict", buckets=[5, 9, 13], batch_size=8)
    long_sizes = {k: v for k, v in it.bucket_batch_sizes.items() if k > 13}
    assert long_sizes == {long_bucket(30, 13): 2, long_bucket(45, 13): 1}
    for batch in it:
        rows_here = batch.data[0].shape[0]
        # a bucket's last batch holds just its remaining lines
        assert rows_here <= it.bucket_batch_sizes[batch.bucket_key] and batch.pad == 0
        assert batch.provide_data[0].shape == (rows_here, batch.bucket_key)
        if batch.bucket_key > 13:
            assert rows_here * batch.bucket_key <= 8 * 13 or rows_here == 1
    assert sorted(rows(it)) == list(range(len(lines)))

    # split over two devices, a batch needs two rows at least
    options = BucketSentenceOptions(source=str(tmp_path / "data.txt"), buckets=[5, 9, 13])
    context = DataContext(
        role="predict", seed=0, base_dir=tmp_path, vocab_file=vocab_file(tmp_path), min_batch=2
    )
    two = build_bucket_sentence_iter(options, context)
    assert min(two.bucket_batch_sizes[k] for k in two.bucket_batch_sizes if k > 13) == 2
