"""tagged_sequences: CoNLL/CoNLL-U parsing, errors with file:line, vocabularies, batches."""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
import typing
from pathlib import Path

import numpy as np
import pytest

from mxtrain.data.base import DataContext
from mxtrain.data.conll import detect_format, parse_conll, read_conll
from mxtrain.data.label_vocab import LabelVocab
from mxtrain.data.tagged import TaggedSequenceIter, build_tagged_iter
from mxtrain.data.tagged_options import TaggedSequencesOptions
from mxtrain.data.vocab import Vocab
from mxtrain.errors import DataError, InvalidValue

CONLL = """\
-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC


Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER

BRUSSELS NNP B-NP B-LOC
"""

CONLLU = """\
# sent_id = 1
# text = I don't know.
1\tI\tI\tPRON\tPRP\t_\t3\tnsubj\t_\t_
2-3\tdon't\t_\t_\t_\t_\t_\t_\t_\t_
2\tdo\tdo\tAUX\tVBP\t_\t3\taux\t_\t_
3\tn't\tnot\tPART\tRB\t_\t3\tadvmod\t_\t_
3.1\tknow\tknow\tVERB\tVB\t_\t_\t_\t0:root\t_
4\t.\t.\tPUNCT\t.\t_\t3\tpunct\t_\t_

# sent_id = 2
1\tNew York\tNew York\tPROPN\tNNP\t_\t0\troot\t_\t_
"""


def options(**kw: typing.Any) -> TaggedSequencesOptions:
    kw.setdefault("source", "data.conll")
    return TaggedSequencesOptions(**kw)


def parse(text: str, **kw: typing.Any):
    labels = kw.pop("labels", True)
    return parse_conll(text, "f.conll", options(**kw), labels=labels)


def write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def context(tmp_path: Path, role: str = "train", **kw: typing.Any) -> DataContext:
    return DataContext(role=role, seed=kw.pop("seed", 5), base_dir=tmp_path, **kw)


# ------------------------------------------------------------------------------- options


