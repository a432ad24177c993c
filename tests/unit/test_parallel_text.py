"""parallel_text: pairs, 2-D buckets, batch sizes, long pairs, order, sharding, vocabularies,
predict and detokenize."""

from __future__ import annotations

import json
import logging
import typing
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from mxtrain.data import pair_buckets
from mxtrain.data.base import DataContext, Seq2SeqInfo, data_info_from, model_inputs
from mxtrain.data.parallel_text import TARGET_VOCAB_FILE, build_parallel_text_iter
from mxtrain.data.parallel_text_options import ParallelTextOptions
from mxtrain.data.vocab import Vocab
from mxtrain.errors import DataError
from mxtrain.run.bucket_keys import as_tuples

WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far"]


def write(folder: Path, name: str, lines: list[str]) -> str:
    (folder / name).write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return name


def random_pairs(count: int, seed: int = 0, longest: int = 9) -> tuple[list[str], list[str]]:
    """Word pairs whose target length follows the source's (as in translation), upper case."""
    rng = np.random.default_rng(seed)
    src, tgt = [], []
    for _ in range(count):
        n = int(rng.integers(1, longest + 1))
        m = max(1, n + int(rng.integers(-2, 3)))
        src.append(" ".join(rng.choice(WORDS, size=n)))
        tgt.append(" ".join(w.upper() for w in rng.choice(WORDS, size=m)))
    return src, tgt


def build(
    folder: Path,
    src: list[str] | None = None,
    tgt: list[str] | None = None,
    *,
    role: str = "train",
    seed: int = 3,
    context: dict[str, typing.Any] | None = None,
    **kw: typing.Any,
):
    if src is not None:
        kw.setdefault("source", write(folder, "data.src", src))
    if tgt is not None:
        kw.setdefault("target", write(folder, "data.tgt", tgt))
    kw.setdefault("target", "data.tgt")
    options = ParallelTextOptions(**kw)
    ctx = DataContext(role=role, seed=seed, base_dir=folder, **(context or {}))
    return build_parallel_text_iter(options, ctx)


def batches(it) -> list:
    it.reset()
    return list(it)


def rows_of(it) -> dict[int, tuple[list[int], list[int], list[int], tuple[int, int]]]:
    """line -> (source ids, decoder inputs, labels, bucket key), padding stripped."""
    seen = {}
    for b in batches(it):
        data = [d.asnumpy() for d in b.data]
        label = b.label[0].asnumpy()
        for r, line in enumerate(b.index):
            if line < 0:
                assert not data[0][r].any() and not label[r].any()  # padding rows are all <pad>
                continue
            assert int(line) not in seen
            seen[int(line)] = (
                [int(x) for x in data[0][r] if x],
                [int(x) for x in data[1][r] if x],
                [int(x) for x in label[r] if x],
                b.bucket_key,
            )
    return seen


# ------------------------------------------------------------------------------ batches


def test_batches_hold_source_decoder_inputs_and_labels_of_every_pair(tmp_path: Path) -> None:
    src, tgt = random_pairs(41)
    it = build(tmp_path, src, tgt, batch_size=4, shuffle=False)
    assert isinstance(it.data_info, Seq2SeqInfo)
    info = it.data_info
    assert (info.vocab_size, info.num_classes) == (len(it.vocab), len(it.target_vocab))
    assert (info.pad_id, info.eos_id, info.bos_id, info.tokens) == (0, 2, 3, "whitespace")
    assert it.target_vocab.tokens[:4] == ["<pad>", "<unk>", "<eos>", "<bos>"]
    for b in batches(it):
        S, T = b.bucket_key
        rows = b.data[0].shape[0]
        assert [d.name for d in b.provide_data] == ["source", "target"]
        assert [tuple(d.shape) for d in b.provide_data] == [(rows, S), (rows, T)]
        assert [(d.name, tuple(d.shape)) for d in b.provide_label] == [("target_label", (rows, T))]
        assert b.data[0].dtype == np.float32 and b.label[0].shape == (rows, T)
        assert b.num_tokens == int((b.label[0].asnumpy() != 0).sum())
    seen = rows_of(it)
    assert sorted(seen) == list(range(41))
    for line, (source, decoder, label, _key) in seen.items():
        assert source == it.vocab.encode(src[line].split())
        words = it.target_vocab.encode(tgt[line].split())
        assert decoder == [3, *words] and label == [*words, 2]
    assert it.provide_data[0].shape == (4, it.default_bucket_key[0])


