"""Plugin failures through the CLI (fuzz classes C12, C13): exit code 2, the plugin named,
no traceback, and the checkpoints already saved kept.

C12: an exception raised inside an iterator, metric or callback plugin, when it is created or
while it runs, was reported as a bug of mxtrain's (exit 1). C13: a plugin (the user's file
at fit, the run's kept copy at resume/score/predict) that raises SystemExit on import ended
mxtrain with that exit code and no message.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner
from launch_helpers import mxtrain

from mxtrain.cli.main import cli

HOOKS = '''
"""A wrapper iterator, a metric and a callback, each able to fail on request."""
import mxnet as mx

from mxtrain.data.bucket_sentence import build_bucket_sentence_iter
from mxtrain.data.bucket_sentence_options import BucketSentenceOptions


class Failing(mx.io.DataIter):
    """The built-in iterator's batches; the fail_at-th call of next() raises."""

    def __init__(self, inner, fail_at):
        super().__init__(inner.batch_size)
        self.inner, self.fail_at, self.calls = inner, fail_at, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def reset(self):
        self.inner.reset()

    def next(self):
        self.calls += 1
        if self.calls == self.fail_at:
            raise ValueError(f"batch {self.calls} is cursed")
        return self.inner.next()


def lines(context, fail_at=None, misspell=False, **options):
    if misspell:
        options["batchsize"] = options.pop("batch_size")
    inner = build_bucket_sentence_iter(BucketSentenceOptions(**options), context)
    return Failing(inner, fail_at)


class Incomplete:
    """A metric without reset, reset_interval, get_state, set_state."""

    name = "incomplete"

    def update(self, labels, preds):
        pass

    def get(self):
        return {self.name: 0.0}

    get_interval = get


class Exiting(Incomplete):
    """A metric whose update ends the process, as a careless script would."""

    name = "exiting"

    def update(self, labels, preds):
        raise SystemExit(9)

    def reset(self):
        pass

    reset_interval = reset

    def get_state(self):
        return {}

    def set_state(self, state):
        pass


class ExitAtEpochEnd:
    def on_epoch_end(self, ctx):
        if ctx.epoch == 2:
            raise SystemExit(6)