def test_reading_options_does_not_import_mxnet() -> None:
    code = (
        "import sys\n"
        "import mxtrain.data.tagged_options, mxtrain.data.conll, mxtrain.data.label_vocab\n"
        "from mxtrain.registry import ITERATORS\n"
        "ITERATORS.get('tagged_sequences').options_class()\n"
        "assert 'mxnet' not in sys.modules, 'mxnet was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_option_is_documented() -> None:
    hints = typing.get_type_hints(TaggedSequencesOptions)
    for f in dataclasses.fields(TaggedSequencesOptions):
        assert f.metadata["doc"], f.name
        assert f.name in hints


@pytest.mark.parametrize(
    "bad",
    [
        {"source": " "},
        {"format": "conll2003"},
        {"delimiter": "comma"},
        {"token_column": "1"},
        {"label_column": True},
        {"format": "conllu", "label_column": 10},
        {"token_column": 2, "label_column": 2},
        {"batch_size": 0},
        {"num_buckets": 0},
        {"min_count": 0},
        {"max_sentences": 0},
        {"max_vocab": 3},
        {"long_sentences": "wrap"},
        {"buckets": "some"},
        {"buckets": []},
        {"buckets": [5, 3]},
        {"buckets": [0, 3]},
    ],
)
def test_impossible_options_name_the_key(bad: dict) -> None:
    name = next(k for k in reversed(bad) if k != "format") if len(bad) > 1 else next(iter(bad))
    with pytest.raises(ValueError, match=name):
        options(**bad)


def test_default_columns_depend_on_the_format() -> None:
    assert options().columns("conll") == (0, -1)
    assert options().columns("conllu") == (1, 3)
    assert options(token_column=2, label_column=4).columns("conllu") == (2, 4)


# ------------------------------------------------------------------------------- parsing


def test_conll_sentences_tokens_labels_and_lines() -> None:
    fmt, sents = parse(CONLL)
    assert fmt == "conll"
    assert [s.tokens for s in sents] == [
        ("EU", "rejects", "German"),
        ("Peter", "Blackburn"),
        ("BRUSSELS",),  # no blank line at the end of the file
    ]
    assert [s.labels for s in sents] == [("B-ORG", "O", "B-MISC"), ("B-PER", "I-PER"), ("B-LOC",)]
    assert [s.line for s in sents] == [3, 8, 11]  # -DOCSTART- is not a sentence


def test_column_selection_and_negative_columns() -> None:
    _, sents = parse(CONLL, label_column=1)
    assert sents[0].labels == ("NNP", "VBZ", "JJ")
    _, sents = parse(CONLL, token_column=-4, label_column=-2)
    assert sents[1].tokens == ("Peter", "Blackburn") and sents[1].labels == ("B-NP", "I-NP")


def test_crlf_blank_lines_with_spaces_and_tabs_delimiter() -> None:
    text = "New York\tNNP\r\nis\tVBZ\r\n  \r\nit\tPRP\r\n"
    _, sents = parse(text, delimiter="tab")
    assert [s.tokens for s in sents] == [("New York", "is"), ("it",)]
    assert [s.labels for s in sents] == [("NNP", "VBZ"), ("PRP",)]
    assert [s.line for s in sents] == [1, 4]


def test_conllu_skips_comments_ranges_and_empty_nodes() -> None:
    fmt, sents = parse(CONLLU)
    assert fmt == "conllu"
    assert [s.tokens for s in sents] == [("I", "do", "n't", "."), ("New York",)]
    assert [s.labels for s in sents] == [("PRON", "AUX", "PART", "PUNCT"), ("PROPN",)]
    assert [s.line for s in sents] == [3, 11]
    _, sents = parse(CONLLU, label_column=4)  # XPOS
    assert sents[0].labels == ("PRP", "VBP", "RB", ".")
    _, sents = parse(CONLLU, format="conllu", token_column=2, label_column=-3)  # LEMMA, DEPREL
    assert sents[0].tokens == ("I", "do", "not", ".")
    assert sents[0].labels == ("nsubj", "aux", "advmod", "punct")


def test_format_detection() -> None:
    assert detect_format(CONLLU.split("\n")) == "conllu"
    assert detect_format(CONLL.split("\n")) == "conll"
    assert detect_format(["", "# only a comment"]) == "conll"
    # 10 whitespace-separated columns are not CoNLL-U: it needs tabs
    assert detect_format(["1 a b c d e f g h i"]) == "conll"
    # in a CoNLL file a "#" line is a token
    _, sents = parse("# SYM\nx NN\n", format="conll")
    assert sents[0].tokens == ("#", "x")


def test_predict_reads_only_the_token_column() -> None:
    _, sents = parse("a\nb\n\nc\n", labels=False)
    assert [s.tokens for s in sents] == [("a", "b"), ("c",)]
    assert sents[0].labels is None


def test_max_sentences_stops_reading() -> None:
    _, sents = parse_conll(CONLL + "broken line here\n", "f", options(), max_sentences=2)
    assert len(sents) == 2


# ------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("text", "kw", "line", "words"),
    [
        ("a NN\nb NN x\n", {}, 2, ["has 3 columns", "(line 1) has 2"]),
        ("a NN\n\nb\n", {}, 3, ["1 column,", "has 2"]),
        ("a\tNN\n\tNN\n", {"delimiter": "tab"}, 2, ["token column is empty"]),
        ("a\t\n", {"delimiter": "tab"}, 1, ["label column is empty"]),
        ("a NN\n", {"label_column": 3}, 1, ["label_column 3 does not exist", "2 columns"]),
        ("a NN\n", {"token_column": -3}, 1, ["token_column -3 does not exist"]),
        ("a\nb\n", {}, 1, ["same column", "no labels"]),
        ("1\ta\ta\tX\n", {"format": "conllu"}, 1, ["10 tab-separated", "has 4", "spaces"]),
        ("x\ta\ta\tX\t_\t_\t_\t_\t_\t_\n", {"format": "conllu"}, 1, ["ID 'x'"]),
        (CONLLU.replace("4\t.", "4 ."), {}, 8, ["10 tab-separated"]),
    ],
)
def test_malformed_lines_name_file_and_line(text, kw, line, words) -> None:
    with pytest.raises(DataError) as info:
        parse(text, **kw)
    message = info.value.message
    assert message.startswith(f"f.conll:{line}: "), message
    for word in words:
        assert word in message, message
    assert info.value.hint


