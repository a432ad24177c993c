"""The decoding metrics of an eval set (mxtrain.decoding.evaluation): which sources are
decoded, what they are compared with, and the values on a model that copies its source."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from test_decode import COPY_VOCAB, CopySymGen, copy_params
from test_parallel_text import build, write

import mxtrain.decoding.evaluation as evaluation_module
from mxtrain.data.base import Seq2SeqInfo
from mxtrain.decoding.evaluation import DecodingEvaluation, distinct_sources, padded_batches
from mxtrain.errors import ConfigError
from mxtrain.text_metrics import bleu


def pair(line: int, source: str, target: str) -> SimpleNamespace:
    ids = [COPY_VOCAB.index(token) for token in source.split()]
    return SimpleNamespace(line=line, source_ids=ids, source=source, target=target)


def test_pairs_are_the_lines_as_read_long_pairs_included(tmp_path: Path) -> None:
    train = build(
        tmp_path, ["the cat", "a dog sat"], ["LE CHAT", "UN CHIEN"], lowercase=True,
        buckets=[(3, 4)],
    )  # fmt: skip
    src = write(tmp_path, "dev.src", ["The  zebra", "the cat sat on a mat", "The zebra"])
    tgt = write(tmp_path, "dev.tgt", ["LE\tZEBRE ", "LE CHAT", "LA ZEBRE"])
    dev = build(tmp_path, source=src, target=tgt, role="eval", lowercase=True,
                context={"train": train})  # fmt: skip
    assert dev.stats["skipped_long"] == 1  # the batches leave the 6-word pair out
    pairs = dev.pairs()
    assert [(p.line, p.source, p.target) for p in pairs] == [
        (0, "the zebra", "le zebre"),  # lowercased, whitespace runs as one space
        (1, "the cat sat on a mat", "le chat"),
        (2, "the zebra", "la zebre"),  # "zebra" is unknown: the text keeps it
    ]
    assert pairs[0].source_ids == [train.vocab.token_id("the"), 1]
    with pytest.raises(ValueError, match="eval iterator"):
        train.pairs()


def test_chars_pairs_are_written_as_outputs_are(tmp_path: Path) -> None:
    train = build(tmp_path, ["a b", "b a"], ["x yz", "yz x"], tokens="chars")
    dev = build(tmp_path, source=write(tmp_path, "d.src", ["a  b"]),
                target=write(tmp_path, "d.tgt", ["x   yz"]), role="eval", tokens="chars",
                context={"train": train})  # fmt: skip
    (only,) = dev.pairs()
    assert (only.source, only.target) == ("a b", "x yz")
    assert dev.detokenize(dev.target_vocab.encode(["x", " ", "y"])) == "x y"


def test_a_source_on_several_lines_is_one_source_with_every_target() -> None:
    pairs = [
        pair(0, "w x", "x w"),
        pair(1, "y", "y"),
        pair(2, "w x", "w x"),
        pair(3, "z", "z"),
        pair(4, "w x", "x w"),  # a repeated target is one reference
        pair(5, "y", "yy"),
    ]
    sources = distinct_sources(pairs)
    assert [(s.lines, s.references) for s in sources] == [
        ((0, 2, 4), ("x w", "w x")),
        ((1, 5), ("y", "yy")),
        ((3,), ("z",)),
    ]
    assert sources[0].source_ids == (4, 5)
    # the first N distinct sources, each still with the targets of lines past the N-th
    assert [s.lines for s in distinct_sources(pairs, max_sentences=2)] == [(0, 2, 4), (1, 5)]


def test_batches_sort_sources_by_length_and_pad_each_to_its_longest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(evaluation_module, "SOURCES_PER_BATCH", 2)
    sources = distinct_sources(
        [pair(0, "w x y", "a"), pair(1, "z", "a"), pair(2, "w x", "a"), pair(3, "y", "a")]
    )
    batches = padded_batches(sources, pad=0)
    assert [which.tolist() for which, _ in batches] == [[1, 3], [2, 0]]
    assert batches[0][1].tolist() == [[7], [6]]
    assert batches[1][1].tolist() == [[4, 5, 0], [4, 5, 6]]


class CopyEvalIter:
    """An eval iterator of the copy model's words: pairs() and detokenize() as parallel_text."""

    def __init__(self, pairs: list[SimpleNamespace]) -> None:
        self.data_info = Seq2SeqInfo(
            vocab_size=len(COPY_VOCAB), num_classes=len(COPY_VOCAB), pad_id=0
        )
        self._pairs = pairs

    def pairs(self) -> list[SimpleNamespace]:
        return self._pairs

    def detokenize(self, ids) -> str:
        return " ".join(COPY_VOCAB[i] for i in ids)