'''

CONFIG = """\
experiment: {{name: plug, seed: 3, runs_dir: {runs}}}
model: {{name: lstm_lm, num_embed: 8, num_hidden: 12, num_layers: 1, cell: unfused}}
data:
  train:
    iterator: hooks.py:lines
    source: train.txt
    batch_size: 8
    buckets: [5, 9, 13]
fit: {{num_epoch: 2, log_interval: 5}}
"""


@pytest.fixture
def plugged(tmp_path: Path, tiny_corpus: tuple[Path, Path]) -> Path:
    """A config training the tiny LSTM LM through the hooks.py iterator plugin."""
    (tmp_path / "hooks.py").write_text(HOOKS)
    config = tmp_path / "plug.yaml"
    config.write_text(CONFIG.format(runs=tmp_path / "runs"))
    return config


def invoke(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result.exit_code, result.output


def assert_plugin_error(code: int, output: str, *needles: str) -> None:
    assert code == 2, output
    assert "Traceback" not in output and "internal error" not in output, output
    error = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(error) == 1, output
    for needle in needles:
        assert needle in error[0], (needle, output)


def test_an_iterator_plugin_passing_a_bad_option_on_is_named(plugged: Path) -> None:
    code, output = invoke("fit", plugged, "--set", "data.train.misspell=true")
    hooks = plugged.parent / "hooks.py"
    assert_plugin_error(
        code,
        output,
        f"the iterator 'hooks.py:lines' (plugin file {hooks}) failed while creating",
        "TypeError",
        "batchsize",
    )
    assert not (plugged.parent / "runs" / "plug").exists()  # refused before the run folder


def test_an_iterator_plugin_failing_while_training_is_named(plugged: Path) -> None:
    result = CliRunner().invoke(
        cli, ["fit", str(plugged), "--json", "--set", "data.train.fail_at=3"]
    )
    hooks = plugged.parent / "hooks.py"
    assert_plugin_error(
        result.exit_code,
        result.stderr,
        f"plugin code in {hooks} (iterator 'hooks.py:lines')",
        "running Failing.next",
        "ValueError: batch 3 is cursed",
    )
    events = [json.loads(line) for line in result.stdout.splitlines()]
    error = next(e for e in events if e["event"] == "error")
    assert error["type"] == "PluginError" and error["exit_code"] == 2
    assert events[-1]["event"] == "end" and events[-1]["exit_code"] == 2
    run = json.loads((plugged.parent / "runs" / "plug" / "run.json").read_text())
    assert run["status"] == "failed"


def test_a_metric_plugin_that_exits_is_named_not_obeyed(plugged: Path) -> None:
    code, output = invoke("fit", plugged, "--set", "fit.metrics=[hooks.py:Exiting]")
    assert_plugin_error(
        code, output, "metric 'hooks.py:Exiting'", "Exiting.update", "SystemExit: 9"
    )


def test_a_metric_plugin_without_the_contracts_methods_is_refused_before_training(
    plugged: Path,
) -> None:
    code, output = invoke("fit", plugged, "--set", "fit.metrics=[hooks.py:Incomplete]")
    # refused by the config check, before any data is read
    assert_plugin_error(
        code,
        output,
        "fit.metrics[0]: metric 'hooks.py:Incomplete' is a class without the",
        "reset_interval, get_state, set_state",
    )
    assert not (plugged.parent / "runs" / "plug").exists()


def test_a_callback_that_exits_is_named_and_the_checkpoints_stay(plugged: Path) -> None:
    code, output = invoke("fit", plugged, "--set", "fit.callbacks=[hooks.py:ExitAtEpochEnd]")
    assert_plugin_error(
        code,
        output,
        "fit.callbacks[0]: the callback 'hooks.py:ExitAtEpochEnd' (plugin file",
        "calling on_epoch_end (epoch 2",
        "SystemExit: 6",
        "mxtrain resume",
    )
    assert (plugged.parent / "runs" / "plug" / "checkpoints" / "e0002-b000000").is_dir()


def test_a_plugin_file_that_exits_on_import_is_named_by_fit(plugged: Path) -> None:
    (plugged.parent / "hooks.py").write_text("raise SystemExit(7)\n")
    done = mxtrain("fit", plugged, cwd=plugged.parent, timeout=300)
    assert_plugin_error(
        done.returncode,
        done.stderr,
        "data.train.iterator: the iterator 'hooks.py:lines' (plugin file",
        "failed while its file was imported: SystemExit: 7",
    )
    assert not (plugged.parent / "runs" / "plug").exists()


def test_a_kept_plugin_copy_that_exits_on_import_is_named(plugged: Path) -> None:
    folder = plugged.parent
    code, output = invoke("fit", plugged, "--set", "fit.num_epoch=1")
    assert code == 0, output
    run = folder / "runs" / "plug"
    kept = run / "plugins" / "hooks.py"
    kept.write_text(textwrap.dedent("raise SystemExit(7)\n"))
    needles = (f"(plugin file {kept}) failed while its file was imported", "SystemExit: 7")
    done = mxtrain("resume", run, "--set", "fit.num_epoch=2", cwd=folder, timeout=300)
    assert_plugin_error(done.returncode, done.stderr, *needles)
    assert_plugin_error(*invoke("score", run), *needles)
    (folder / "in.txt").write_text("the cat sat\n")
    out = folder / "out.jsonl"
    assert_plugin_error(
        *invoke("predict", "--checkpoint", run, "--input", folder / "in.txt", "--output", out),
        *needles,
    )
    assert not out.exists()
    assert (run / "checkpoints" / "e0001-b000000").is_dir()  # nothing saved was touched
