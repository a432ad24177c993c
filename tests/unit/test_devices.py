"""context.omp_threads: auto takes the usable cores (the free ones in a distributed process);
explicit and exported values win."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from mxtrain import devices


@dataclass
class Context:
    omp_threads: int | str = "auto"
    engine_threads: int | str = "auto"


@pytest.mark.parametrize(
    ("cores", "busy", "threads"),
    [(2, 0.0, 2), (2, 0.4, 2), (2, 1.0, 1), (2, 4.0, 1), (16, 3.6, 12), (1, 0.0, 1)],
)
def test_a_distributed_process_takes_the_free_cores(cores: int, busy: float, threads: int) -> None:
    assert devices.auto_omp_threads(cores, busy) == threads


def test_auto_is_the_usable_cores_whatever_the_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """The thread count changes float rounding: it must not follow the load."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("DMLC_ROLE", raising=False)
    monkeypatch.setattr(devices, "usable_cores", lambda: 2)
    monkeypatch.setattr(devices, "busy_cpus", lambda: pytest.fail("read the load"))
    threads = devices.configure_threads(Context())
    assert threads["OMP_NUM_THREADS"] == "2"
    assert threads["omp_threads_auto"] == "2 usable cores"


def test_a_distributed_process_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("DMLC_ROLE", "worker")
    monkeypatch.setattr(devices, "usable_cores", lambda: 2)
    monkeypatch.setattr(devices, "busy_cpus", lambda: 4.0)
    threads = devices.configure_threads(Context())
    assert threads["OMP_NUM_THREADS"] == "1"
    assert threads["omp_threads_auto"] == (
        "distributed process: 2 usable cores, 4.0 busy with others"
    )


def test_exported_and_explicit_threads_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "busy_cpus", lambda: pytest.fail("measured needlessly"))
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert devices.configure_threads(Context()) == {"OMP_NUM_THREADS": "3"}
    assert devices.configure_threads(Context(omp_threads=2))["OMP_NUM_THREADS"] == "2"


def test_busy_cpus_reads_a_number() -> None:
    busy = devices.busy_cpus(samples=2, interval=0.0)
    assert busy >= 0.0
    assert devices.usable_cores() >= 1


def test_a_thread_change_after_mxnet_loaded_is_said(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """OpenMP reads OMP_NUM_THREADS when MXNet loads: a later change must not pass unseen."""
    import sys

    monkeypatch.setitem(sys.modules, "mxnet", sys.modules.get("mxnet", object()))
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    with caplog.at_level("WARNING", logger="mxtrain.devices"):
        devices.configure_threads(Context(omp_threads=3))  # unchanged: nothing to say
        assert not caplog.records
        devices.configure_threads(Context(omp_threads=1))
    assert "MXNet was imported before" in caplog.text and "OMP_NUM_THREADS=3" in caplog.text