def test_file_errors(tmp_path: Path) -> None:
    def error(source: str, **kw: typing.Any) -> str:
        with pytest.raises(DataError) as info:
            read_conll(options(source=source, **kw), tmp_path)
        return info.value.message

    assert "does not exist" in error("missing.conll")
    assert str(tmp_path / "missing.conll") in error("missing.conll")
    (tmp_path / "folder").mkdir()
    assert "is a directory" in error("folder")
    write(tmp_path, "latin1.conll", "a NN\n\ncaf\xe9 NN\n".encode("latin-1"))
    assert error("latin1.conll").startswith(f"{tmp_path / 'latin1.conll'}:3: not UTF-8")
    write(tmp_path, "empty.conll", "")
    assert "has no sentences" in error("empty.conll")
    write(tmp_path, "blank.conll", "\n \n\n")
    assert "has no sentences" in error("blank.conll")
    write(tmp_path, "comments.conllu", "# sent_id = 1\n# text = nothing\n\n")
    assert "has no sentences" in error("comments.conllu", format="conllu")
    write(tmp_path, "bad.conll", "a NN\nb\n")
    assert error("bad.conll").startswith(f"{tmp_path / 'bad.conll'}:2: ")


def test_a_bad_file_is_a_data_error_before_training(tmp_path: Path) -> None:
    write(tmp_path, "bad.conll", "a NN\nb NN\n\nc NN extra\n")
    with pytest.raises(DataError, match=r"bad\.conll:4: "):
        build_tagged_iter(options(source="bad.conll"), context(tmp_path))


# ------------------------------------------------------------------------------- vocabularies


def test_vocabularies_and_data_info(tmp_path: Path) -> None:
    write(tmp_path, "t.conll", "b X\na Y\n\nb X\nc Z\n\nb Y\n")
    it = build_tagged_iter(options(source="t.conll"), context(tmp_path))
    assert it.vocab.tokens == ["<pad>", "<unk>", "<eos>", "b", "a", "c"]
    assert it.label_vocab.labels == ["<pad>", "<unk>", "X", "Y", "Z"]
    info = it.data_info
    assert (info.vocab_size, info.num_classes, info.pad_id, info.task) == (6, 5, 0, "tag")
    it = build_tagged_iter(
        options(source="t.conll", min_count=2, lowercase=True), context(tmp_path)
    )
    assert it.vocab.tokens == ["<pad>", "<unk>", "<eos>", "b"]
    assert it.vocab.lowercase is True


def test_label_vocab_round_trip_and_bad_files(tmp_path: Path) -> None:
    vocab = LabelVocab.build([["B", "A"], ["A", "<pad>"]])
    assert vocab.labels == ["<pad>", "<unk>", "A", "B"]
    assert vocab.encode(["B", "new", "<pad>"]) == [3, 1, 1]  # a literal <pad> is not padding
    assert vocab.decode([2.0, 3]) == ["A", "B"]
    vocab.save(tmp_path / "labels.json")
    assert LabelVocab.load(tmp_path / "labels.json") == vocab
    for text, words in [
        ("{", "not valid JSON"),
        ('{"format": "mxtrain-vocab"}', "not an mxtrain label vocabulary"),
        (
            '{"format": "mxtrain-label-vocab", "version": 1, "specials": '
            '{"pad": "<pad>", "unk": "<unk>"}, "labels": ["<pad>", "<unk>", "A", "A"]}',
            "twice",
        ),
    ]:
        write(tmp_path, "bad.json", text)
        with pytest.raises(DataError, match=words):
            LabelVocab.load(tmp_path / "bad.json")
    with pytest.raises(DataError, match="does not exist"):
        LabelVocab.load(tmp_path / "none.json")


