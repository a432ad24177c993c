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


@dataclass
class FullContext(Context):
    omp_wait_policy: str = "auto"
    large_buffers: str = "auto"
    work_load: str = "auto"


@pytest.mark.parametrize(
    ("busy", "policy"), [(0.0, "active"), (0.4, "active"), (0.6, "passive"), (1.0, "passive")]
)
def test_a_busy_machine_at_start_turns_spinning_threads_passive(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, busy: float, policy: str
) -> None:
    """The measured choice is 2 spinning threads on 2 cores. With another runnable thread
    at start they would share cores with it: the wait policy turns passive (it changes no
    result), the thread count stays, and config.yaml keeps the policy's ``auto``."""
    from mxtrain.engine.kernels import Choice

    for name in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "DMLC_ROLE"):
        monkeypatch.delenv(name, raising=False)
    measured = [
        Choice("context.omp_threads", "2", "cache"),
        Choice("context.omp_wait_policy", "active", "cache"),
    ]
    monkeypatch.setattr(devices, "_measured_threads", lambda *a: (2, "active", list(measured)))
    monkeypatch.setattr(devices, "usable_cores", lambda: 2)
    monkeypatch.setattr(devices, "busy_cpus", lambda: busy)
    caplog.set_level("INFO", logger="mxtrain.devices")
    threads = devices.configure_threads(FullContext(), measure=True)
    assert threads["OMP_NUM_THREADS"] == "2"
    assert threads["OMP_WAIT_POLICY"] == policy.upper()
    (wait,) = [c for c in devices.thread_choices() if c.key == "context.omp_wait_policy"]
    settled = devices.with_threads_in_force(FullContext())
    assert settled.omp_threads == 2
    if policy == "passive":
        assert (wait.value, wait.source) == ("passive", "load")
        assert f"{busy:.1f} runnable threads of other processes on 2 usable cores" in wait.why
        assert f"OMP_WAIT_POLICY=PASSIVE: {busy:.1f} runnable threads" in caplog.text
        assert settled.omp_wait_policy == "auto"  # a resume decides for its own start
    else:
        assert (wait.value, wait.source) == ("active", "cache")
        assert settled.omp_wait_policy == "active"
        assert "PASSIVE" not in caplog.text


def test_the_load_leaves_a_chosen_policy_and_one_thread_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "DMLC_ROLE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(devices, "usable_cores", lambda: 2)
    monkeypatch.setattr(devices, "busy_cpus", lambda: pytest.fail("read the load"))
    monkeypatch.setattr(devices, "_measured_threads", lambda *a: (2, "active", []))
    configured = devices.configure_threads(FullContext(omp_wait_policy="active"), measure=True)
    assert configured["OMP_WAIT_POLICY"] == "ACTIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # exported
    assert devices.configure_threads(FullContext(), measure=True)["OMP_WAIT_POLICY"] == "ACTIVE"
    monkeypatch.delenv("OMP_WAIT_POLICY")
    monkeypatch.setattr(devices, "_measured_threads", lambda *a: (1, "active", []))
    assert devices.configure_threads(FullContext(), measure=True)["OMP_WAIT_POLICY"] == "ACTIVE"


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
