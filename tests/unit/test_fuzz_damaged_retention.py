"""A skipped (damaged) checkpoint is never deleted, retention included (fuzz class: damaged
checkpoints and ``checkpoint.keep_last``).

:func:`keep_damaged_aside` renames what a choice skipped ``damaged-<tag>-<n>`` (resume calls
it before it writes anything), and :func:`prune_checkpoints` sets aside, instead of
deleting, a checkpoint that does not verify. The property test damages any subset of a
run's checkpoints in any way, then resumes (or not) and prunes with any ``keep_last``: every
damaged byte is still in the run folder afterwards.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_checkpoint import new_module, save, train
from test_fuzz_damaged_checkpoints import DAMAGE, folder_bytes, truncate

from mxtrain.errors import MxtrainError
from mxtrain.run.checkpoint import (
    find_and_load,
    keep_damaged_aside,
    list_checkpoints,
    prune_checkpoints,
)
from mxtrain.run.folder import RunFolder
from mxtrain.run.layout import work_folder_name

TAGS = ["e0001-b000000", "e0001-b000004", "e0002-b000000", "e0002-b000004", "e0003-b000000"]


def saved_run(folder: Path) -> RunFolder:
    """A run folder with a valid checkpoint at each of TAGS."""
    folder.mkdir()
    run = RunFolder(folder)
    mod = train(new_module(), 1)
    for tag in TAGS:
        epoch, batch = int(tag[1:5]), int(tag[7:])
        save(run, train(mod, 1), epoch, batch)
    return run


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return saved_run(tmp_path_factory.mktemp("retention") / "run").path


@pytest.fixture
def run(template: Path, tmp_path: Path) -> RunFolder:
    shutil.copytree(template, tmp_path / "run")
    return RunFolder(tmp_path / "run")


def contents(run: RunFolder) -> list[dict[str, bytes]]:
    """The files of every folder under checkpoints/, whatever its name."""
    return [folder_bytes(p) for p in run.checkpoints_dir.iterdir() if p.is_dir()]


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_what_a_choice_skipped_is_set_aside_and_logged(
    run: RunFolder, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    newest = run.checkpoints_dir / TAGS[-1]
    DAMAGE[damage](newest)
    damaged = folder_bytes(newest)
    loaded, skipped = find_and_load(run)
    assert loaded.checkpoint.tag == TAGS[-2] and [c.tag for c, _ in skipped] == [TAGS[-1]]

    with caplog.at_level(logging.WARNING):
        keep_damaged_aside(run, skipped)
    aside = run.checkpoints_dir / f"damaged-{TAGS[-1]}-1"
    assert folder_bytes(aside) == damaged
    assert f"checkpoint {TAGS[-1]} is damaged ({skipped[0][1]})" in caplog.text
    assert str(aside) in caplog.text
    assert [c.tag for c in list_checkpoints(run)] == TAGS[:-1]
    keep_damaged_aside(run, skipped)  # already gone: nothing to do, no error
    assert folder_bytes(aside) == damaged


def test_a_second_damaged_copy_of_a_tag_gets_the_next_number(run: RunFolder) -> None:
    newest = run.checkpoints_dir / TAGS[-1]
    (run.checkpoints_dir / f"damaged-{TAGS[-1]}-1").mkdir()
    truncate(newest)
    keep_damaged_aside(run, find_and_load(run)[1])
    assert (run.checkpoints_dir / f"damaged-{TAGS[-1]}-2" / "params.nd").is_file()


def test_an_interrupted_replacement_skipped_is_set_aside_too(run: RunFolder) -> None:
    """A checkpoint moved aside by a save that was killed stands in for its tag (listing);
    damaged, it is set aside under the tag's damaged name like any other."""
    root = run.checkpoints_dir
    stand_in = root / work_folder_name("old", TAGS[-1], 999_999_999)
    (root / TAGS[-1]).rename(stand_in)
    truncate(stand_in)
    damaged = folder_bytes(stand_in)
    keep_damaged_aside(run, find_and_load(run)[1])
    assert folder_bytes(root / f"damaged-{TAGS[-1]}-1") == damaged
    assert not stand_in.exists()


#: damage that verification finds (a sealed file MXNet cannot read is found by loading it)
FOUND_BY_VERIFYING = [kind for kind in DAMAGE if kind != "unreadable params"]


@pytest.mark.parametrize("damage", FOUND_BY_VERIFYING)
def test_retention_sets_aside_instead_of_deleting_what_does_not_verify(
    run: RunFolder, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    old = run.checkpoints_dir / TAGS[0]
    DAMAGE[damage](old)
    damaged = folder_bytes(old)
    top_level = run.params_file("model", 1).read_bytes()
    with caplog.at_level(logging.WARNING):
        removed = prune_checkpoints(run, prefix="model", keep_last=1)
    assert [c.tag for c in removed] == TAGS[1:-1]  # the valid ones go as before
    aside = run.checkpoints_dir / f"damaged-{TAGS[0]}-1"
    assert folder_bytes(aside) == damaged
    assert run.params_file("model", 1).read_bytes() == top_level  # perhaps the intact copy
    assert "not deleted by checkpoint.keep_last" in caplog.text and str(aside) in caplog.text
    assert [c.tag for c in list_checkpoints(run)] == TAGS[-1:]


FUZZ = settings(
    derandomize=True,
    deadline=None,
    database=None,
    max_examples=100,
    suppress_health_check=list(HealthCheck),
)


@FUZZ
@given(
    damaged=st.dictionaries(st.sampled_from(TAGS), st.sampled_from(sorted(DAMAGE)), max_size=5),
    keep_last=st.integers(1, len(TAGS) + 1),
    resume_first=st.booleans(),
    protect=st.lists(st.sampled_from(TAGS), max_size=2),
)
def test_no_damaged_byte_is_ever_deleted(
    template: Path,
    tmp_path_factory: pytest.TempPathFactory,
    damaged: dict[str, str],
    keep_last: int,
    resume_first: bool,
    protect: list[str],
) -> None:
    folder = tmp_path_factory.mktemp("example") / "run"
    shutil.copytree(template, folder)
    run = RunFolder(folder)
    for tag, damage in damaged.items():
        DAMAGE[damage](run.checkpoints_dir / tag)
    before = {tag: folder_bytes(run.checkpoints_dir / tag) for tag in damaged}

    skipped: set[str] = set()
    if resume_first:  # what resume does: choose, set aside what was skipped, then settle
        try:
            chosen = find_and_load(run)
        except MxtrainError:
            chosen = None  # nothing valid: resume stops here, having changed nothing
        if chosen is not None:
            skipped = {c.tag for c, _ in chosen[1]}
            keep_damaged_aside(run, chosen[1])
    listed = [c.tag for c in list_checkpoints(run)]
    prune_checkpoints(run, prefix="model", keep_last=keep_last, protect=protect)
    prune_checkpoints(run, prefix="model", keep_last=keep_last, protect=protect)  # idempotent

    after = contents(run)
    for tag, files in before.items():
        if damaged[tag] in FOUND_BY_VERIFYING or tag in skipped:
            assert files in after, f"the damaged {tag} ({damaged[tag]}) was deleted"
    # retention itself is unchanged for what verifies: the newest keep_last and the protected
    kept = set(listed[-keep_last:]) | (set(protect) & set(listed))
    assert [c.tag for c in list_checkpoints(run)] == [t for t in listed if t in kept]
    shutil.rmtree(folder.parent)
