"""parallel_text options: checked values, the config loader and `mxtrain check` (no MXNet)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from click.testing import CliRunner

from mxtrain.cli.main import cli
from mxtrain.config import load_config
from mxtrain.data.parallel_text_options import ParallelTextOptions
from mxtrain.errors import ConfigError, InvalidValue

CONFIG = """\
experiment:
  name: g2p
model:
  name: rnn_seq2seq
data:
  train:
    iterator: parallel_text
    source: train.src
    target: train.tgt
    tokens: chars
    batch_tokens: 512
    buckets: [[5, 6], [10, 12]]
  eval:
    iterator: parallel_text
    source: dev.src
    target: dev.tgt
"""


def options(**kw: typing.Any) -> ParallelTextOptions:
    kw.setdefault("source", "a.src")
    kw.setdefault("target", "a.tgt")
    return ParallelTextOptions(**kw)


def test_reading_options_does_not_import_mxnet() -> None:
    code = (
        "import sys\n"
        "import mxtrain.data.pair_buckets\n"
        "from mxtrain.registry import ITERATORS\n"
        "entry = ITERATORS.get('parallel_text')\n"
        "entry.options_class()(source='a', target='b')\n"
        "assert 'mxnet' not in sys.modules, 'mxnet was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_option_is_documented() -> None:
    hints = typing.get_type_hints(ParallelTextOptions)
    for f in dataclasses.fields(ParallelTextOptions):
        assert f.metadata["doc"], f.name
        assert f.name in hints


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"target": " "}, "target"),
        ({"tokens": "bytes"}, "tokens"),
        ({"batch_size": 0}, "batch_size"),
        ({"batch_tokens": 0}, "batch_tokens"),
        ({"last_batch": "drop"}, "last_batch"),
        ({"buckets": "some"}, "buckets"),
        ({"buckets": []}, "buckets"),
        ({"buckets": [(5, 1)]}, "buckets"),  # T counts <eos>: at least 2
        ({"buckets": [(0, 4)]}, "buckets"),
        ({"buckets": [(5, 6), (5, 6)]}, "buckets"),
        ({"buckets": [(5, 6, 7)]}, "buckets"),
        ({"buckets": [(5, 9), (8, 6)]}, "buckets"),  # no (8, 9): no default bucket
        ({"max_padding": 1.0}, "max_padding"),
        ({"num_buckets": 0}, "num_buckets"),
        ({"max_source_length": 0}, "max_source_length"),
        ({"max_target_length": -1}, "max_target_length"),
        ({"long_pairs": "truncate"}, "long_pairs"),
        ({"min_count": 0}, "min_count"),
        ({"max_vocab": 4}, "max_vocab"),  # 4 specials and at least one token
        ({"max_pairs": 0}, "max_pairs"),
        ({"num_parts": 2, "part_index": 2}, "part_index"),
        ({"vocab": ""}, "vocab"),
    ],
)
def test_bad_values_name_their_key(changes: dict[str, typing.Any], key: str) -> None:
    with pytest.raises(InvalidValue) as caught:
        options(**changes)
    assert caught.value.key == key


def test_missing_default_bucket_says_which_to_add() -> None:
    with pytest.raises(InvalidValue, match=r"add \[8, 9\]"):
        options(buckets=[(5, 9), (8, 6)])


def test_check_accepts_a_parallel_text_config(tmp_path: Path) -> None:
    config = tmp_path / "g2p.yaml"
    config.write_text(CONFIG, encoding="utf-8")
    loaded = load_config(config)
    train, evaluate = loaded.data.train.options, loaded.data.eval.options
    assert isinstance(train, ParallelTextOptions) and isinstance(evaluate, ParallelTextOptions)
    assert (train.source, train.target, train.tokens) == ("train.src", "train.tgt", "chars")
    assert train.buckets == [(5, 6), (10, 12)]
    assert train.batch_tokens == 512
    assert (evaluate.source, evaluate.target) == ("dev.src", "dev.tgt")
    assert evaluate.tokens == "chars"  # inherited: eval text is read like the training text
    result = CliRunner().invoke(cli, ["check", str(config)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "iterator: parallel_text" in result.output
    # the resolved config (what fit saves as config.yaml) loads back to the same options
    resolved = tmp_path / "resolved.yaml"
    resolved.write_text(result.output, encoding="utf-8")
    assert load_config(resolved).data.train.options == train


def test_check_names_the_line_of_a_bad_bucket(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(CONFIG.replace("[[5, 6], [10, 12]]", "[[5, 6], [10, 1]]"), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"bad.yaml:12: data.train.buckets .*not \[10, 1\]"):
        load_config(config)


def test_eval_must_tokenize_like_train(tmp_path: Path) -> None:
    config = tmp_path / "mixed.yaml"
    config.write_text(CONFIG + "    tokens: whitespace\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"data\.eval\.tokens"):
        load_config(config)
