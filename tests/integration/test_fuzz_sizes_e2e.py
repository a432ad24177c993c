"""Fuzz findings about sizes, end to end: ``python -m mxtrain`` and the click commands end in
a documented exit code with a one-paragraph message, never a traceback, a native crash or a
hang."""

from __future__ import annotations

import subprocess
from pathlib import Path

from launch_helpers import mxtrain as run_mxtrain


def mxtrain(
    *args: object, cwd: Path, timeout: float = 120, omp_threads: str = "1"
) -> subprocess.CompletedProcess[str]:
    """launch_helpers.mxtrain with ``OMP_NUM_THREADS`` set to ``omp_threads``."""
    return run_mxtrain(*args, cwd=cwd, timeout=timeout, extra_env={"OMP_NUM_THREADS": omp_threads})


def assert_clean_refusal(result: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    assert result.returncode == code, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    for word in words:
        assert word in result.stderr, result.stderr


# -- K1 ------------------------------------------------------------------------------------------


def test_twenty_thousand_overrides_end_cleanly(tiny_config: Path) -> None:
    valid = [f"--set=fit.num_epoch={i}" for i in range(1, 20_001)]
    result = mxtrain("check", tiny_config, *valid, cwd=tiny_config.parent, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "num_epoch: 20000" in result.stdout
    unknown = [f"--set=model.k{i}=1" for i in range(20_000)]
    result = mxtrain("check", tiny_config, *unknown, cwd=tiny_config.parent, timeout=60)
    assert_clean_refusal(result, 2, "--set model.k0=1: unknown key 'model.k0'")


# -- C4 ------------------------------------------------------------------------------------------


def test_huge_thread_counts_are_refused_before_fit_starts(tiny_config: Path) -> None:
    for key, value in [("omp_threads", 1_000_000), ("engine_threads", 2**31 - 1)]:
        setting = f"context.{key}={value}"
        for command in ("check", "fit"):
            result = mxtrain(command, tiny_config, "--set", setting, cwd=tiny_config.parent)
            assert_clean_refusal(result, 2, f"context.{key} must be at most 1,024 threads")
    assert not (tiny_config.parent / "runs").exists()  # fit refused before making a run folder


def test_an_exported_huge_thread_count_is_refused(tiny_config: Path) -> None:
    result = mxtrain("fit", tiny_config, cwd=tiny_config.parent, omp_threads="1000000")
    assert_clean_refusal(result, 2, "OMP_NUM_THREADS=1000000 (exported)")
    assert not (tiny_config.parent / "runs").exists()


# -- C1: sizes check accepts must not crash later -------------------------------------------------


def test_sizes_mxnet_cannot_hold_are_refused_by_check_and_fit(tiny_config: Path) -> None:
    for setting, key in [
        ("data.train.batch_size=1e30", "data.train.batch_size must be an integer that fits"),
        ("data.train.buckets=[5, 2147483647]", "data.train.buckets must be at most 100,000"),
        ("data.train.batch_size=1.5", "data.train.batch_size must be an integer"),
        ("data.train.batch_size=.nan", "data.train.batch_size must be an integer"),
    ]:
        for command in ("check", "fit"):
            result = mxtrain(command, tiny_config, "--set", setting, cwd=tiny_config.parent)
            assert_clean_refusal(result, 2, f"--set {setting}: {key}")
    assert not (tiny_config.parent / "runs").exists()


#: settings that skip the per-machine kernel measurements, which only cost time here
QUICK = ["--set=model.loss=softmax", "--set=context.large_buffers=release"]


def test_a_graph_too_large_for_mxnet_is_refused_before_fit_runs(tiny_config: Path) -> None:
    """check cannot see it (the vocabulary and the tensor come from the data): fit refuses
    it when the model is built, before binding, and leaves no run folder."""
    sizes = ["--set=model.num_embed=1048576", "--set=data.train.batch_size=200"]
    result = mxtrain("fit", tiny_config, *sizes, *QUICK, cwd=tiny_config.parent)
    assert_clean_refusal(
        result, 2, "the tensor embed_output would be 200 x 13 x 1,048,576", "model.num_embed"
    )
    assert "data.train.batch_size" in result.stderr
    assert not (tiny_config.parent / "runs").exists()


def test_score_and_export_refuse_sizes_mxnet_cannot_hold(tiny_config: Path) -> None:
    folder = tiny_config.parent
    quick = ["--set=fit.num_epoch=1", "--set=fit.max_batches_per_epoch=2", *QUICK]
    assert mxtrain("fit", tiny_config, *quick, cwd=folder).returncode == 0
    run = folder / "runs" / "tiny"
    result = mxtrain("score", run, "--batch-size", "300000000", cwd=folder)
    assert_clean_refusal(result, 2, "--batch-size 300000000: the input data would be 300,000,000")
    result = mxtrain("score", run, "--batch-size", "1e12", cwd=folder)
    assert_clean_refusal(result, 2, "'1e12' is not a valid integer")
    out = folder / "exported"
    result = mxtrain("export", run, "-o", out, "--bucket", "1000000000000", cwd=folder)
    assert_clean_refusal(result, 2, "Invalid value for '--bucket': 1000000000000 is not in")
    big = ["--bucket", "100000", "--batch-size", "100000"]
    result = mxtrain("export", run, "-o", out, *big, cwd=folder)
    assert_clean_refusal(result, 2, "--bucket 100000 --batch-size 100000: the input data")
    assert not out.exists()  # a refused export leaves nothing behind
    assert (run / "config.yaml").is_file()  # and the run is untouched
