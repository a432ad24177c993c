"""Checkpoints: complete round trip, atomic under a crash at any step, corruption named."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import hashlib
import json
import logging
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mxnet as mx
import numpy as np
import pytest
from checkpoint_helpers import reseal, reseal_position

from mxtrain.engine.bucketing import BucketingModule
from mxtrain.errors import ExitCode, RunFolderError
from mxtrain.run import checkpoint
from mxtrain.run.checkpoint import (
    Checkpoint,
    CheckpointError,
    find_checkpoint,
    list_checkpoints,
    load_checkpoint,
    prune_checkpoints,
    restore_module,
    save_checkpoint,
    verify_checkpoint,
)
from mxtrain.run.folder import RunFolder

PREFIX = "model"
BATCH = 4
BUCKET_KEYS = [(5, 7), (9, 12)]


def sym_gen(key: int) -> tuple[Any, tuple[str, ...], tuple[str, ...]]:
    """Dense + BatchNorm (so there are auxiliary states) -> regression."""
    hidden = mx.sym.FullyConnected(mx.sym.Variable("data"), num_hidden=6, name="fc1")
    hidden = mx.sym.BatchNorm(hidden, name="bn")
    out = mx.sym.FullyConnected(
        mx.sym.Activation(hidden, act_type="tanh"), num_hidden=2, name="fc2"
    )
    return mx.sym.LinearRegressionOutput(out, name="lro"), ("data",), ("lro_label",)


def new_module(seed: int = 0) -> BucketingModule:
    mx.random.seed(seed)
    mod = BucketingModule(sym_gen, 3)
    mod.bind([("data", (BATCH, 3))], [("lro_label", (BATCH, 2))])
    mod.init_params(mx.init.Xavier())
    mod.init_optimizer(None, "adam", {"learning_rate": 0.01})
    return mod


def train(mod: BucketingModule, steps: int, seed: int = 0) -> BucketingModule:
    rng = np.random.RandomState(seed)
    for _ in range(steps):
        batch = mx.io.DataBatch(
            [mx.nd.array(rng.randn(BATCH, 3))], [mx.nd.array(rng.randn(BATCH, 2))]
        )
        mod.forward_backward(batch)
        mod.update()
    return mod


@pytest.fixture
def run(tmp_path: Path) -> RunFolder:
    path = tmp_path / "run"
    path.mkdir()
    return RunFolder(path)


def save(run: RunFolder, mod: BucketingModule, epoch: int, batch: int = 0, **kw: Any) -> Checkpoint:
    state = kw.pop("state", {"epoch": epoch, "batch": batch, "history": [1.5, float("inf")]})
    return save_checkpoint(run, mod, prefix=PREFIX, epoch=epoch, batch=batch, state=state, **kw)


def params_of(mod: BucketingModule) -> dict[str, np.ndarray]:
    arg, aux = mod.get_params()
    return {**{k: v.asnumpy() for k, v in arg.items()}, **{k: v.asnumpy() for k, v in aux.items()}}


def loaded_params(ckpt: Checkpoint) -> dict[str, np.ndarray]:
    loaded = load_checkpoint(ckpt)
    return {k: v.asnumpy() for k, v in {**loaded.arg_params, **loaded.aux_params}.items()}


def assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        assert np.array_equal(a[name], b[name]), name


def work_leftovers(run: RunFolder) -> list[str]:
    root = run.checkpoints_dir
    names = [p.name for p in root.iterdir() if p.name.startswith(".")]
    return names + [p.name for p in run.path.iterdir() if ".tmp-" in p.name]


# ----------------------------------------------------------------------------- round trip


def test_round_trip_and_module_load(run: RunFolder) -> None:
    mod = train(new_module(), 3)
    checkpoint.save_symbol(mod.symbol, run, PREFIX)
    state = {"position": {"epoch": 2, "batch": 0}, "seed": 3, "metrics": {"loss": [1.0, 2]}}
    ckpt = save(run, mod, 2, state=state, bucket_keys=[*BUCKET_KEYS, 13])
    assert ckpt.tag == "e0002-b000000" and ckpt.path == run.path / "checkpoints" / ckpt.tag
    assert sorted(p.name for p in ckpt.path.iterdir()) == sorted(
        ["params.nd", "optimizer.nd", "optimizer.json", "state.json", "manifest.json"]
    )
    assert work_leftovers(run) == []

    loaded = load_checkpoint(ckpt)
    assert loaded.state == state
    assert loaded.bucket_keys == [(5, 7), (9, 12), 13]  # tuples survive JSON
    assert loaded.versions["mxnet"] == mx.__version__ and "numpy" in loaded.versions
    assert_same(loaded_params(ckpt), params_of(mod))
    arrays, meta = mod.get_optimizer_states()
    assert loaded.optimizer_meta == meta
    assert sorted(loaded.optimizer_arrays) == sorted(arrays)
    for name, value in arrays.items():
        assert np.array_equal(loaded.optimizer_arrays[name].asnumpy(), value.asnumpy())

    # the manifest covers the top-level file, which is the same bytes as params.nd
    manifest = json.loads((ckpt.path / "manifest.json").read_text())
    top = run.params_file(PREFIX, 2)
    assert manifest["top_level_params"]["file"] == top.name
    assert manifest["top_level_params"]["sha256"] == hashlib.sha256(top.read_bytes()).hexdigest()
    assert top.read_bytes() == (ckpt.path / "params.nd").read_bytes()
    stock = mx.mod.Module.load(str(run.path / PREFIX), 2, label_names=["lro_label"])
    stock.bind([("data", (BATCH, 3))], [("lro_label", (BATCH, 2))], for_training=False)
    assert_same({k: v.asnumpy() for d in stock.get_params() for k, v in d.items()}, params_of(mod))

    # into a fresh module: parameters and optimizer continue where they were
    fresh = new_module(seed=9)
    restore_module(fresh, loaded)
    assert_same(params_of(fresh), params_of(mod))
    assert fresh.optimizer.num_update == mod.optimizer.num_update == 3
    assert_same(params_of(train(fresh, 2, seed=5)), params_of(train(mod, 2, seed=5)))

    # mid-epoch: no top-level params file
    mid = save(run, mod, 2, 7)
    assert mid.tag == "e0002-b000007" and not mid.epoch_end
    assert not run.params_file(PREFIX, 3).exists()
    assert [c.tag for c in list_checkpoints(run)] == ["e0002-b000000", "e0002-b000007"]
    assert list_checkpoints(run)[0].created == pytest.approx(ckpt.created)


def test_module_without_optimizer_and_state_that_is_not_json(
    run: RunFolder, caplog: pytest.LogCaptureFixture
) -> None:
    mod = BucketingModule(sym_gen, 3)
    mod.bind([("data", (BATCH, 3))], [("lro_label", (BATCH, 2))], for_training=False)
    mod.init_params()
    loaded = load_checkpoint(save(run, mod, 1))
    assert loaded.optimizer_meta is None and loaded.optimizer_arrays == {}
    restore_module(mod, loaded)
    with caplog.at_level(logging.WARNING, logger="mxtrain.run.checkpoint"):
        restore_module(new_module(), loaded)
    assert "no optimizer state" in caplog.text

    with pytest.raises(ValueError, match="training state"):
        save(run, mod, 2, state={"when": object()})
    assert [c.tag for c in list_checkpoints(run)] == ["e0001-b000000"]
    assert work_leftovers(run) == []


def test_restore_into_another_model_is_a_checkpoint_error(run: RunFolder) -> None:
    ckpt = save(run, train(new_module(), 1), 1)
    other = BucketingModule(sym_gen, 3)
    other.bind([("data", (BATCH, 3))], [("lro_label", (BATCH, 2))])
    other.init_params()
    other.init_optimizer(None, "sgd", {"learning_rate": 0.1})
    with pytest.raises(CheckpointError, match=r"e0001-b000000.*'Adam'.*'SGD'") as err:
        restore_module(other, load_checkpoint(ckpt))
    assert err.value.exit_code == ExitCode.DATA


# ----------------------------------------------------------------------------- crashes


class Crash(BaseException):
    """A simulated kill: nothing in save_checkpoint gets to clean up."""


PRIMITIVES = ("_write_bytes", "_save_nd", "_copy_file", "fsync_dir")


def interrupt_at(
    monkeypatch: pytest.MonkeyPatch, k: int, error: Callable[[], BaseException]
) -> list[str]:
    """Make the k-th file operation of save_checkpoint fail (a write fails half-way)."""
    calls: list[str] = []

    def wrap(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def step(*args: Any) -> Any:
            calls.append(name)
            if len(calls) != k:
                return real(*args)
            if name == "_write_bytes":  # a torn write: half the bytes reach the disk
                Path(args[0]).write_bytes(args[1][: len(args[1]) // 2])
            elif name in ("_save_nd", "_copy_file"):
                real(*args)
                target = Path(args[-1] if name == "_copy_file" else args[0])
                target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
            raise error()

        return step

    for name in PRIMITIVES:
        monkeypatch.setattr(checkpoint, name, wrap(name, getattr(checkpoint, name)))
    monkeypatch.setattr(os, "replace", wrap("os.replace", os.replace))
    monkeypatch.setattr(os, "rename", wrap("os.rename", os.rename))
    return calls


def count_steps(tmp_path: Path, same_tag: bool) -> int:
    scratch = RunFolder(tmp_path / "count")
    scratch.path.mkdir()
    mod = train(new_module(), 1)
    save(scratch, mod, 1)
    with pytest.MonkeyPatch.context() as mp:
        calls = interrupt_at(mp, 0, Crash)
        save(scratch, mod, 1 if same_tag else 2)
    return len(calls)


@pytest.mark.parametrize("same_tag", [False, True], ids=["new-tag", "replace-same-tag"])
@pytest.mark.parametrize("kind", ["crash", "oserror"])
def test_interrupted_save_never_costs_the_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, same_tag: bool, kind: str
) -> None:
    steps = count_steps(tmp_path, same_tag)
    assert steps >= 10
    old_mod = train(new_module(), 1)
    new_mod = train(new_module(), 3)
    old_params, new_params = params_of(old_mod), params_of(new_mod)
    tag = "e0001-b000000" if same_tag else "e0002-b000000"
    for k in range(1, steps + 1):
        run = RunFolder(tmp_path / f"{kind}-{k}")
        run.path.mkdir()
        previous = save(run, old_mod, 1)
        top_before = run.params_file(PREFIX, 1).read_bytes()
        with monkeypatch.context() as mp:
            interrupt_at(mp, k, Crash if kind == "crash" else lambda: OSError(28, "No space"))
            with pytest.raises(Crash if kind == "crash" else RunFolderError):
                save(run, new_mod, 1 if same_tag else 2)

        listed = list_checkpoints(run)
        for ckpt in listed:  # nothing half-written is ever listed
            verify_checkpoint(ckpt)
        by_tag = {c.tag: c for c in listed}
        assert "e0001-b000000" in by_tag, f"step {k}: the previous checkpoint is gone"
        first = loaded_params(by_tag["e0001-b000000"])
        if same_tag:  # old or new, but whole
            assert any(
                all(np.array_equal(first[n], want[n]) for n in first)
                for want in (old_params, new_params)
            ), f"step {k}"
        else:
            assert_same(first, old_params)
            assert run.params_file(PREFIX, 1).read_bytes() == top_before
            if tag in by_tag:
                assert_same(loaded_params(by_tag[tag]), new_params)
        assert find_checkpoint(run)[0].tag in by_tag
        if kind == "oserror":
            assert work_leftovers(run) == [], f"step {k}"

        # the next save clears what the crash left and succeeds
        done = save(run, new_mod, 1 if same_tag else 2)
        assert work_leftovers(run) == []
        assert_same(loaded_params(done), new_params)
        assert previous.tag in {c.tag for c in list_checkpoints(run)}


def test_replacement_interrupted_between_renames_is_recovered(run: RunFolder) -> None:
    mod = train(new_module(), 1)
    ckpt = save(run, mod, 1)
    aside = ckpt.path.with_name(f".old-{ckpt.tag}-{os.getpid()}")
    os.rename(ckpt.path, aside)
    (listed,) = list_checkpoints(run)
    assert listed.tag == ckpt.tag and listed.path == aside
    verify_checkpoint(listed)
    assert_same(loaded_params(listed), params_of(mod))
    save(run, mod, 2)  # tidies up: the aside folder goes back under its tag
    assert [c.path for c in list_checkpoints(run)] == [
        ckpt.path,
        run.path / "checkpoints/e0002-b000000",
    ]
    assert work_leftovers(run) == []


def test_leftovers_of_live_processes_are_left_alone(run: RunFolder) -> None:
    mod = train(new_module(), 1)
    save(run, mod, 1)
    root = run.checkpoints_dir
    live = root / f".tmp-e0005-b000000-{os.getppid()}"  # the parent is alive
    live.mkdir()
    save(run, mod, 2)
    assert live.exists()
    for junk in ("notes", "e3-b0", "e00003-b000000", "e0004-b00001"):
        (root / junk).mkdir()
    (root / "best").write_text("e0001-b000000\n")
    assert [c.tag for c in list_checkpoints(run)] == ["e0001-b000000", "e0002-b000000"]


# ----------------------------------------------------------------------------- corruption


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-10])


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))


def edit_checksum(path: Path) -> None:
    manifest = json.loads(path.read_text())
    manifest["files"]["params.nd"]["sha256"] = "0" * 64
    path.write_text(json.dumps(manifest))


CORRUPTIONS: dict[str, tuple[str, Callable[[Path], None], str]] = {
    "truncated params": ("params.nd", truncate, "is truncated: .* bytes, the manifest records"),
    "flipped byte": ("optimizer.nd", flip_byte, "is corrupted: its sha256 differs"),
    "deleted optimizer": ("optimizer.nd", Path.unlink, "is missing"),
    "edited checksum": ("manifest.json", edit_checksum, "was modified after it was written"),
    "manifest not json": ("manifest.json", lambda p: p.write_text("{oops"), "is not valid JSON"),
    "no manifest": ("manifest.json", Path.unlink, "is missing .*never completely written"),
    "grown state": ("state.json", lambda p: p.write_text(p.read_text() + " "), "the wrong size"),
}


@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_corruption_is_named(run: RunFolder, case: str) -> None:
    name, damage, message = CORRUPTIONS[case]
    ckpt = save(run, train(new_module(), 1), 1)
    damage(ckpt.path / name)
    with pytest.raises(CheckpointError, match=message) as err:
        verify_checkpoint(ckpt)
    assert str(ckpt.path / name) in str(err.value)
    assert err.value.exit_code == ExitCode.DATA
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(ckpt)


def test_well_sealed_but_malformed_files_are_named(run: RunFolder) -> None:
    ckpt = save(run, train(new_module(), 1), 1)
    reseal(ckpt.path, "state.json", b"not json at all")
    with pytest.raises(CheckpointError, match=r"state.json is not valid JSON"):
        verify_checkpoint(ckpt)
    reseal(ckpt.path, "state.json", b"[1, 2]")
    with pytest.raises(CheckpointError, match=r"state.json does not hold a training state"):
        verify_checkpoint(ckpt)
    reseal(ckpt.path, "state.json", b'{"state": {}}')
    reseal(ckpt.path, "params.nd", b"\x00" * 40)
    with pytest.raises(CheckpointError, match=r"params.nd cannot be read by MXNet"):
        load_checkpoint(ckpt)

    # a folder renamed to another tag does not pass for that position
    other = ckpt.path.with_name("e0007-b000000")
    ckpt.path.rename(other)
    with pytest.raises(CheckpointError, match="describes checkpoint 'e0001-b000000'"):
        verify_checkpoint(list_checkpoints(run)[0])


# ----------------------------------------------------------------------------- finding


def test_find_falls_back_to_the_newest_valid_checkpoint(run: RunFolder) -> None:
    mod = new_module()
    for epoch, batch in ((1, 0), (1, 5), (2, 0), (2, 5)):
        save(run, train(mod, 1), epoch, batch)
    found, skipped = find_checkpoint(run)
    assert found.tag == "e0002-b000005" and skipped == []

    root = run.checkpoints_dir
    truncate(root / "e0002-b000005" / "params.nd")
    (root / "e0002-b000000" / "manifest.json").unlink()
    found, skipped = find_checkpoint(run)
    assert found.tag == "e0001-b000005"
    assert [(c.tag, reason.split(" ")[0]) for c, reason in skipped] == [
        ("e0002-b000005", "params.nd"),
        ("e0002-b000000", "manifest.json"),
    ]
    assert "truncated" in skipped[0][1]

    # a given epoch: its epoch-end checkpoint first, then the ones saved after it
    assert find_checkpoint(run, 1) == (list_checkpoints(run)[0], [])
    flip_byte(root / "e0001-b000000" / "state.json")
    found, skipped = find_checkpoint(run, 1)
    assert found.tag == "e0001-b000005" and [c.tag for c, _ in skipped] == ["e0001-b000000"]
    with pytest.raises(CheckpointError, match=r"e0002-b000000: manifest.json is missing"):
        find_checkpoint(run, 2)
    with pytest.raises(CheckpointError, match=r"no checkpoint for epoch 7.*e0001-b000000"):
        find_checkpoint(run, 7)

    truncate(root / "e0001-b000005" / "optimizer.json")
    with pytest.raises(
        CheckpointError, match=re.escape(f"{run.path} has no valid checkpoint: e0002-b000005")
    ):
        find_checkpoint(run)


def test_find_without_checkpoints(run: RunFolder) -> None:
    with pytest.raises(CheckpointError, match="has no checkpoints"):
        find_checkpoint(run)


# ----------------------------------------------------------------------------- pruning


def test_prune_keeps_the_newest_and_the_protected(run: RunFolder) -> None:
    mod = train(new_module(), 1)
    for epoch in range(1, 6):
        save(run, mod, epoch)
    save(run, mod, 5, 3)
    assert prune_checkpoints(run, prefix=PREFIX, keep_last=None) == []
    removed = prune_checkpoints(run, prefix=PREFIX, keep_last=2, protect=["e0002-b000000"])
    assert [c.tag for c in removed] == ["e0001-b000000", "e0003-b000000", "e0004-b000000"]
    assert [c.tag for c in list_checkpoints(run)] == [
        "e0002-b000000",
        "e0005-b000000",
        "e0005-b000003",
    ]
    assert sorted(p.name for p in run.path.glob("*.params")) == [
        "model-0002.params",
        "model-0005.params",
    ]
    assert work_leftovers(run) == []
    with pytest.raises(ValueError, match="keep_last"):
        prune_checkpoints(run, prefix=PREFIX, keep_last=0)
    shutil.rmtree(run.checkpoints_dir)
    assert list_checkpoints(run) == []


# ----------------------------------------------------------------------------- choosing


def positioned(epoch: int, batch: int) -> dict[str, Any]:
    return {"position": {"epoch": epoch, "batch": batch}}


def test_find_by_tag_best_and_latest(run: RunFolder) -> None:
    mod = new_module()
    for epoch, batch in ((1, 0), (1, 5), (2, 0), (2, 5)):
        save(run, train(mod, 1), epoch, batch, state=positioned(epoch, batch))
    root = run.checkpoints_dir
    assert find_checkpoint(run, tag="latest")[0].tag == "e0002-b000005"
    assert find_checkpoint(run, tag="e0001-b000005") == (list_checkpoints(run)[1], [])
    with pytest.raises(CheckpointError, match="records no best checkpoint") as err:
        find_checkpoint(run, tag="best")
    assert "checkpoint.best_metric" in (err.value.hint or "")
    (root / "best").write_text("e0001-b000000\n")
    assert find_checkpoint(run, tag="best")[0].tag == "e0001-b000000"
    with pytest.raises(CheckpointError, match="no checkpoint e0009-b000000") as err:
        find_checkpoint(run, tag="e0009-b000000")
    assert "e0001-b000000, e0001-b000005, e0002-b000000, e0002-b000005" in (err.value.hint or "")

    # a damaged newest one is skipped by default, but one asked for by name is an error
    flip_byte(root / "e0002-b000005" / "params.nd")
    found, skipped = find_checkpoint(run)
    assert found.tag == "e0002-b000000" and [c.tag for c, _ in skipped] == ["e0002-b000005"]
    with pytest.raises(CheckpointError, match=r"e0002-b000005/params.nd is corrupted") as err:
        find_checkpoint(run, tag="e0002-b000005")
    assert err.value.exit_code == ExitCode.DATA and "RUN:latest" in (err.value.hint or "")
    flip_byte(root / "e0001-b000000" / "params.nd")
    with pytest.raises(CheckpointError, match=r"e0001-b000000/params.nd is corrupted"):
        find_checkpoint(run, tag="best")


POSITIONS: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "negative epoch": (lambda p: p.update(epoch=-1), r"epoch -1, not a non-negative integer"),
    "huge batch": (lambda p: p.update(batch=10**12), r"batch 1000000000000, which is not"),
    "epoch text": (lambda p: p.update(epoch="abc"), r"epoch 'abc', not a non-negative"),
    "float batch": (lambda p: p.update(batch=5.0), r"batch 5.0, not a non-negative"),
    "other epoch": (lambda p: p.update(epoch=1), r"epoch 1, batch 5, which is not the"),
    "no mapping": (lambda p: p.clear(), r"epoch None, not a non-negative"),
}


@pytest.mark.parametrize("case", list(POSITIONS))
def test_a_sealed_state_with_an_impossible_position_is_unusable(run: RunFolder, case: str) -> None:
    change, message = POSITIONS[case]
    mod = new_module()
    save(run, train(mod, 1), 2, 0, state=positioned(2, 0))
    bad = save(run, train(mod, 1), 2, 5, state=positioned(2, 5))
    reseal_position(bad.path, change)
    with pytest.raises(CheckpointError, match=message) as err:
        verify_checkpoint(bad)
    assert str(bad.path / "state.json") in str(err.value)
    found, skipped = find_checkpoint(run)
    assert found.tag == "e0002-b000000" and [c.tag for c, _ in skipped] == [bad.tag]


def test_find_and_load_skips_what_mxnet_cannot_read(run: RunFolder) -> None:
    mod = new_module()
    save(run, train(mod, 1), 1, 0, state=positioned(1, 0))
    newest = save(run, train(mod, 1), 1, 5, state=positioned(1, 5))
    reseal(newest.path, "optimizer.nd", b"\x00" * 64)  # verifies, but is no NDArray file
    verify_checkpoint(newest)
    loaded, skipped = checkpoint.find_and_load(run)
    assert loaded.checkpoint.tag == "e0001-b000000"
    assert [(c.tag, r.split(" ")[0]) for c, r in skipped] == [("e0001-b000005", "optimizer.nd")]
    assert "cannot be read by MXNet" in skipped[0][1]
    # without the optimizer state (inference), that file is not needed
    loaded, skipped = checkpoint.find_and_load(run, optimizer=False)
    assert loaded.checkpoint.tag == "e0001-b000005" and skipped == []
    assert loaded.optimizer_arrays == {} and loaded.optimizer_meta is None

    def refuse(_: Any) -> None:
        raise ValueError("totals is None")

    with pytest.raises(CheckpointError, match="has no valid checkpoint") as err:
        checkpoint.find_and_load(run, accept=refuse)
    assert "impossible training state (totals is None)" in str(err.value)
    assert "falls back" not in str(err.value) + (err.value.hint or "")
