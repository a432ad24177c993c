"""Shared fixtures: tiny generated corpora and configs, and a CLI runner."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from launch_helpers import make_blobs, processes_with_env

os.environ.setdefault("OMP_NUM_THREADS", "1")
# Kernel measurements (mxtrain.engine.kernels) go to a cache of this test session, not the
# user's: every session measures afresh, and a test that needs an empty cache makes its own.
import tempfile

os.environ["MXTRAIN_CACHE_DIR"] = tempfile.mkdtemp(prefix="mxtrain-test-cache-")
# every `auto` kernel choice takes its fallback: measuring costs child processes each time a
# test trains a new shape, and a timing must not pick the numbers a test checks. The tests of
# measuring itself take this away (tests/integration/test_kernel_choices.py).
os.environ["MXTRAIN_MEASURE"] = "0"

WORDS = [
    "the",
    "a",
    "cat",
    "dog",
    "sat",
    "on",
    "mat",
    "ran",
    "far",
    "away",
    "big",
    "small",
    "red",
    "blue",
    "house",
    "tree",
]


def write_corpus(path: Path, sentences: int, *, seed: int = 0, max_len: int = 12) -> Path:
    """A text file with one generated sentence per line (lengths 2..max_len)."""
    rng = random.Random(seed)
    lines = [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, max_len)))
        for _ in range(sentences)
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def tiny_corpus(tmp_path: Path) -> tuple[Path, Path]:
    """(train.txt, valid.txt) in tmp_path."""
    return (
        write_corpus(tmp_path / "train.txt", 120, seed=1),
        write_corpus(tmp_path / "valid.txt", 30, seed=2),
    )


TINY_CONFIG = """\
experiment:
  name: tiny
  seed: 3
  runs_dir: {runs_dir}
model:
  name: lstm_lm
  num_embed: 8
  num_hidden: 12
  num_layers: 1
  cell: unfused
data:
  train:
    iterator: bucket_sentence
    source: train.txt
    batch_size: 8
    buckets: [5, 9, 13]
  eval:
    iterator: bucket_sentence
    source: valid.txt
    batch_size: 8
    shuffle: false
optimizer:
  name: sgd
  learning_rate: 0.5
fit:
  num_epoch: 2
  log_interval: 5
checkpoint:
  prefix: model
"""


@pytest.fixture
def tiny_config(tmp_path: Path, tiny_corpus: tuple[Path, Path]) -> Path:
    """A config that trains a very small LSTM LM on the tiny corpus in a second or two."""
    path = tmp_path / "tiny.yaml"
    path.write_text(textwrap.dedent(TINY_CONFIG.format(runs_dir=tmp_path / "runs")))
    return path


def params(run: Path, epoch: int) -> dict[str, Any]:
    """The arrays of ``run``'s ``model-<epoch>.params`` as NumPy arrays."""
    import mxnet as mx

    return {k: v.asnumpy() for k, v in mx.nd.load(str(run / f"model-{epoch:04d}.params")).items()}


def metric_trace(run: Path) -> list[tuple[Any, ...]]:
    """The metric values of every interval and epoch record (timings left out)."""
    from mxtrain.run.folder import read_metrics

    rows: list[tuple[Any, ...]] = []
    for r in read_metrics(run / "metrics.jsonl"):
        if r["event"] == "interval":
            rows.append(("interval", r["epoch"], r["batch"], r["train"], r["lr"]))
        elif r["event"] == "epoch":
            rows.append(("epoch", r["epoch"], r["batch"], r["train"], r["eval"], r["lr"]))
    return rows