def test_model_inputs_record_tuple_keys_as_json(tmp_path: Path) -> None:
    src, tgt = random_pairs(20)
    it = build(tmp_path, src, tgt, batch_size=4)
    saved = json.loads(json.dumps(model_inputs(it)))  # what fit writes, read back
    assert as_tuples(saved["default_bucket_key"]) == it.default_bucket_key
    assert [as_tuples(k) for k in saved["buckets"]] == it.buckets
    assert data_info_from(saved) == it.data_info


def test_every_pair_sits_in_the_smallest_bucket_holding_both_sides(tmp_path: Path) -> None:
    src, tgt = random_pairs(200, seed=1, longest=14)
    it = build(tmp_path, src, tgt, max_padding=0.15, num_buckets=None, shuffle=False)
    buckets = it.buckets
    largest = (max(s for s, _ in buckets), max(t for _, t in buckets))
    assert it.default_bucket_key == largest and largest in buckets
    for line, (source, _decoder, label, key) in rows_of(it).items():
        s, t = len(source), len(label)
        holding = [b for b in buckets if b[0] >= s and b[1] >= t]
        assert key == min(holding, key=lambda b: (b[0] + b[1], b[1], b[0])), line
    # the padding rule's bound holds (num_buckets: null lets it reach it)
    s_lens = np.array([len(x.split()) for x in src])
    t_lens = np.array([len(x.split()) + 1 for x in tgt])
    assert pair_buckets.padding_share(s_lens, t_lens, buckets) <= 0.15
    assert it.stats["bucket_padding"] == pytest.approx(
        pair_buckets.padding_share(s_lens, t_lens, buckets)
    )


def test_auto_buckets_stop_at_num_buckets(tmp_path: Path) -> None:
    src, tgt = random_pairs(200, seed=1, longest=14)
    it = build(tmp_path, src, tgt, max_padding=0.01, num_buckets=3)
    assert len(it.buckets) <= 3 and it.default_bucket_key in it.buckets


def test_auto_pair_buckets_on_hand_made_lengths() -> None:
    # two clusters: (2, 3) x 10 and (10, 12) x 10; one bucket pads the short ones by 17 each
    s = np.array([2] * 10 + [10] * 10)
    t = np.array([3] * 10 + [12] * 10)
    assert pair_buckets.auto_pair_buckets(s, t, 0.5, None) == [(10, 12)]
    assert pair_buckets.auto_pair_buckets(s, t, 0.1, None) == [(2, 3), (10, 12)]
    assert pair_buckets.auto_pair_buckets(s, t, 0.1, 1) == [(10, 12)]
    # a bucket added early that later ones make useless is dropped again
    s2 = np.array([1, 2, 3, 4] * 5)
    t2 = np.array([2, 3, 4, 5] * 5)
    chosen = pair_buckets.auto_pair_buckets(s2, t2, 0.0, None)
    assert chosen == [(1, 2), (2, 3), (3, 4), (4, 5)]


def test_batch_tokens_sizes_each_bucket_by_its_decoder_positions(tmp_path: Path) -> None:
    src, tgt = random_pairs(80, seed=2)
    buckets = [(3, 4), (10, 5), (6, 8), (10, 12)]
    it = build(tmp_path, src, tgt, buckets=buckets, batch_tokens=50, batch_size=999)
    # default (10, 12): 50 // 12 = 4 rows, budget 48 target positions, 40 source positions
    expected = {(10, 12): 4, (6, 8): 6, (3, 4): 12, (10, 5): 4}  # (10, 5): 48 // 5 = 9 > 40 // 10
    assert it.bucket_batch_sizes == expected and it.batch_size == 4
    for b in batches(it):
        S, T = b.bucket_key
        rows = b.data[0].shape[0]
        assert rows <= expected[(S, T)]
        assert rows * T <= 48 and rows * S <= 40  # never more than the default bucket binds
    assert it.provide_data[1].shape == (4, 12)


def test_last_batch_short_or_padded(tmp_path: Path) -> None:
    src, tgt = random_pairs(30, seed=4)
    buckets = [(9, 12)]
    short = build(tmp_path, src, tgt, buckets=buckets, batch_size=8, shuffle=False)
    padded = build(
        tmp_path, src, tgt, buckets=buckets, batch_size=8, shuffle=False, last_batch="pad"
    )
    assert [b.data[0].shape[0] for b in batches(short)] == [8, 8, 8, 6]
    assert [(b.data[0].shape[0], b.pad) for b in batches(padded)] == [(8, 0)] * 3 + [(8, 2)]


