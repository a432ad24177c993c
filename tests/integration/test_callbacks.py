"""fit.callbacks end to end: every event in order with its values, stop requests (at an
epoch's end and mid-epoch), read-only access, options checked, a failing callback named."""

from __future__ import annotations

import json
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest
from click.testing import CliRunner

from mxtrain.cli.main import cli
from mxtrain.config.schema import CallbackSection
from mxtrain.fit.callbacks import CallbackRunner

PLUGIN = '''
import json


class Recorder:
    """Writes every event; asks to stop at an epoch's end or after a batch when told."""

    def __init__(self, path, stop_epoch=0, stop_batch=0, tamper=False):
        self.path, self.stop_epoch, self.stop_batch = path, stop_epoch, stop_batch
        self.tamper = tamper

    def _write(self, ctx, **extra):
        with open(self.path, "a") as f:
            record = {"event": ctx.event, "epoch": ctx.epoch, "batch": ctx.batch,
                      "updates": ctx.updates, **extra}
            f.write(json.dumps(record) + "\\n")

    def on_batch_end(self, ctx):
        self._write(ctx)
        if self.stop_batch and ctx.epoch == 2 and ctx.batch == self.stop_batch:
            ctx.request_stop("batch limit")

    def on_interval(self, ctx):
        self._write(ctx, metrics=dict(ctx.metrics), lr=ctx.lr)

    def on_eval_end(self, ctx):
        self._write(ctx, eval=dict(ctx.eval))

    def on_checkpoint(self, ctx):
        self._write(ctx, checkpoint=ctx.checkpoint, path=ctx.checkpoint_path)

    def on_epoch_end(self, ctx):
        arg, aux = ctx.module.get_params()
        if self.tamper:  # copies: training must not notice
            for value in arg.values():
                value[...] = 0
            try:
                ctx.metrics["x"] = 1.0
            except TypeError:
                pass
            else:
                raise AssertionError("ctx.metrics is writable")
        self._write(ctx, metrics=dict(ctx.metrics), eval=dict(ctx.eval or {}),
                    checkpoint=ctx.checkpoint, params=sorted(arg))
        if self.stop_epoch and ctx.epoch == self.stop_epoch:
            ctx.request_stop("enough")


def broken(when="on_epoch_end"):
    class Broken:
        pass

    def fail(self, ctx):
        if ctx.epoch == 2:
            raise ZeroDivisionError("oops")

    setattr(Broken, when, fail)
    return Broken()


class Nothing:
    pass
'''

CONFIG = """\
experiment: {{name: {name}, seed: 1, runs_dir: {runs}}}
model: {{name: mlp, hidden: [6]}}
data:
  train: {{iterator: ndarray, source: rows.npz, batch_size: 8}}
  eval: {{iterator: ndarray, source: rows.npz, batch_size: 8, shuffle: false}}
optimizer: {{name: sgd, learning_rate: 0.1}}
fit:
  num_epoch: 4
  log_interval: 3
  callbacks:
    - {callback}
checkpoint: {{prefix: model, period: 1}}
"""


def _run(folder: Path, name: str, callback: str, *args: str) -> tuple[int, str]:
    if not (folder / "rows.npz").exists():
        rng = np.random.default_rng(0)
        data = rng.normal(size=(48, 5)).astype("f4")
        np.savez(folder / "rows.npz", data=data, label=(data[:, 0] > 0).astype("f4"))
        (folder / "hooks.py").write_text(PLUGIN)
    config = folder / f"{name}.yaml"
    config.write_text(CONFIG.format(name=name, runs=folder / "runs", callback=callback))
    result = CliRunner().invoke(cli, ["fit", str(config), "--progress", "plain", *args])
    return result.exit_code, result.output


