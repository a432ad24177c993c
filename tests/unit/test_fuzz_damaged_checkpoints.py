"""A damaged checkpoint is never deleted by a save over its tag (fuzz class: damaged
checkpoints).

Resume skips a damaged newest checkpoint, trains that stretch again and saves the same tag:
the save renames the damaged folder ``damaged-<tag>-<n>`` first, which listing, choice,
tidying and retention all ignore, and logs it. A valid checkpoint is still replaced as before.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from checkpoint_helpers import reseal
from test_checkpoint import new_module, save, train

from mxtrain.run.checkpoint import (
    find_checkpoint,
    list_checkpoints,
    prune_checkpoints,
    tidy_checkpoints,
)
from mxtrain.run.folder import RunFolder
from mxtrain.run.layout import PARAMS_FILE


def truncate(folder: Path) -> None:
    params = folder / PARAMS_FILE
    params.write_bytes(params.read_bytes()[:100])


def flip_a_byte(folder: Path) -> None:
    params = folder / PARAMS_FILE
    data = bytearray(params.read_bytes())
    data[len(data) // 2] ^= 0xFF
    params.write_bytes(bytes(data))


def unreadable_by_mxnet(folder: Path) -> None:
    reseal(folder, PARAMS_FILE, b"\x00" * 64)  # verifies, but MXNet cannot read it


def no_manifest(folder: Path) -> None:
    (folder / "manifest.json").unlink()


DAMAGE: dict[str, Callable[[Path], None]] = {
    "truncated params": truncate,
    "flipped byte": flip_a_byte,
    "unreadable params": unreadable_by_mxnet,
    "no manifest": no_manifest,
}


@pytest.fixture
def run(tmp_path: Path) -> RunFolder:
    (tmp_path / "run").mkdir()
    return RunFolder(tmp_path / "run")


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_saving_over_a_damaged_checkpoint_keeps_it_aside(
    run: RunFolder, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    mod = train(new_module(), 2)
    save(run, mod, 1)
    newest = save(run, mod, 2)
    DAMAGE[damage](newest.path)
    damaged = folder_bytes(newest.path)
    assert find_checkpoint(run, load=True)[0].tag == "e0001-b000000"  # resume skips it

    with caplog.at_level(logging.WARNING):
        again = save(run, train(mod, 1), 2)
    aside = run.checkpoints_dir / "damaged-e0002-b000000-1"
    assert folder_bytes(aside) == damaged  # every damaged byte is still there
    assert "checkpoint e0002-b000000 is damaged" in caplog.text and str(aside) in caplog.text
    assert find_checkpoint(run)[0] == again  # the new one is valid and chosen
    # nothing that lists, tidies or prunes checkpoints sees (or deletes) the aside folder
    assert [c.tag for c in list_checkpoints(run)] == ["e0001-b000000", "e0002-b000000"]
    tidy_checkpoints(run, "model")
    assert prune_checkpoints(run, prefix="model", keep_last=1)[0].tag == "e0001-b000000"
    assert folder_bytes(aside) == damaged

    # damaged again: the second one gets the next number, the first stays
    truncate(again.path)
    save(run, mod, 2)
    assert (run.checkpoints_dir / "damaged-e0002-b000000-2").is_dir()
    assert folder_bytes(aside) == damaged


def test_something_else_under_the_tag_is_kept_aside_too(run: RunFolder) -> None:
    mod = train(new_module(), 1)
    run.checkpoints_dir.mkdir()
    (run.checkpoints_dir / "e0001-b000000").write_text("not a checkpoint folder")
    save(run, mod, 1)
    aside = run.checkpoints_dir / "damaged-e0001-b000000-1"
    assert aside.read_text() == "not a checkpoint folder"


def test_a_valid_checkpoint_is_replaced_as_before(run: RunFolder) -> None:
    mod = train(new_module(), 1)
    save(run, mod, 1)
    save(run, train(mod, 1), 1)
    assert sorted(os.listdir(run.checkpoints_dir)) == ["e0001-b000000"]