# -------------------------------------------------------------------------- long pairs


def test_long_pairs_are_skipped_and_counted_in_one_log_line(tmp_path: Path, caplog) -> None:
    src = ["a b", "a b c d e f", "a", "a b c", "a"]
    tgt = ["X", "X", "X Y Z W V", "X", "X"]
    with caplog.at_level(logging.INFO, logger="mxtrain.data.parallel_text"):
        it = build(tmp_path, src, tgt, buckets=[(3, 3), (4, 4)], shuffle=False)
    assert sorted(rows_of(it)) == [0, 3, 4]
    assert it.stats["skipped_long"] == 2
    lines = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(lines) == 1 and "2 of 5 pairs" in lines[0] and "line 2" in lines[0]
    capped = build(tmp_path, src, tgt, max_source_length=2, max_target_length=1)
    assert sorted(rows_of(capped)) == [0, 4]
    assert capped.default_bucket_key == (2, 2)


def test_long_pairs_error_names_the_first_line(tmp_path: Path) -> None:
    src = ["a b", "a", "a b c d e f"]
    tgt = ["X", "X Y Z W V", "X"]
    with pytest.raises(
        DataError, match=r"data.src:2 and .*data.tgt:2: the pair has 1 source and 5"
    ):
        build(tmp_path, src, tgt, buckets=[(3, 3), (4, 4)], long_pairs="error")


# ------------------------------------------------------------------------------ errors


def test_line_counts_that_differ_name_both_files_and_counts(tmp_path: Path) -> None:
    with pytest.raises(DataError) as caught:
        build(tmp_path, ["a", "b", "c"], ["X", "Y"])
    message = str(caught.value)
    assert "data.src has 3 lines" in message and "data.tgt has 2" in message


def test_an_empty_side_names_its_file_and_line(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"data.tgt:2: line 2 is empty"):
        build(tmp_path, ["a", "b", "c"], ["X", "  ", "Z"])
    with pytest.raises(DataError, match=r"data.src:3: line 3 is empty"):
        build(tmp_path, ["a", "b", ""], ["X", "Y", "Z"])


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    write(tmp_path, "data.src", ["a"])
    with pytest.raises(DataError, match=r"nope.tgt"):
        build(tmp_path, source="data.src", target="nope.tgt")


def test_max_pairs_reads_the_first_pairs_after_checking_the_counts(tmp_path: Path) -> None:
    src, tgt = random_pairs(20)
    it = build(tmp_path, src, tgt, max_pairs=7)
    assert sorted(rows_of(it)) == list(range(7))
    with pytest.raises(DataError, match="differ in length"):
        build(tmp_path, src, tgt[:-1], max_pairs=7)


# ------------------------------------------------------------------- order and sharding


def order(it, epoch: int) -> list[tuple[tuple[int, int], tuple[int, ...]]]:
    it.set_epoch(epoch)
    return [(b.bucket_key, tuple(int(i) for i in b.index)) for b in batches(it)]


def test_epoch_order_depends_on_seed_and_epoch_alone(tmp_path: Path) -> None:
    src, tgt = random_pairs(60, seed=5)
    first = build(tmp_path, src, tgt, batch_size=4, seed=11)
    again = build(tmp_path, src, tgt, batch_size=4, seed=11)
    other = build(tmp_path, src, tgt, batch_size=4, seed=12)
    assert order(first, 2) == order(again, 2)  # a resumed run replays epoch 2
    assert order(first, 2) != order(first, 3)
    assert order(first, 2) != order(other, 2)
    assert order(first, 0) == order(again, 0)
    unshuffled = build(tmp_path, src, tgt, batch_size=4, shuffle=False)
    assert order(unshuffled, 0) == order(unshuffled, 1)


