"""End-to-end: `mxtrain fit/check/list` through click's CliRunner and real subprocesses."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from mxtrain.cli.main import cli
from mxtrain.run.folder import read_metrics


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def run_cli(runner: CliRunner, *args: str):
    return runner.invoke(cli, list(args), catch_exceptions=False)


def test_fit_writes_a_complete_run_folder(runner: CliRunner, tiny_config: Path) -> None:
    result = run_cli(runner, "fit", str(tiny_config), "--progress", "plain")
    assert result.exit_code == 0, result.output
    run = tiny_config.parent / "runs" / "tiny"
    names = {p.name for p in run.iterdir()}
    assert {
        "config.yaml",
        "run.json",
        "vocab.json",
        "model-symbol.json",
        "model-0001.params",
        "model-0002.params",
        "metrics.jsonl",
        "train.log",
    } <= names
    assert json.loads((run / "run.json").read_text())["status"] == "finished"
    records = read_metrics(run / "metrics.jsonl")
    epochs = [r for r in records if r["event"] == "epoch"]
    intervals = [r for r in records if r["event"] == "interval"]
    assert [r["epoch"] for r in epochs] == [1, 2]
    assert intervals, "log_interval 5 must give interval records"
    for r in intervals:
        assert {"epoch", "batch", "samples_per_s", "train", "lr"} <= set(r)
    vocab_size = len(json.loads((run / "vocab.json").read_text())["tokens"])
    # Learning happened: better than a uniform guess over the vocabulary, and improving.
    assert epochs[1]["eval"]["perplexity"] < vocab_size
    assert epochs[1]["train"]["perplexity"] < epochs[0]["train"]["perplexity"]
    assert "epoch 2 done" in (run / "train.log").read_text()
    assert "finished:" in result.output


def test_checkpoint_loads_with_stock_module(runner: CliRunner, tiny_config: Path) -> None:
    import mxnet as mx

    assert run_cli(runner, "fit", str(tiny_config)).exit_code == 0
    prefix = str(tiny_config.parent / "runs" / "tiny" / "model")
    module = mx.mod.Module.load(prefix, 2, label_names=("softmax_label",))
    module.bind(data_shapes=[("data", (8, 13))], label_shapes=[("softmax_label", (8, 13))])
    module.forward(mx.io.DataBatch([mx.nd.ones((8, 13))], [mx.nd.ones((8, 13))]), is_train=False)
    assert module.get_outputs()[0].shape[0] == 8 * 13


def test_existing_run_folder_is_never_overwritten(runner: CliRunner, tiny_config: Path) -> None:
    assert run_cli(runner, "fit", str(tiny_config)).exit_code == 0
    params = tiny_config.parent / "runs" / "tiny" / "model-0002.params"
    before = params.read_bytes()
    result = run_cli(runner, "fit", str(tiny_config))
    assert result.exit_code == 5
    assert "already exists" in result.output and "--force" in result.output
    assert params.read_bytes() == before
    # A new name is a separate run; --force replaces.
    assert run_cli(runner, "fit", str(tiny_config), "--name", "tiny2").exit_code == 0
    assert (tiny_config.parent / "runs" / "tiny2" / "model-0002.params").exists()
    assert run_cli(runner, "fit", str(tiny_config), "--force").exit_code == 0
    leftovers = [p for p in (tiny_config.parent / "runs").iterdir() if "replaced" in p.name]
    assert leftovers == []


def test_failed_forced_run_keeps_the_old_one(runner: CliRunner, tiny_config: Path) -> None:
    assert run_cli(runner, "fit", str(tiny_config)).exit_code == 0
    # Diverge on purpose: absurdly scaled gradients make the loss non-finite.
    result = run_cli(
        runner,
        "fit",
        str(tiny_config),
        "--force",
        "--set",
        "optimizer.rescale_grad=1e30",
    )
    assert result.exit_code == 4, result.output
    assert "diverged" in result.output
    runs = tiny_config.parent / "runs"
    kept = [p for p in runs.iterdir() if p.name.startswith(".tiny.replaced-")]
    assert len(kept) == 1 and (kept[0] / "model-0002.params").exists()
    assert json.loads((runs / "tiny" / "run.json").read_text())["status"] == "failed"


def test_set_overrides_reach_the_run(runner: CliRunner, tiny_config: Path) -> None:
    result = run_cli(
        runner, "fit", str(tiny_config), "--set", "fit.num_epoch=1", "--set", "model.num_hidden=7"
    )
    assert result.exit_code == 0, result.output
    run = tiny_config.parent / "runs" / "tiny"
    assert (run / "model-0001.params").exists() and not (run / "model-0002.params").exists()
    saved = (run / "config.yaml").read_text()
    assert "num_hidden: 7" in saved and "num_epoch: 1" in saved


@pytest.mark.parametrize(
    ("args", "code", "needles"),
    [
        (["fit", "missing.yaml"], 2, ["missing.yaml"]),
        (["fit", "{cfg}", "--set", "model.num_hiden=3"], 2, ["num_hiden", "num_hidden"]),
        (["fit", "{cfg}", "--set", "model.name=lstm_lmm"], 2, ["lstm_lmm", "lstm_lm"]),
        (["fit", "{cfg}", "--set", "data.train.source=nope.txt"], 3, ["nope.txt"]),
        (["check", "{cfg}", "--set", "fit.num_epoch=many"], 2, ["fit.num_epoch", "many"]),
    ],
)
def test_bad_input_gets_one_clear_message(
    runner: CliRunner, tiny_config: Path, args: list[str], code: int, needles: list[str]
) -> None:
    args = [a.replace("{cfg}", str(tiny_config)) for a in args]
    result = runner.invoke(cli, args)
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in result.output
    assert not (tiny_config.parent / "runs" / "tiny").exists()


def test_check_prints_resolved_config_and_explains(runner: CliRunner, tiny_config: Path) -> None:
    result = run_cli(runner, "check", str(tiny_config))
    assert result.exit_code == 0, result.output
    assert "num_hidden: 12" in result.output and "learning_rate: 0.5" in result.output
    result = run_cli(runner, "check", str(tiny_config), "--explain")
    assert result.exit_code == 0
    assert "model.num_hidden" in result.output and "default" in result.output


def test_list_shows_builtins(runner: CliRunner) -> None:
    result = run_cli(runner, "list")
    assert result.exit_code == 0
    for name in ("lstm_lm", "bucket_sentence", "perplexity", "adamw", "xavier"):
        assert name in result.output
    optimizers = run_cli(runner, "list", "optimizers").output
    assert "adamw" in optimizers and "lstm_lm" not in optimizers


def _python(code: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=cwd
    )


@pytest.mark.parametrize("argv", [["--help"], ["fit", "--help"], ["check", "{cfg}"]])
def test_help_and_check_do_not_import_mxnet(tiny_config: Path, argv: list[str]) -> None:
    argv = [a.replace("{cfg}", str(tiny_config)) for a in argv]
    code = (
        "import sys\n"
        "from mxtrain.cli.main import cli\n"
        f"try:\n    cli({argv!r}, prog_name='mxtrain')\n"
        "except SystemExit as e:\n    assert not e.code, e.code\n"
        "assert 'mxnet' not in sys.modules, 'mxnet was imported'\n"
    )
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr
    assert "Example" in proc.stdout or "experiment:" in proc.stdout


def test_the_training_modules_leave_mxnet_unloaded_until_the_threads_are_set() -> None:
    """MXNet reads its OpenMP settings when it loads: fit and resume set the run's threads
    first, so importing their modules must not load it (else OMP_NUM_THREADS is ignored)."""
    code = (
        "import sys\n"
        "import mxtrain.fit.new_run, mxtrain.fit.resume, mxtrain.fit.setup\n"
        "assert 'mxnet' not in sys.modules, 'mxnet was imported'\n"
    )
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr


def test_real_subprocess_fit_prints_plain_lines(tiny_config: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mxtrain", "fit", str(tiny_config)],
        capture_output=True,
        text=True,
        timeout=240,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=tiny_config.parent,
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    lines = proc.stdout.splitlines()
    assert any("epoch 1 batch 5" in line and "perplexity=" in line for line in lines)
    assert any("epoch 2 done" in line for line in lines)
    assert "\x1b[" not in proc.stdout  # no terminal escapes when stdout is a pipe


def test_gpu_request_on_cpu_only_mxnet_is_a_clear_error(
    runner: CliRunner, tiny_config: Path
) -> None:
    result = runner.invoke(cli, ["fit", str(tiny_config), "--set", "context.devices=gpu"])
    assert result.exit_code == 2, result.output
    assert "CPU-only build" in result.output and "mxnet-cu" in result.output
    assert "Traceback" not in result.output
    assert not (tiny_config.parent / "runs" / "tiny").exists()


@pytest.mark.parametrize("cell", ["fused", "unfused"])
def test_bucket_memory_trains_the_same_run_in_less_bound_memory(
    runner: CliRunner, tiny_config: Path, cell: str
) -> None:
    """fit.bucket_memory unbinds and rebinds buckets; the run's numbers do not change, and
    score on the run folder uses the same bound."""
    from conftest import metric_trace, params

    runs = tiny_config.parent / "runs"
    common = ["--set", f"model.cell={cell}", "--progress", "plain"]
    full = run_cli(runner, "fit", str(tiny_config), "--name", "all", *common)
    assert full.exit_code == 0, full.output
    bounded = run_cli(
        runner,
        "fit",
        str(tiny_config),
        "--name",
        "bounded",
        "--set",
        "fit.bucket_memory=1.0",
        *common,
    )
    assert bounded.exit_code == 0, bounded.output
    assert "unbinding bucket" in bounded.output
    assert "buckets rebound (fit.bucket_memory)" in bounded.output
    assert metric_trace(runs / "bounded") == metric_trace(runs / "all")
    for name, value in params(runs / "all", 2).items():
        assert (params(runs / "bounded", 2)[name] == value).all(), name

    scores = [
        run_cli(runner, "score", str(runs / run), "--json").output for run in ("all", "bounded")
    ]
    assert (
        json.loads(scores[0].splitlines()[-1])["metrics"]
        == json.loads(scores[1].splitlines()[-1])["metrics"]
    )


def test_bucket_memory_below_one_is_refused_with_its_key(
    runner: CliRunner, tiny_config: Path
) -> None:
    result = run_cli(runner, "check", str(tiny_config), "--set", "fit.bucket_memory=0.5")
    assert result.exit_code != 0
    assert "bucket_memory" in result.output and "at least 1" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("devices", [1, 2])
def test_short_last_batches_train_as_padded_ones_do(
    runner: CliRunner, tiny_config: Path, devices: int
) -> None:
    """Padding rows have no gradient, so a bucket's last batch cut to its real rows trains the
    same parameters (to float rounding) while computing fewer positions; the rule is recorded
    in each checkpoint, and a checkpoint without it (older versions) resumes padded."""
    from conftest import params
    from float_bounds import assert_params_close, rnn_chain_roundings

    from mxtrain.run.checkpoint import LoadedCheckpoint
    from mxtrain.run.choose import recorded_last_batch

    runs = tiny_config.parent / "runs"
    common = ["--set", f"context.count={devices}", "--progress", "plain"]
    for name, rule in (("short", "short"), ("pad", "pad")):
        result = run_cli(
            runner, "fit", str(tiny_config), "--name", name,
            "--set", f"data.train.last_batch={rule}", *common,
        )  # fmt: skip
        assert result.exit_code == 0, result.output

    def padding(run: str) -> float:  # the train iterator's line in the run's log
        found = re.search(r"padding ([0-9.]+)% \(", (runs / run / "train.log").read_text())
        assert found is not None
        return float(found.group(1))

    assert padding("short") < padding("pad")  # the short batches were there to cut
    # A cut batch sums its gradient over fewer rows (and another kernel blocking) than the
    # padded one: per update the network's chain of roundings, times the updates (the epochs'
    # batch counts), at each array's scale (see float_bounds).
    padded = params(runs / "pad", 2)
    updates = sum(r["batch"] for r in read_metrics(runs / "pad" / "metrics.jsonl")
                  if r["event"] == "epoch")  # fmt: skip
    chain = rnn_chain_roundings(13, 8, padded["arg:pred_bias"].size, num_embed=8, num_hidden=12,
                                num_layers=1)  # fmt: skip
    assert_params_close(params(runs / "short", 2), padded, roundings=updates * chain)
    states = sorted((runs / "short" / "checkpoints").glob("*/state.json"))
    assert states and all(
        json.loads(s.read_text())["state"]["last_batch"] == "short" for s in states
    )

    def loaded(state: dict) -> LoadedCheckpoint:
        return LoadedCheckpoint(None, {}, {}, {}, None, state, [5, 9, 13], {})  # type: ignore[arg-type]

    assert recorded_last_batch(loaded({"last_batch": "short"})) == "short"
    assert recorded_last_batch(loaded({})) == "pad"
    assert recorded_last_batch(None) is None


def test_a_run_of_an_including_config_keeps_the_merged_config_and_resumes_without_the_base(
    runner: CliRunner, tiny_config: Path
) -> None:
    """The run folder's config.yaml is the resolved one: resume reads it, not the includes."""
    base = tiny_config.with_name("base.yaml")
    tiny_config.rename(base)
    experiment = tiny_config.with_name("shared.yaml")
    experiment.write_text("include: base.yaml\nexperiment: {name: shared}\nfit: {num_epoch: 1}\n")
    assert run_cli(runner, "fit", str(experiment)).exit_code == 0
    run = tiny_config.parent / "runs" / "shared"
    saved = (run / "config.yaml").read_text()
    assert "\ninclude:" not in saved and "num_epoch: 1" in saved
    base.unlink()
    resumed = run_cli(runner, "resume", str(run), "--set", "fit.num_epoch=2")
    assert resumed.exit_code == 0, resumed.output
    epochs = [r["epoch"] for r in read_metrics(run / "metrics.jsonl") if r["event"] == "epoch"]
    assert epochs == [1, 2]