COPY_PAIRS = [
    pair(0, "w x y z", "w x y z"),  # copied right
    pair(1, "x", "y"),  # wrong: 1 substitution in 1 token...
    pair(2, "x", "x"),  # ...but right by its other reference
    pair(3, "z z w", "z w"),  # wrong: 1 deletion from 3 tokens to 2
    pair(4, "y x", "w"),  # wrong: 2 edits against 1 token
]


def copy_evaluation(names: list[str], **kw) -> DecodingEvaluation:
    import mxnet as mx

    sym_gen = CopySymGen(len(COPY_VOCAB), eos=2)
    return DecodingEvaluation(sym_gen, CopyEvalIter(COPY_PAIRS), names, context=mx.cpu(), **kw)


@pytest.mark.parametrize("beam", [1, 3])
def test_the_metrics_of_a_model_that_copies_its_source(beam: int) -> None:
    evaluation = copy_evaluation(["wer", "per", "bleu"], beam_size=beam)
    outputs = evaluation.outputs(copy_params(), {})
    assert outputs == ["w x y z", "x", "z z w", "y x"]
    values = evaluation.scores(copy_params(), {})
    assert list(values) == ["wer", "per", "bleu"]
    assert values["wer"] == 100.0 * 2 / 4  # "z z w" and "y x" match none of their targets
    # edits: 0 (4 tokens), 0 against "x" (1 token, the closer of y/x), 1 (2 tokens), 2 (1)
    assert values["per"] == 100.0 * 3 / 8
    references = [["w x y z"], ["y", "x"], ["z w"], ["w"]]
    assert values["bleu"] == bleu(outputs, references)


def test_batches_and_the_subset_do_not_change_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    whole = copy_evaluation(["wer"]).outputs(copy_params(), {})
    monkeypatch.setattr(evaluation_module, "SOURCES_PER_BATCH", 1)
    assert copy_evaluation(["wer"]).outputs(copy_params(), {}) == whole
    first_two = copy_evaluation(["wer"], max_sentences=2)
    assert [s.lines for s in first_two.sources] == [(0,), (1, 2)]
    assert first_two.scores(copy_params(), {}) == {"wer": 0.0}


def test_called_with_a_module_it_reads_the_module_parameters() -> None:
    reads = []

    def get_params():
        reads.append(1)
        return copy_params(), {}

    values = copy_evaluation(["wer"])(SimpleNamespace(get_params=get_params))
    assert values == {"wer": 50.0} and reads == [1]


def test_an_iterator_without_texts_or_a_model_without_steps_is_a_config_error() -> None:
    import mxnet as mx

    sym_gen = CopySymGen(len(COPY_VOCAB), eos=2)
    no_texts = SimpleNamespace(data_info=CopyEvalIter([]).data_info)
    with pytest.raises(ConfigError, match="parallel_text"):
        DecodingEvaluation(sym_gen, no_texts, ["bleu"], context=mx.cpu())
    with pytest.raises(ConfigError, match="encoder, decoder_step"):
        DecodingEvaluation(lambda key: None, CopyEvalIter([]), ["bleu"], context=mx.cpu())


def test_training_imports_decoding_but_not_inference() -> None:
    import subprocess
    import sys

    code = (
        "import sys, mxtrain.fit.setup, mxtrain.fit.supervise, mxtrain.fit.new_run, "
        "mxtrain.fit.resume, mxtrain.engine.loop; "
        "print(sorted(m for m in sys.modules if m.startswith('mxtrain.inference')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
