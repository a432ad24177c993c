"""fit's memory estimate before the first batch: ``fit.bucket_memory: auto`` sized to the
memory the machine has, and the warning when a run will not fit (mxtrain.fit.memory).

The machine's available memory is replaced by a figure derived from the run's own plan, so
the decisions are the same on every machine whatever its memory."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner

import mxtrain.fit.memory as fit_memory
from mxtrain.cli.main import cli
from mxtrain.memory_plan import MemoryPlan


def _fit(tmp: Path, config: Path, name: str, *extra: str):
    result = CliRunner().invoke(
        cli,
        ["fit", str(config), "--name", name, "--set", "model.cell=fused", "--progress", "plain",
         *extra],
        catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return result.output


def _with_available(monkeypatch: pytest.MonkeyPatch, largest_buckets: float | None) -> None:
    """Make the machine have room for the run's shared memory and weight copies plus
    ``largest_buckets`` largest buckets' workspaces within auto's share (None: not even its
    shared memory)."""
    measure = fit_memory.memory_plan

    def plan(*args, **kwargs) -> MemoryPlan:
        real = measure(*args, **kwargs)
        fixed = real.shared + real.kept_each * real.buckets
        room = 0 if largest_buckets is None else fixed + largest_buckets * real.kept_largest
        return dataclasses.replace(real, available=int(room / fit_memory.AUTO_SHARE))

    monkeypatch.setattr(fit_memory, "memory_plan", plan)


def test_auto_binds_fewer_buckets_where_memory_is_short_and_trains_the_same_numbers(
    tiny_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conftest import metric_trace, params

    runs = tiny_config.parent / "runs"
    roomy = _fit(tiny_config.parent, tiny_config, "roomy")
    assert "memory estimate: peak" in roomy and "bucket_memory 5" in roomy
    assert "unbinding bucket" not in roomy
    _with_available(monkeypatch, 1.3)
    short = _fit(tiny_config.parent, tiny_config, "short")
    # buckets [5, 9, 13] add up to 2.1 largest ones: 1.3 must unbind
    assert "fit.bucket_memory auto: 1.3 x the largest bucket's positions" in short
    assert "unbinding bucket" in short and "buckets rebound (fit.bucket_memory)" in short
    assert "may be killed" not in short
    assert metric_trace(runs / "short") == metric_trace(runs / "roomy")
    for name, value in params(runs / "roomy", 2).items():
        assert (params(runs / "short", 2)[name] == value).all(), name


@pytest.mark.parametrize("setting", ["auto", "null", "3"])
def test_a_run_estimated_beyond_the_available_memory_is_warned_with_its_keys(
    tiny_config: Path, monkeypatch: pytest.MonkeyPatch, setting: str
) -> None:
    _with_available(monkeypatch, 1.2 if setting != "auto" else None)
    chosen = ["--set", f"fit.bucket_memory={setting}"] if setting != "auto" else []
    output = _fit(tiny_config.parent, tiny_config, "warned", *chosen)
    (warning,) = [line for line in output.splitlines() if "may be killed" in line]
    print(warning)
    where = str(tiny_config) if setting == "auto" else f"--set fit.bucket_memory={setting}"
    assert warning.split(" WARNING ")[1].startswith(where), warning
    assert "fit.bucket_memory" in warning
    if setting == "auto":  # nothing tighter to offer: the batch or the buckets must shrink
        assert "Lower data.train.batch_size" in warning
    else:  # the largest bucket alone would fit
        assert "Set fit.bucket_memory: 1.0" in warning