@pytest.mark.parametrize("last_batch", ["short", "pad"])
def test_parts_are_disjoint_cover_every_pair_and_run_the_same_batches(
    tmp_path: Path, last_batch: str
) -> None:
    src, tgt = random_pairs(47, seed=6)
    parts = [
        build(tmp_path, src, tgt, batch_size=4, num_parts=3, part_index=p, last_batch=last_batch)
        for p in range(3)
    ]
    for epoch in (0, 1):
        orders = [order(part, epoch) for part in parts]
        lines = [[i for _, index in o for i in index if i >= 0] for o in orders]
        assert sorted(i for part in lines for i in part) == list(
            range(47)
        )  # covering, and disjoint
        # dist_sync: the same number of batches, and the same bucket at every step
        assert len({len(o) for o in orders}) == 1
        assert len({tuple(key for key, _ in o) for o in orders}) == 1
    assert {len(part) for part in parts} == {len(orders[0])}


# ------------------------------------------------------------------------- vocabularies


def test_eval_reuses_the_training_vocabularies_and_buckets(tmp_path: Path) -> None:
    src, tgt = random_pairs(50, seed=7)
    train = build(tmp_path, src, tgt, min_count=2)
    dev_src = write(tmp_path, "dev.src", ["the zebra sat", "a cat"])
    dev_tgt = write(tmp_path, "dev.tgt", ["THE ZEBRA", "A"])
    dev = build(tmp_path, source=dev_src, target=dev_tgt, role="eval", context={"train": train})
    assert dev.vocab is train.vocab and dev.target_vocab is train.target_vocab
    assert dev.buckets == train.buckets and dev.default_bucket_key == train.default_bucket_key
    rows = rows_of(dev)
    assert rows[0][0][1] == Vocab.unk_id and rows[0][2][1] == Vocab.unk_id  # zebra, ZEBRA
    assert not dev.shuffle


def test_vocabularies_per_side_or_shared(tmp_path: Path) -> None:
    src, tgt = random_pairs(30, seed=8)
    separate = build(tmp_path, src, tgt, max_vocab=7)
    assert len(separate.vocab) == len(separate.target_vocab) == 7
    assert "cat" not in separate.target_vocab and "CAT" not in separate.vocab
    assert TARGET_VOCAB_FILE in separate.artifacts()
    shared = build(tmp_path, src, tgt, shared_vocab=True)
    assert shared.vocab is shared.target_vocab and shared.artifacts() == {}
    assert "cat" in shared.vocab and "CAT" in shared.vocab
    assert shared.data_info.shared_vocab and shared.data_info.vocab_size == len(shared.vocab)


def save_run(it, folder: Path) -> Path:
    """What fit writes: vocab.json and the iterator's artifacts."""
    folder.mkdir()
    it.vocab.save(folder / "vocab.json")
    for name, save in it.artifacts().items():
        save(folder / name)
    return folder / "vocab.json"


def test_a_run_folder_gives_both_vocabularies_back(tmp_path: Path) -> None:
    src, tgt = random_pairs(30, seed=9)
    train = build(tmp_path, src, tgt)
    vocab_file = save_run(train, tmp_path / "run")
    for role in ("eval", "predict"):
        again = build(tmp_path, role=role, context={"vocab_file": vocab_file}, source="data.src")
        assert again.vocab == train.vocab and again.target_vocab == train.target_vocab
    # the vocab option of a new training run reads both files too
    reused = build(tmp_path, vocab="run/vocab.json", source="data.src")
    assert reused.vocab == train.vocab and reused.target_vocab == train.target_vocab
    (tmp_path / "run" / TARGET_VOCAB_FILE).unlink()
    with pytest.raises(DataError, match=r"target_vocab.json does not exist.*shared_vocab"):
        build(tmp_path, role="eval", context={"vocab_file": vocab_file}, source="data.src")


def test_a_vocabulary_of_another_kind_is_refused(tmp_path: Path) -> None:
    src, tgt = random_pairs(10)
    write(tmp_path, "data.src", src)
    write(tmp_path, "data.tgt", tgt)
    Vocab.build([["a"]], level="word").save(tmp_path / "lm_vocab.json")  # no <bos>
    with pytest.raises(DataError, match="<bos>"):
        build(tmp_path, vocab="lm_vocab.json", shared_vocab=True, source="data.src")
    chars = build(tmp_path, tokens="chars", shared_vocab=True, source="data.src")
    save_run(chars, tmp_path / "chars_run")
    with pytest.raises(DataError, match="tokens: chars"):
        build(tmp_path, vocab="chars_run/vocab.json", shared_vocab=True, source="data.src")


