"""The bptt_stream iterator: streams, batch lengths, sharding, options."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mxtrain.data.base import DataContext
from mxtrain.data.bptt_stream import BpttStreamIter, build_bptt_stream_iter, random_lengths
from mxtrain.data.bptt_stream_options import BpttStreamOptions
from mxtrain.data.vocab import Vocab
from mxtrain.errors import DataError, InvalidValue


def _vocab(size: int) -> Vocab:
    return Vocab.build([[f"w{i}" for i in range(size)]], level="word")


def _pairs(it: BpttStreamIter) -> list[tuple[int, int]]:
    """Every (data, label) pair of an epoch that is not padding, in stream order."""
    it.reset()
    rows: list[list[tuple[int, int]]] = [[] for _ in range(it.batch_size)]
    for batch in it:
        data, label = batch.data[0].asnumpy(), batch.label[0].asnumpy()
        assert data.shape == (it.batch_size, batch.bucket_key)
        for r in range(it.batch_size):
            rows[r] += [(int(d), int(lab)) for d, lab in zip(data[r], label[r], strict=True)]
    return [p for row in rows for p in row if p[1] != it.pad_id]


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(2, 300),
    batch_size=st.integers(1, 7),
    bptt=st.integers(1, 12),
    random_length=st.booleans(),
)
def test_every_pair_is_read_once_in_order(
    n: int, batch_size: int, bptt: int, random_length: bool
) -> None:
    ids = np.arange(n, dtype=np.int64) % 50 + 3  # no padding id inside the text
    it = BpttStreamIter(
        ids,
        vocab=_vocab(60),
        batch_size=batch_size,
        bptt=bptt,
        random_length=random_length and bptt > 1,
        length_step=1,
        longest=bptt + 4,
        seed=7,
    )
    expected = list(zip(ids[:-1].tolist(), ids[1:].tolist(), strict=True))
    assert _pairs(it) == expected
    it.reset()
    batches = list(it)
    assert batches[0].reset_states and not any(b.reset_states for b in batches[1:])
    assert sum(b.num_tokens for b in batches) == n - 1
    assert all(b.bucket_key <= it.default_bucket_key for b in batches)


def test_parts_are_disjoint_streams_with_the_same_batches() -> None:
    ids = np.arange(1000, dtype=np.int64) % 90 + 3
    common = {"vocab": _vocab(100), "batch_size": 3, "bptt": 10, "random_length": True}
    parts = [
        BpttStreamIter(ids, **common, num_parts=2, part_index=p, seed=4, longest=30)
        for p in range(2)
    ]
    keys = [[b.bucket_key for b in it] for it in parts]
    assert keys[0] == keys[1]  # every worker steps through the same lengths
    together = BpttStreamIter(ids, **{**common, "batch_size": 6}, seed=4, longest=30)
    assert sorted(_pairs(parts[0]) + _pairs(parts[1])) == sorted(_pairs(together))


def test_random_lengths_depend_on_seed_and_epoch_only() -> None:
    ids = np.arange(3000, dtype=np.int64) % 90 + 3
    it = BpttStreamIter(ids, vocab=_vocab(100), batch_size=4, bptt=35, random_length=True)
    first = it.epoch_lengths(0)
    assert first == it.epoch_lengths(0) and first != it.epoch_lengths(1)
    assert sum(first) == it.stream_length
    assert all(k % 5 == 0 for k in first[:-1])  # bucketed: multiples of length_step
    rng = np.random.default_rng(0)
    drawn = random_lengths(10**5, 70, 5, 90, rng)
    assert 60 < np.mean(drawn) < 72 and max(drawn) <= 90 and min(drawn) >= 5


def test_build_reads_the_file_and_eval_reuses_the_vocabulary(tmp_path: Path) -> None:
    (tmp_path / "train.txt").write_text("a b c\nb c d\n")
    (tmp_path / "valid.txt").write_text("a d x\n")
    options = BpttStreamOptions(source="train.txt", batch_size=2, bptt=3)
    train = build_bptt_stream_iter(options, DataContext("train", 1, tmp_path))
    assert train.data_info.stream and train.data_info.task == "lm"
    assert train.stats["tokens"] == 8  # two sentences of 3 words, each with <eos>
    valid = build_bptt_stream_iter(
        BpttStreamOptions(source="valid.txt", batch_size=1, bptt=3),
        DataContext("eval", 1, tmp_path, train=train),
    )
    assert valid.vocab is train.vocab
    assert "1 lines -> 4 tokens" in valid.describe()


def test_predict_reads_lines(tmp_path: Path) -> None:
    (tmp_path / "train.txt").write_text("a b c\nb c d\n")
    options = BpttStreamOptions(source="train.txt", batch_size=2, bptt=3)
    train = build_bptt_stream_iter(options, DataContext("train", 1, tmp_path))
    predict = build_bptt_stream_iter(options, DataContext("predict", 1, tmp_path, train=train))
    assert not predict.data_info.stream and predict.num_sentences == 2


def test_too_few_streams_for_the_devices(tmp_path: Path) -> None:
    (tmp_path / "t.txt").write_text("a b c\n")
    options = BpttStreamOptions(source="t.txt", batch_size=1, bptt=3)
    with pytest.raises(DataError, match="at least 2"):
        build_bptt_stream_iter(options, DataContext("train", 1, tmp_path, min_batch=2))


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"bptt": 0}, "bptt"),
        ({"bptt": 10**6}, "bptt"),
        ({"random_length": True, "bptt": 4, "length_step": 5}, "length_step"),
        ({"batch_size": 0}, "batch_size"),
        ({"level": "byte"}, "level"),
        ({"specials": ["<eos>"]}, "specials"),
        ({"num_parts": 2, "part_index": 2}, "part_index"),
    ],
)
def test_options_name_the_bad_key(changes: dict, key: str) -> None:
    with pytest.raises(InvalidValue) as info:
        BpttStreamOptions(**changes)
    assert info.value.key == key
