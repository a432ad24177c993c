"""The OpenMP threads a sweep gives its points: a share of the usable cores where the user
left them to auto, the user's own count otherwise, with a warning when that oversubscribes."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from mxtrain.fit import sweep as sweep_module
from mxtrain.fit.sweep import Sweep, SweepPoint, ThreadShare


def _sets(sweep: Sweep, point: SweepPoint) -> tuple[str, list[str]]:
    """The config and --set values a point's fit gets before its threads (as _start builds)."""
    return sweep.config, [*sweep.overrides, *(f"{k}={v}" for k, v in point.overrides)]


def _sweep(config: Path, overrides: list[str] | None = None) -> Sweep:
    return Sweep(config.parent / "sweep", str(config), overrides or [], [], None, 0)


@pytest.fixture
def four_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sweep_module, "usable_cores", lambda: 4)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)


def test_auto_threads_get_an_equal_share_of_the_usable_cores(
    tiny_config: Path, four_cores: None
) -> None:
    point = SweepPoint("001_x", [("optimizer.learning_rate", "0.5")])
    assert ThreadShare(2).set_for(*_sets(_sweep(tiny_config), point)) == ["context.omp_threads=2"]
    assert ThreadShare(3).set_for(*_sets(_sweep(tiny_config), point)) == ["context.omp_threads=1"]
    assert ThreadShare(8).set_for(*_sets(_sweep(tiny_config), point)) == ["context.omp_threads=1"]


def test_the_affinity_counts_not_the_machine(
    tiny_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under taskset the share is of the cores the sweep may use (the real function)."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0}, raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 64)
    share = ThreadShare(1)
    assert share.cores == 1
    assert share.set_for(*_sets(_sweep(tiny_config), SweepPoint("001", []))) == [
        "context.omp_threads=1"
    ]


@pytest.mark.parametrize(
    ("overrides", "point"),
    [
        (["context.omp_threads=1"], []),  # the sweep's --set
        ([], [("context.omp_threads", "1")]),  # a grid axis
    ],
)
def test_a_count_the_user_fixed_is_kept(
    tiny_config: Path,
    four_cores: None,
    overrides: list[str],
    point: list[tuple[str, str]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="mxtrain"):
        sets = ThreadShare(2).set_for(
            *_sets(_sweep(tiny_config, overrides), SweepPoint("001", point))
        )
    assert sets == []
    assert not caplog.records


def test_a_count_in_the_config_file_is_kept(tiny_config: Path, four_cores: None) -> None:
    text = tiny_config.read_text()
    assert "context:" not in text
    tiny_config.write_text(text + "context:\n  omp_threads: 1\n")
    assert ThreadShare(2).set_for(*_sets(_sweep(tiny_config), SweepPoint("001", []))) == []


def test_an_exported_count_is_kept_as_fit_keeps_it(
    tiny_config: Path, four_cores: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert ThreadShare(2).set_for(*_sets(_sweep(tiny_config), SweepPoint("001", []))) == []


def test_oversubscribing_counts_are_warned_about_once_with_the_fix(
    tiny_config: Path,
    four_cores: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    share = ThreadShare(2)
    with caplog.at_level(logging.WARNING, logger="mxtrain"):
        for name in ("001", "002"):
            assert share.set_for(*_sets(_sweep(tiny_config), SweepPoint(name, []))) == []
    (record,) = caplog.records
    message = record.getMessage()
    assert "OMP_NUM_THREADS in the environment is 4" in message
    assert "8 OpenMP threads on 4 usable cores" in message
    assert "give each point 2" in message