def _events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_event_arrives_in_order_with_its_values(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    code, output = _run(tmp_path, "all", f"{{name: hooks.py:Recorder, path: {log}}}")
    assert code == 0, output
    events = _events(log)
    kinds = [e["event"] for e in events]
    assert kinds.count("on_batch_end") == 4 * 6  # 48 rows / 8 per batch, 4 epochs
    assert kinds.count("on_interval") == 4 * 2
    assert kinds.count("on_eval_end") == kinds.count("on_checkpoint") == 4
    epoch_ends = [e for e in events if e["event"] == "on_epoch_end"]
    assert [e["epoch"] for e in epoch_ends] == [1, 2, 3, 4]
    assert [e["checkpoint"] for e in epoch_ends] == [f"e000{i}-b000000" for i in (1, 2, 3, 4)]
    assert epoch_ends[0]["params"] == ["fc1_bias", "fc1_weight", "pred_bias", "pred_weight"]
    # the epoch's order: batches, its evaluation, its checkpoint, then on_epoch_end
    first = kinds[: kinds.index("on_epoch_end") + 1]
    assert first[-3:] == ["on_eval_end", "on_checkpoint", "on_epoch_end"]
    assert [e["updates"] for e in events if e["event"] == "on_batch_end"][:6] == list(range(1, 7))
    # values are the ones fit logged
    records = _events(tmp_path / "runs/all/metrics.jsonl")
    logged = [r["eval"]["perplexity"] for r in records if r["event"] == "epoch"]
    assert [e["eval"]["perplexity"] for e in epoch_ends] == logged
    intervals = [r["train"]["perplexity"] for r in records if r["event"] == "interval"]
    assert [e["metrics"]["perplexity"] for e in events if e["event"] == "on_interval"] == intervals


def test_a_stop_request_at_an_epoch_end_finishes_the_run_there(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    callback = f"{{name: hooks.py:Recorder, path: {log}, stop_epoch: 2}}"
    code, output = _run(tmp_path, "stop", callback)
    assert code == 0, output
    assert "fit.callbacks[0] (hooks.py:Recorder) asked to stop: enough" in output
    assert max(e["epoch"] for e in _events(log)) == 2
    assert json.loads((tmp_path / "runs/stop/run.json").read_text())["status"] == "finished"
    assert (tmp_path / "runs/stop/checkpoints/e0002-b000000").is_dir()


def test_a_stop_request_after_a_batch_stops_at_that_batch(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    callback = f"{{name: hooks.py:Recorder, path: {log}, stop_batch: 4}}"
    code, output = _run(tmp_path, "mid", callback)
    assert code == 0, output
    batches = [(e["epoch"], e["batch"]) for e in _events(log) if e["event"] == "on_batch_end"]
    assert batches[-1] == (2, 4) and len(batches) == 10
    assert (tmp_path / "runs/mid/checkpoints/e0001-b000004").is_dir()  # that exact point
    records = _events(tmp_path / "runs/mid/metrics.jsonl")
    assert records[-1]["event"] == "epoch" and records[-1]["finished"] == "callback"


def test_callbacks_see_copies_and_change_nothing(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    code, output = _run(tmp_path, "plain", f"{{name: hooks.py:Recorder, path: {log}}}")
    assert code == 0, output
    callback = f"{{name: hooks.py:Recorder, path: {tmp_path / 't.jsonl'}, tamper: true}}"
    code, output = _run(tmp_path, "tamper", callback)
    assert code == 0, output
    plain = mx.nd.load(str(tmp_path / "runs/plain/model-0004.params"))
    tampered = mx.nd.load(str(tmp_path / "runs/tamper/model-0004.params"))
    for key, value in plain.items():
        np.testing.assert_array_equal(value.asnumpy(), tampered[key].asnumpy(), err_msg=key)


def test_a_failing_callback_is_named_and_the_checkpoints_stay(tmp_path: Path) -> None:
    code, output = _run(tmp_path, "broken", "hooks.py:broken")
    assert code == 2, output
    assert "fit.callbacks[0]: the callback 'hooks.py:broken' (plugin file" in output
    assert "failed while calling on_epoch_end (epoch 2" in output
    assert "ZeroDivisionError: oops" in output and "Traceback" not in output
    assert (tmp_path / "runs/broken/checkpoints/e0002-b000000").is_dir()
    code, output = _run(tmp_path, "nothing", "hooks.py:Nothing")
    assert code == 2 and "defines none of the callback methods" in output
    assert not (tmp_path / "runs/nothing").exists()  # refused before the run folder
    code, output = _run(tmp_path, "typo", "{name: hooks.py:Recorder, pth: x}")
    assert code == 2 and "unknown key 'fit.callbacks[0].pth'" in output
    assert "Did you mean 'path'?" in output and "typo.yaml:" in output


@pytest.mark.parametrize("all_ranks", [False, True])
def test_other_ranks_call_only_all_ranks_callbacks(tmp_path: Path, all_ranks: bool) -> None:
    (tmp_path / "cb.py").write_text(
        f"class C:\n    all_ranks = {all_ranks}\n\n    def on_epoch_end(self, ctx):\n        pass\n"
    )
    sections = [CallbackSection(name="cb.py:C")]
    assert len(CallbackRunner(sections, tmp_path, module=None, rank=0).callbacks) == 1
    assert len(CallbackRunner(sections, tmp_path, module=None, rank=1).callbacks) == all_ranks