def test_eval_reuses_the_training_vocabularies_and_counts_unknowns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(tmp_path, "train.conll", "the DT\ncat NN\n\nthe DT\ndog NN\nran VB\n")
    write(tmp_path, "dev.conll", "the DT\nemu NN\n\nthe DT\ncat XX\nran YY\n\nran XX\n")
    train = build_tagged_iter(options(source="train.conll"), context(tmp_path))
    with caplog.at_level(logging.WARNING):
        dev = build_tagged_iter(
            options(source="dev.conll", shuffle=False), context(tmp_path, "eval", train=train)
        )
    assert dev.vocab is train.vocab and dev.label_vocab is train.label_vocab
    assert dev.buckets == train.buckets
    assert dev.stats["unk_labels"] == 3
    assert dev.stats["unk_ratio"] == pytest.approx(1 / 6)
    assert "unknown labels: 3" in dev.describe()
    assert "'XX' (2), 'YY' (1)" in caplog.text
    batches = list(dev)
    data = np.concatenate([b.data[0].asnumpy().ravel() for b in batches])
    label = np.concatenate([b.label[0].asnumpy().ravel() for b in batches])
    unk_token = train.vocab.token_id("emu")
    assert unk_token == Vocab.unk_id and (data == unk_token).sum() == 1
    assert (label == LabelVocab.unk_id).sum() == 3


def test_artifacts_save_the_label_vocab_for_a_run_folder(tmp_path: Path) -> None:
    write(tmp_path, "train.conll", "the DT\ncat NN\n\nthe DT\ndog NN\nran VB\n")
    write(tmp_path, "new.conll", "a\ncat\nran\n")
    train = build_tagged_iter(options(source="train.conll"), context(tmp_path))
    run = tmp_path / "run"
    run.mkdir()
    train.vocab.save(run / "vocab.json")
    saved = train.artifacts()
    assert list(saved) == ["label_vocab.json"]
    for name, save in saved.items():
        save(run / name)
    assert json.loads((run / "label_vocab.json").read_text())["labels"][2:] == ["DT", "NN", "VB"]
    # score / predict: built from the run folder alone (the label vocab found beside vocab.json)
    ctx = context(tmp_path, "predict", vocab_file=run / "vocab.json", buckets=(2, 3))
    it = build_tagged_iter(options(source="new.conll"), ctx)
    assert it.label_vocab == train.label_vocab and it.vocab == train.vocab
    assert it.data_info == train.data_info
    # or from artifacts_dir
    other = tmp_path / "elsewhere"
    other.mkdir()
    (run / "label_vocab.json").rename(other / "label_vocab.json")
    with pytest.raises(DataError, match=r"label_vocab\.json does not exist"):
        build_tagged_iter(options(source="new.conll"), ctx)
    ctx = dataclasses.replace(ctx, artifacts_dir=other)
    assert build_tagged_iter(options(source="new.conll"), ctx).label_vocab == train.label_vocab
    # a resumed train iterator keeps the run's label ids
    resumed = build_tagged_iter(
        options(source="train.conll"),
        context(tmp_path, "train", vocab_file=run / "vocab.json", artifacts_dir=other),
    )
    assert resumed.label_vocab == train.label_vocab
    with pytest.raises(DataError, match="no train iterator"):
        build_tagged_iter(options(source="train.conll"), context(tmp_path, "eval"))


def test_lowercase_must_match_the_saved_vocabulary(tmp_path: Path) -> None:
    write(tmp_path, "t.conll", "A X\n")
    train = build_tagged_iter(options(source="t.conll", lowercase=True), context(tmp_path))
    with pytest.raises(DataError, match="lowercase"):
        build_tagged_iter(options(source="t.conll"), context(tmp_path, "eval", train=train))


# ------------------------------------------------------------------------------- batches


def corpus(tmp_path: Path, lengths: list[int], name: str = "c.conll") -> Path:
    """Sentence k has tokens w{k}_0 .. with labels L{position % 3}."""
    lines = []
    for k, n in enumerate(lengths):
        lines += [f"w{k}_{i} L{i % 3}" for i in range(n)] + [""]
    return write(tmp_path, name, "\n".join(lines))


def rows(it: TaggedSequenceIter) -> dict[int, list[tuple[list[int], list[int]]]]:
    """sentence index -> its (token ids, label ids) rows, in the order batches give them.

    Checks that padding is only at the end of rows and that labels are padding exactly where
    the data is (predicting: labels are all padding)."""
    out: dict[int, list] = {}
    it.reset()
    for batch in it:
        data, label = batch.data[0].asnumpy(), batch.label[0].asnumpy()
        for r, i in enumerate(batch.index):
            real = data[r] != 0
            if i < 0:
                assert not real.any() and not label[r].any()
                continue
            n = int(real.sum())
            assert real[:n].all() and not real[n:].any()  # padding only at the end
            if it.sentences is None:
                assert (label[r, :n] != 0).all() and not label[r, n:].any()
            else:
                assert not label[r].any()
            out.setdefault(int(i), []).append((data[r, :n].tolist(), label[r, :n].tolist()))
    return out


