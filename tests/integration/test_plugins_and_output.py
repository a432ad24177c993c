"""Plugins referenced from YAML train end to end; rich progress renders; --debug shows traces."""

from __future__ import annotations

import io
import re
import textwrap
from pathlib import Path

from click.testing import CliRunner
from rich.console import Console

from mxtrain.cli.main import cli
from mxtrain.config import load_config
from mxtrain.fit.new_run import fit_experiment
from mxtrain.reporting import Reporter

PLUGIN = '''
"""A GRU language model and a wrapper iterator, as a user would write them."""
import mxnet as mx

from mxtrain.data.bucket_sentence import build_bucket_sentence_iter
from mxtrain.data.bucket_sentence_options import BucketSentenceOptions

CALLS = []


def gru_lm(data_info, num_hidden=8):
    def sym_gen(seq_len):
        data = mx.sym.Variable("data")
        label = mx.sym.Variable("softmax_label")
        x = mx.sym.Embedding(data, input_dim=data_info.vocab_size, output_dim=6, name="emb")
        cell = mx.rnn.GRUCell(num_hidden, prefix="gru_")
        x, _ = cell.unroll(seq_len, inputs=x, layout="NTC", merge_outputs=True)
        x = mx.sym.reshape(x, shape=(-1, num_hidden))
        x = mx.sym.FullyConnected(x, num_hidden=data_info.num_classes, name="out")
        label = mx.sym.reshape(label, shape=(-1,))
        out = mx.sym.SoftmaxOutput(x, label, use_ignore=True, ignore_label=0, name="softmax")
        return out, ("data",), ("softmax_label",)

    CALLS.append(num_hidden)
    return sym_gen


def lines(context, path, batch_size=4):
    options = BucketSentenceOptions(source=path, batch_size=batch_size, buckets=[6, 13])
    return build_bucket_sentence_iter(options, context)
'''

CONFIG = """\
experiment: {{name: plug, runs_dir: {runs}}}
model:
  name: my_models.py:gru_lm
  num_hidden: 5
data:
  train:
    iterator: my_models.py:lines
    path: train.txt
    batch_size: 6
fit: {{num_epoch: 1, log_interval: 4}}
"""


def test_plugin_model_and_iterator_train_from_yaml(tmp_path: Path, tiny_corpus) -> None:
    (tmp_path / "my_models.py").write_text(PLUGIN)
    config = tmp_path / "plug.yaml"
    config.write_text(CONFIG.format(runs=tmp_path / "runs"))
    result = CliRunner().invoke(cli, ["fit", str(config)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    run = tmp_path / "runs" / "plug"
    symbol = (run / "model-symbol.json").read_text()
    assert "gru_" in symbol and "emb_weight" in symbol
    assert (run / "model-0001.params").exists()
    # A misspelled plugin option is caught before training, with a suggestion.
    config.write_text(CONFIG.format(runs=tmp_path / "runs").replace("num_hidden", "num_hiden"))
    result = CliRunner().invoke(cli, ["fit", str(config), "--name", "other"])
    assert result.exit_code == 2
    assert "num_hiden" in result.output and "num_hidden" in result.output


def test_rich_progress_renders_bars_and_summary(tiny_config: Path) -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=120)
    config = load_config(tiny_config)
    fit_experiment(config, reporter=Reporter("rich", console=console))
    raw = buffer.getvalue()
    assert "\x1b[" in raw  # styled terminal output, not plain lines
    out = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", raw)
    # the epoch summary is a table row on a terminal ("epoch 2 done" lines go to train.log)
    assert "2/2" in out and "train perplexity" in out and "samples/s" in out
    assert "epoch 2 done" not in out


def test_quiet_mode_prints_no_info_lines(tiny_config: Path) -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=False, width=120)
    fit_experiment(load_config(tiny_config), reporter=Reporter("quiet", console=console))
    assert "epoch" not in buffer.getvalue()
    log = (tiny_config.parent / "runs" / "tiny" / "train.log").read_text()
    assert "epoch 2 done" in log  # the log file gets everything regardless


def test_debug_flag_shows_the_traceback(tiny_config: Path) -> None:
    args = ["fit", str(tiny_config), "--set", "data.train.source=nope.txt"]
    plain = CliRunner().invoke(cli, args)
    debug = CliRunner().invoke(cli, ["--debug", *args])
    assert plain.exit_code == debug.exit_code == 3
    assert "Traceback" not in plain.output and "Traceback" in debug.output


def test_bad_data_and_buckets_are_clear_errors(tmp_path: Path, tiny_config: Path) -> None:
    (tmp_path / "empty.txt").write_text("\n\n")
    cases = [
        (["--set", "data.train.source=empty.txt"], 3, "empty.txt"),
        (["--set", "data.train.buckets=[9, 5]"], 2, "data.train.buckets"),
        (["--set", "data.train.buckets=[0]"], 2, "data.train.buckets"),
    ]
    for extra, code, needle in cases:
        result = CliRunner().invoke(cli, ["fit", str(tiny_config), *extra])
        assert result.exit_code == code, (extra, result.output)
        assert needle in result.output, (extra, result.output)
        assert "Traceback" not in result.output
        lines = result.output.strip().splitlines()
        assert lines[-1].startswith("error: ") and sum("error" in x for x in lines) == 1
    assert not (tmp_path / "runs").exists()


def test_yaml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(textwrap.dedent("model:\n  name: lstm_lm\n  num_hidden: [1, 2\n"))
    result = CliRunner().invoke(cli, ["fit", str(bad)])
    assert result.exit_code == 2
    assert "bad.yaml:" in result.output and "Traceback" not in result.output
