"""A skipped (damaged) checkpoint is never deleted, retention included (fuzz class: damaged
checkpoints and ``checkpoint.keep_last``).

A resume that skips a damaged checkpoint renames it ``checkpoints/damaged-<tag>-<n>`` before
it writes anything, so a later save that lands on other batches cannot prune it; retention
itself sets aside, instead of deleting, an old checkpoint that does not verify. Score,
predict and export only read a run folder: they skip a damaged checkpoint, say so, and
leave it where it is.

One run is fitted per module and stopped by fit.max_updates in its third epoch (17 batches
an epoch, 37 updates), so it has ``e0001-b000000``, ``e0002-b000000`` and
``e0002-b000003``; each test works on a copy.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import TINY_CONFIG, write_corpus

from mxtrain.cli.main import cli

LAYOUT = ["e0001-b000000", "e0002-b000000", "e0002-b000003"]


def invoke(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("retention")
    write_corpus(folder / "train.txt", 120, seed=1)
    write_corpus(folder / "valid.txt", 30, seed=2)
    (folder / "tiny.yaml").write_text(textwrap.dedent(TINY_CONFIG.format(runs_dir=folder / "runs")))
    code, output = invoke(
        "fit", folder / "tiny.yaml", "--set", "fit.num_epoch=3", "--set", "fit.max_updates=37"
    )
    assert code == 0, output
    run = folder / "runs" / "tiny"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == LAYOUT
    return run


@pytest.fixture
def copy(stopped: Path, tmp_path: Path) -> Path:
    """A copy of the stopped run (config paths stay valid via run.json)."""
    target = tmp_path / "run"
    shutil.copytree(stopped, target)
    return target


def truncate_params(folder: Path) -> None:
    params = folder / "params.nd"
    params.write_bytes(params.read_bytes()[: params.stat().st_size // 2])


def folder_state(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def checkpoint_names(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").iterdir())


#: which checkpoint is damaged, how resume is asked, and where it then starts from
SKIPPED = {
    "newest": ("e0002-b000003", [], "e0002-b000000"),
    "epoch end of --epoch 2": ("e0002-b000000", ["--epoch", "2"], "e0002-b000003"),
}


@pytest.mark.parametrize("case", list(SKIPPED))
def test_resume_with_keep_last_never_deletes_the_damaged_checkpoint_it_skipped(
    copy: Path, case: str
) -> None:
    """The reproducer: resume skips the damaged checkpoint and its saves land on
    e0002-b000006, never on that tag again, with keep_last 1: the damaged bytes survive."""
    tag, args, start = SKIPPED[case]
    bad = copy / "checkpoints" / tag
    truncate_params(bad)
    damaged = folder_state(bad)

    code, output = invoke(
        "resume", copy, *args, "--set", "fit.max_updates=40", "--set", "checkpoint.keep_last=1"
    )
    assert code == 0, output
    assert "Traceback" not in output
    aside = copy / "checkpoints" / f"damaged-{tag}-1"
    assert folder_state(aside) == damaged  # every damaged byte survives
    assert checkpoint_names(copy) == [aside.name, "e0002-b000006"]
    log = (copy / "train.log").read_text()
    assert f"checkpoint {tag} is not usable (params.nd is truncated" in log
    assert f"checkpoint {tag} is damaged (params.nd is truncated" in log
    assert str(aside) in log
    assert json.loads((copy / "run.json").read_text())["resumes"][-1]["from"] == start

    # a later resume that prunes again still leaves it alone
    code, output = invoke("resume", copy, "--set", "fit.max_updates=42")
    assert code == 0, output
    assert folder_state(aside) == damaged
    assert checkpoint_names(copy) == [aside.name, "e0002-b000008"]


def test_retention_sets_aside_an_old_damaged_checkpoint_resume_never_chose(copy: Path) -> None:
    """e0001-b000000 is damaged but resume starts from the newest (valid) one, so only
    retention meets it: it is kept as damaged-<tag>-1, not deleted."""
    bad = copy / "checkpoints" / "e0001-b000000"
    truncate_params(bad)
    damaged = folder_state(bad)
    top_level = (copy / "model-0001.params").read_bytes()

    code, output = invoke(
        "resume", copy, "--set", "fit.max_updates=40", "--set", "checkpoint.keep_last=1"
    )
    assert code == 0, output
    aside = copy / "checkpoints" / "damaged-e0001-b000000-1"
    assert folder_state(aside) == damaged
    assert (copy / "model-0001.params").read_bytes() == top_level  # its copy stays too
    assert checkpoint_names(copy) == ["damaged-e0001-b000000-1", "e0002-b000006"]
    log = (copy / "train.log").read_text()
    assert "checkpoint e0001-b000000 is damaged (params.nd is truncated" in log
    assert str(aside) in log


def test_read_only_commands_skip_a_damaged_checkpoint_and_leave_it_in_place(
    copy: Path, tmp_path: Path
) -> None:
    truncate_params(copy / "checkpoints" / "e0002-b000003")
    before = folder_state(copy)
    source = tmp_path / "in.txt"
    source.write_text("the cat sat\n")
    commands = {
        "score": ["score", copy, "--json"],
        "predict": ["predict", "--checkpoint", copy, "--input", source, "--output", tmp_path / "p"],
        "export": ["export", copy, "-o", tmp_path / "exported"],
        "show": ["show", copy],
    }
    for name, args in commands.items():
        result = CliRunner().invoke(cli, [str(a) for a in args])
        assert result.exit_code == 0, (name, result.output)
        assert "Traceback" not in result.output
        if name != "show":
            assert "checkpoint e0002-b000003 is not usable" in result.stderr, name
            assert "skipped it" in result.stderr, name
        assert folder_state(copy) == before, name  # nothing renamed, nothing deleted
    assert "damaged" not in " ".join(checkpoint_names(copy))


def test_resume_force_sets_aside_a_damaged_newer_checkpoint_it_discards(copy: Path) -> None:
    """--epoch 1 --force discards the newer checkpoints without looking at them for the
    choice; a damaged one among them is set aside, not deleted."""
    bad = copy / "checkpoints" / "e0002-b000003"
    truncate_params(bad)
    damaged = folder_state(bad)
    code, output = invoke("resume", copy, "--epoch", "1", "--force", "--set", "fit.max_updates=20")
    assert code == 0, output
    aside = copy / "checkpoints" / "damaged-e0002-b000003-1"
    assert folder_state(aside) == damaged
    assert checkpoint_names(copy) == [aside.name, "e0001-b000000", "e0001-b000003"]
    log = (copy / "train.log").read_text()
    assert "removed checkpoint e0002-b000000 (newer than the resume point; --force)" in log
    assert f"kept as {aside}, not deleted by resume --force" in log