def test_batches_are_padded_buckets_with_counts_and_index(tmp_path: Path) -> None:
    corpus(tmp_path, [3, 1, 5, 2, 4, 3, 2])
    it = build_tagged_iter(
        options(source="c.conll", buckets=[2, 5], batch_size=3, shuffle=False), context(tmp_path)
    )
    assert it.default_bucket_key == 5 and it.buckets == [2, 5]
    assert it.provide_data[0].shape == (3, 5) and it.provide_label[0].name == "softmax_label"
    batches = list(it)
    assert len(batches) == len(it) == it.num_batches == 3
    assert [b.bucket_key for b in batches] == [2, 5, 5]
    assert [b.index.tolist() for b in batches] == [[1, 3, 6], [0, 2, 4], [5, -1, -1]]
    assert [b.pad for b in batches] == [0, 0, 2]
    assert [b.num_tokens for b in batches] == [5, 12, 3]
    assert [b.data[0].shape for b in batches] == [(3, 2), (3, 5), (3, 5)]
    got = rows(it)
    vocab, labels = it.vocab, it.label_vocab
    for k, n in enumerate([3, 1, 5, 2, 4, 3, 2]):
        assert got[k] == [
            (
                vocab.encode(f"w{k}_{i}" for i in range(n)),
                labels.encode(f"L{i % 3}" for i in range(n)),
            )
        ]
    assert it.stats["tokens"] == 20 and it.stats["sentences"] == 7
    assert it.stats["bucket_counts"] == {2: 3, 5: 4}


def test_auto_buckets_come_from_the_lengths(tmp_path: Path) -> None:
    corpus(tmp_path, [2, 2, 3, 3, 4, 4, 5, 5, 8, 8])
    it = build_tagged_iter(
        options(source="c.conll", auto_buckets="quantile", num_buckets=2), context(tmp_path)
    )
    assert it.buckets == [4, 8]


@pytest.mark.parametrize(
    ("policy", "sequences", "tokens", "lost"),
    [("split", 4, 14, 0), ("truncate", 3, 11, 3), ("drop", 2, 5, 9)],
)
def test_long_sentences_follow_the_policy_and_are_counted(
    tmp_path, policy, sequences, tokens, lost
):
    corpus(tmp_path, [2, 9, 3])
    it = build_tagged_iter(
        options(source="c.conll", buckets=[3, 6], long_sentences=policy, shuffle=False),
        context(tmp_path),
    )
    s = it.stats
    assert (s["long_sentences"], s["sequences"], s["tokens"], s["long_tokens_lost"]) == (
        1,
        sequences,
        tokens,
        lost,
    )
    got = rows(it)
    if policy == "split":  # chunks of 6 and 3 (in their buckets)
        chunks = sorted((d for d, _ in got[1]), key=len, reverse=True)
        assert [t for d in chunks for t in d] == it.vocab.encode(f"w1_{i}" for i in range(9))
    elif policy == "truncate":
        assert [len(d) for d, _ in got[1]] == [6]
    else:
        assert 1 not in got


def test_all_dropped_is_a_data_error(tmp_path: Path) -> None:
    corpus(tmp_path, [5, 6])
    with pytest.raises(DataError, match="long_sentences is drop"):
        build_tagged_iter(
            options(source="c.conll", buckets=[3], long_sentences="drop"), context(tmp_path)
        )