def test_no_vocabulary_for_eval_without_train_or_run(tmp_path: Path) -> None:
    src, tgt = random_pairs(5)
    with pytest.raises(DataError, match="needs the training vocabularies"):
        build(tmp_path, src, tgt, role="eval")


# ----------------------------------------------------------------- predict, detokenize


def test_predict_reads_the_source_in_order_and_gives_long_lines_a_bucket(tmp_path: Path) -> None:
    src, tgt = random_pairs(40, seed=10, longest=6)
    train = build(tmp_path, src, tgt, buckets=[(3, 5), (6, 9)])
    inputs = ["a cat", "", "the " * 9 + "dog", "mat", "a b c d e f g"]
    name = write(tmp_path, "input.txt", inputs)
    it = build(tmp_path, source=name, target="absent.tgt", role="predict", context={"train": train})
    assert it.num_sentences == 5 and it.stats["skipped_empty"] == 1
    assert [d.name for d in it.provide_data] == ["source"] and it.provide_label == []
    seen = {}
    for b in batches(it):
        assert b.label == [] and len(b.data) == 1
        assert b.bucket_key[1] == 9  # nominal: the largest training T
        for r, line in enumerate(b.index):
            if line >= 0:
                seen[int(line)] = ([int(x) for x in b.data[0].asnumpy()[r] if x], b.bucket_key)
    assert sorted(seen) == [0, 2, 3, 4]  # every non-blank line, whole
    assert len(seen[2][0]) == 10 and seen[2][1][0] >= 10  # a bucket beyond the largest (6)
    assert len(seen[4][0]) == 7 and seen[4][1][0] > 6
    assert seen[0][1] == (3, 9) and seen[3][1] == (3, 9)


def test_detokenize_round_trips_whitespace_and_chars(tmp_path: Path) -> None:
    src = ["a b", "c"]
    tgt = ["hello  world", "x"]
    words = build(tmp_path, src, tgt)
    ids = [3, *words.target_vocab.encode(["hello", "world"]), 2, 0, 0]
    assert words.detokenize(ids) == "hello world"
    assert words.detokenize(np.array(ids, dtype=np.float32)) == "hello world"
    chars = build(tmp_path, src, tgt, tokens="chars")
    label = rows_of(chars)[0][2]
    assert chars.detokenize(label) == "hello world"  # one space token between words
    assert chars.data_info.tokens == "chars"
    assert chars.detokenize([3, 2, *label]) == ""  # stops at the first <eos>


def test_reverse_target_reads_each_target_last_token_first_and_writes_it_back(
    tmp_path: Path,
) -> None:
    src, tgt = random_pairs(23, seed=4)
    forward = build(tmp_path, src, tgt, batch_size=4, shuffle=False)
    backward = build(tmp_path, src, tgt, batch_size=4, shuffle=False, reverse_target=True)
    assert backward.data_info.reverse_target and not forward.data_info.reverse_target
    # the same tokens and counts: the same vocabularies and buckets
    assert backward.target_vocab.tokens == forward.target_vocab.tokens
    assert backward.buckets == forward.buckets
    ahead, behind = rows_of(forward), rows_of(backward)
    for line, (source, decoder, label, key) in behind.items():
        words = forward.target_vocab.encode(tgt[line].split())[::-1]
        assert (source, key) == (ahead[line][0], ahead[line][3])
        assert decoder == [3, *words] and label == [*words, 2]
        assert backward.detokenize(label) == tgt[line]  # in reading order again
    chars = build(tmp_path, ["a b"], ["hi yo"], tokens="chars", reverse_target=True)
    label = rows_of(chars)[0][2]
    assert chars.target_vocab.decode(label[:-1]) == list("oy ih")
    assert chars.detokenize(label) == "hi yo"
    # eval iterators keep the references as read, in reading order
    evaluated = build(tmp_path, src, tgt, role="eval", reverse_target=True,
                      context={"train": backward})  # fmt: skip
    assert [p.target for p in evaluated.pairs()] == tgt


def test_chars_tokens_count_characters_and_the_space(tmp_path: Path) -> None:
    it = build(tmp_path, ["ab c"], ["xy"], tokens="chars", shared_vocab=True)
    source, _decoder, label, key = rows_of(it)[0]
    assert [it.vocab.tokens[i] for i in source] == ["a", "b", " ", "c"]
    assert len(label) == 3 and key == (4, 3)
    assert Counter(it.vocab.tokens[4:]) == Counter(["a", "b", " ", "c", "x", "y"])