@pytest.fixture(scope="session")
def demo_blobs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The classifier demo data of scripts/make_demo_data.py, generated once per session."""
    import subprocess
    import sys

    folder = tmp_path_factory.mktemp("demo_blobs")
    script = Path(__file__).resolve().parents[1] / "scripts" / "make_demo_data.py"
    subprocess.run([sys.executable, str(script), "--out", str(folder)], check=True, timeout=120)
    return folder


def newest_checkpoint(run: Path) -> Path:
    """The newest checkpoint folder of a run (tags sort by epoch, then batch)."""
    return sorted(p for p in (run / "checkpoints").iterdir() if p.name.startswith("e"))[-1]


def assert_same_ending(straight: Path, resumed: Path) -> dict[str, Any]:
    """Two runs ended at the same checkpoint with bit-identical parameters and the same last
    evaluation (a straight run and a stopped-and-resumed one); returns the parameters."""
    import mxnet as mx
    import numpy as np

    from mxtrain.run.folder import read_metrics

    a, b = newest_checkpoint(straight), newest_checkpoint(resumed)
    assert a.name == b.name
    pa, pb = ({k: v.asnumpy() for k, v in mx.nd.load(str(c / "params.nd")).items()} for c in (a, b))
    assert sorted(pa) == sorted(pb)
    for key in pa:
        np.testing.assert_array_equal(pa[key], pb[key], err_msg=key)
    evals = [
        [r["eval"] for r in read_metrics(run / "metrics.jsonl") if r["event"] == "eval"][-1]
        for run in (straight, resumed)
    ]
    assert evals[0] == evals[1]
    return pa


SMALL_STREAM_LM = """\
experiment: {{name: {name}, seed: 3, runs_dir: {runs}}}
model: {{name: lstm_lm, num_embed: 10, num_hidden: 10, num_layers: 1, dropout: 0.2, {model}}}
data:
  train: {{iterator: bptt_stream, source: train.txt, batch_size: 6, bptt: 7}}
  eval: {{iterator: bptt_stream, source: valid.txt, batch_size: 4, bptt: 9}}
optimizer: {{name: sgd, learning_rate: 1.0, clip_global_norm: 2.0}}
initializer: {{name: uniform, scale: 0.1}}
fit: {{num_epoch: 2, log_interval: 5, eval_interval: 9, metrics: [perplexity]}}
"""


def small_stream_lm(folder: Path, name: str, model: str) -> Path:
    """``folder/NAME.yaml``: a 1 x 10 LSTM LM on generated bptt streams (train.txt, 150
    sentences; valid.txt, 40), 2 epochs evaluated every 9 batches and at their ends, runs in
    ``folder/runs``; ``model``: further keys of the model section (YAML flow pairs).
    :func:`assert_score_repeats_last_evaluation` takes its sizes as ``STREAM_LM_SIZES``."""
    write_corpus(folder / "train.txt", 150, seed=1)
    write_corpus(folder / "valid.txt", 40, seed=2)
    path = folder / f"{name}.yaml"
    text = SMALL_STREAM_LM.format(name=name, runs=folder / "runs", model=model)
    path.write_text(text, encoding="utf-8")
    return path


#: what :func:`assert_score_repeats_last_evaluation` needs of :func:`small_stream_lm`'s runs
STREAM_LM_SIZES = {"steps": 9, "batch": 4, "embed": 10, "hidden": 10, "layers": 1}


def assert_score_repeats_last_evaluation(run: Path, **sizes: int) -> None:
    """``mxtrain score RUN`` gives the perplexity of fit's last evaluation again, within
    the rounding bound of the run's LM (``sizes``: float_bounds.rescored_rel's steps, batch,
    embed, hidden and layers)."""
    import json

    from click.testing import CliRunner
    from float_bounds import rescored_rel

    from mxtrain.cli.main import cli
    from mxtrain.run.folder import read_metrics

    last = [r for r in read_metrics(run / "metrics.jsonl") if r["event"] == "epoch"][-1]
    result = CliRunner().invoke(cli, ["score", str(run), "--json"])
    assert result.exit_code == 0, result.output
    scored = json.loads(result.output.strip().splitlines()[-1])["metrics"]["perplexity"]
    logged = last["eval"]["perplexity"]
    assert scored == pytest.approx(logged, rel=rescored_rel(run, logged, **sizes))


@pytest.fixture(scope="session")
def onnxruntime_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A python with onnxruntime, in an environment of its own (tests/onnx_helpers.py)."""
    from onnx_helpers import onnxruntime_environment

    return onnxruntime_environment(tmp_path_factory.mktemp("onnxruntime") / "venv")


@pytest.fixture
def reaper(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Marks the environment of everything this test starts and, afterwards, SIGKILLs any
    marked process still alive: a failed assertion must not leave a job running."""
    mark = f"MXTRAIN_TEST_JOB={uuid.uuid4().hex}"
    monkeypatch.setenv(*mark.split("=", 1))
    yield
    for pid in processes_with_env(mark):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def blobs(tmp_path: Path) -> Path:
    """96 rows of 6 features in 3 classes as x.npy / y.npy (the launch tests' data)."""
    return make_blobs(tmp_path)