def test_train_order_depends_on_seed_and_epoch_only(tmp_path: Path) -> None:
    corpus(tmp_path, [(k % 6) + 1 for k in range(60)])
    opts = options(source="c.conll", buckets=[2, 4, 6], batch_size=4)

    def order(it: TaggedSequenceIter, epoch: int) -> list[list[int]]:
        it.set_epoch(epoch)
        it.reset()
        return [b.index.tolist() for b in it]

    a = build_tagged_iter(opts, context(tmp_path, seed=1))
    b = build_tagged_iter(opts, context(tmp_path, seed=1))
    c = build_tagged_iter(opts, context(tmp_path, seed=2))
    assert order(a, 0) == order(b, 0)
    assert order(a, 1) == order(b, 1) != order(a, 0)
    assert order(a, 0) == order(b, 0)  # going back replays it
    assert order(c, 0) != order(a, 0)
    assert sorted(i for batch in order(a, 3) for i in batch if i >= 0) == list(range(60))
    dev = build_tagged_iter(
        dataclasses.replace(opts, shuffle=True), context(tmp_path, "eval", train=a)
    )
    assert order(dev, 0) == order(dev, 5)  # eval never shuffles


def test_predict_keeps_every_sentence_whole_in_file_order(tmp_path: Path) -> None:
    corpus(tmp_path, [3, 2], "train.conll")
    train = build_tagged_iter(options(source="train.conll"), context(tmp_path))
    write(tmp_path, "new.conll", "a\nb\n\n" + "\n".join(f"x{i}" for i in range(11)) + "\n\nc\n")
    it = build_tagged_iter(
        options(source="new.conll", max_sentences=1, long_sentences="drop"),
        context(tmp_path, "predict", train=train),
    )
    assert it.num_sentences == 3  # max_sentences is ignored
    assert it.default_bucket_key == 3 and it.buckets[-1] >= 11
    assert it.stats["long_tokens_lost"] == 0
    got = rows(it)
    assert sorted(got) == [0, 1, 2] and all(len(v) == 1 for v in got.values())
    assert len(got[1][0][0]) == 11 and set(got[1][0][0]) == {Vocab.unk_id}
    assert [s.tokens for s in it.sentences or []] == [
        ("a", "b"),
        tuple(f"x{i}" for i in range(11)),
        ("c",),
    ]
    assert [s.line for s in it.sentences or []] == [1, 4, 16]


def test_padding_rule_for_tagged_sequences_and_the_padding_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """auto_buckets: padding works for taggers too, and a train iterator that computes more
    than 20% padding says which data.train key lowers it."""
    rng = np.random.default_rng(3)
    corpus(tmp_path, [int(n) for n in rng.integers(1, 40, size=300)])
    with caplog.at_level(logging.WARNING):
        quantile = build_tagged_iter(
            options(source="c.conll", auto_buckets="quantile", num_buckets=2, batch_size=4),
            context(tmp_path),
        )
    assert "positions computed are padding" in caplog.text
    assert "data.train.auto_buckets: padding" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        padded = build_tagged_iter(
            options(source="c.conll", auto_buckets="padding", num_buckets=None, batch_size=4),
            context(tmp_path),
        )
    assert padded.stats["padding_ratio"] <= 0.1 < quantile.stats["padding_ratio"]
    assert "positions computed are padding" not in caplog.text
    with pytest.raises(InvalidValue, match="null only with auto_buckets: padding"):
        options(auto_buckets="quantile", num_buckets=None)


def test_long_predict_sentences_get_batches_of_their_own_size(tmp_path: Path) -> None:
    corpus(tmp_path, [3, 2, 3, 2], "train.conll")
    train = build_tagged_iter(options(source="train.conll", batch_size=4), context(tmp_path))
    long = "\n\n".join("\n".join(f"x{i}" for i in range(n)) for n in (11, 12, 20))
    write(tmp_path, "new.conll", "a\nb\n\n" + long + "\n")
    it = build_tagged_iter(
        options(source="new.conll", batch_size=4), context(tmp_path, "predict", train=train)
    )
    beyond = {k: v for k, v in it.bucket_batch_sizes.items() if k > it.default_bucket_key}
    assert sum(beyond.values()) <= 3 and all(rows_ >= 1 for rows_ in beyond.values())
    for batch in it:
        assert batch.data[0].shape[0] == it.bucket_batch_sizes[batch.bucket_key]
    assert sorted(rows(it)) == [0, 1, 2, 3]
    two = build_tagged_iter(
        options(source="new.conll", batch_size=4),
        context(tmp_path, "predict", train=train, min_batch=2),
    )
    assert min(v for k, v in two.bucket_batch_sizes.items() if k > two.default_bucket_key) == 2
