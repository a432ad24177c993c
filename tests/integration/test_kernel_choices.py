"""auto kernel settings: measured once per machine, cached outside the run folder, recorded in
it (config.yaml and kernels.json), overridable, and kept by resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from mxtrain import kernel_choices
from mxtrain.cli.main import cli
from mxtrain.engine import kernels

MEASURED = ("context.large_buffers", "model.loss", "model.cell")


@pytest.fixture(autouse=True)
def measuring_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests measure: the suite's MXTRAIN_MEASURE=0 (tests/conftest.py) is taken away."""
    monkeypatch.delenv(kernels.MEASURE_ENV, raising=False)


@pytest.fixture
def figures_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """Measurements answered with set figures, no child process, each won by a value other
    than the fallback: for the tests of what happens around measuring (the real child is
    test_auto_is_measured_once_cached_and_recorded's)."""

    def measure(request: dict, env: dict | None = None) -> dict[str, float]:
        if request["kind"] == "loss":
            figures = {"softmax": 4.0, "log_softmax": 3.0, "softmax_output": 5.0}
            if not request.get("probabilities"):
                figures["one_pass"] = 2.0
            return figures
        if request["kind"] == "cell":
            return {"fused": 2.0, "unfused": 1.0}
        if request["kind"] == "buffers":
            policy = request["large_buffers"]
            return {policy: 1.0 if policy == "reuse" else 2.0}
        raise AssertionError(f"not expected to be measured: {request}")

    monkeypatch.setattr(kernel_choices, "measure_in_child", measure)


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def fit(config: Path, name: str, *sets: str) -> Path:
    argv = ["fit", str(config), "--name", name, "--progress", "plain"]
    for item in sets:
        argv += ["--set", item]
    code, out = invoke(*argv)
    assert code == 0, out
    return config.parent / "runs" / name


def recorded(run: Path) -> dict[str, dict]:
    return {c["key"]: c for c in json.loads((run / "kernels.json").read_text())["choices"]}


def test_auto_is_measured_once_cached_and_recorded(
    tiny_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("MXTRAIN_CACHE_DIR", str(cache))
    monkeypatch.setattr(kernels, "busy_cpus", lambda: 0.0)  # a quiet machine
    first = fit(tiny_config, "first", "model.cell=auto")
    choices = recorded(first)
    assert sorted(choices) == sorted(MEASURED)
    for key in MEASURED:
        assert choices[key]["source"] == "measured", choices[key]
        figures = choices[key]["figures_ms"]
        assert choices[key]["value"] == min(figures, key=figures.get)
        assert all(ms > 0 for ms in figures.values())
    assert set(choices["model.loss"]["figures_ms"]) == {
        "softmax",
        "log_softmax",
        "softmax_output",
        "one_pass",
    }
    assert set(choices["model.cell"]["figures_ms"]) == {"fused", "unfused"}
    assert set(choices["context.large_buffers"]["figures_ms"]) == {"reuse", "release"}
    machine = json.loads((first / "kernels.json").read_text())["machine"]
    assert {"cpu", "isa", "mxnet", "mxtrain", "omp_threads", "device"} <= set(machine)
    # config.yaml records the values themselves: resume, score and predict rebuild this graph
    saved = yaml.safe_load((first / "config.yaml").read_text())
    assert saved["model"]["loss"] == choices["model.loss"]["value"]
    assert saved["model"]["cell"] == choices["model.cell"]["value"]
    assert saved["context"]["large_buffers"] == choices["context.large_buffers"]["value"]
    log = (first / "train.log").read_text()
    for key in MEASURED:
        assert f"kernel choice {key}={choices[key]['value']} (measured: " in log
    # the cache lives outside the run folder and answers the next run on this machine
    cached = json.loads((cache / "kernels.json").read_text())
    assert len(cached["machines"]) == 1
    second = fit(tiny_config, "second", "model.cell=auto")
    again = recorded(second)
    for key in MEASURED:
        assert again[key]["source"] == "cache"
        assert again[key]["value"] == choices[key]["value"]
        assert again[key]["figures_ms"] == choices[key]["figures_ms"]


def test_explicit_values_are_not_measured(
    tiny_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MXTRAIN_CACHE_DIR", str(tmp_path / "cache"))

    def refuse(request):  # pragma: no cover - failing is the point
        raise AssertionError(f"measured {request}")

    monkeypatch.setattr(kernel_choices, "measure_in_child", refuse)
    run = fit(
        tiny_config,
        "explicit",
        "model.loss=log_softmax",
        "model.cell=fused",
        "context.large_buffers=release",
    )
    choices = recorded(run)
    assert {k: (c["value"], c["source"]) for k, c in choices.items()} == {
        "model.loss": ("log_softmax", "config"),
        "model.cell": ("fused", "config"),
        "context.large_buffers": ("release", "config"),
    }
    assert not (tmp_path / "cache").exists()


def test_a_failed_measurement_falls_back_and_says_why(
    tiny_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MXTRAIN_CACHE_DIR", str(tmp_path / "cache"))

    def broken(request):
        raise RuntimeError("exit code 1: out of memory")

    monkeypatch.setattr(kernel_choices, "measure_in_child", broken)
    run = fit(tiny_config, "fallback", "model.cell=auto")
    choices = recorded(run)
    assert choices["model.loss"]["value"] == "softmax"
    assert choices["model.cell"]["value"] == "fused"
    assert choices["context.large_buffers"]["value"] == "release"
    for key in MEASURED:
        assert choices[key]["source"] == "fallback"
        assert "out of memory" in choices[key]["why"]
    log = (run / "train.log").read_text()
    assert "the measurement failed (exit code 1: out of memory); using softmax" in log
    # the failure is this machine's answer until the user measures again: the next run
    # neither measures nor computes differently
    monkeypatch.setattr(kernel_choices, "measure_in_child", lambda request: pytest.fail("measured"))
    again = recorded(fit(tiny_config, "fallback-again", "model.cell=auto"))
    for key in MEASURED:
        assert again[key]["source"] == "cache"
        assert again[key]["value"] == choices[key]["value"]
        assert "out of memory" in again[key]["why"]


@pytest.mark.usefixtures("figures_given")
def test_an_unusable_cache_costs_a_measurement_not_the_run(
    tiny_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "kernels.json").write_text("{not json")
    monkeypatch.setenv("MXTRAIN_CACHE_DIR", str(cache))
    run = fit(tiny_config, "corrupt")
    assert recorded(run)["model.loss"]["source"] == "measured"
    assert json.loads((cache / "kernels.json").read_text())["version"] == kernels.CACHE_VERSION
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv("MXTRAIN_CACHE_DIR", str(blocked / "sub"))  # cannot be created
    monkeypatch.setattr(kernel_choices, "measure_in_child", lambda request: pytest.fail("measured"))
    run = fit(tiny_config, "unwritable")
    # a choice no later run could see would differ from run to run: the fallback, unmeasured
    assert "could not write the kernel cache" in (run / "train.log").read_text()
    choices = recorded(run)
    assert choices["model.loss"]["source"] == "fallback"
    assert choices["model.loss"]["value"] == "softmax"


@pytest.mark.usefixtures("figures_given")
def test_resume_keeps_the_recorded_choices_and_never_measures(
    tiny_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resumed run continues with its recorded graph: bit-identical to training through."""
    monkeypatch.setenv("MXTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    straight = fit(tiny_config, "straight", "model.cell=auto", "fit.num_epoch=2")
    stopped = fit(tiny_config, "stopped", "model.cell=auto", "fit.num_epoch=1")

    def refuse(request):  # pragma: no cover - failing is the point
        raise AssertionError(f"measured {request}")

    monkeypatch.setattr(kernel_choices, "measure_in_child", refuse)
    before = (stopped / "kernels.json").read_text()
    code, out = invoke("resume", str(stopped), "--set", "fit.num_epoch=2", "--progress", "plain")
    assert code == 0, out
    assert (stopped / "kernels.json").read_text() == before  # the fresh run's record is kept
    values = {k: c["value"] for k, c in recorded(stopped).items()}
    assert values == {k: c["value"] for k, c in recorded(straight).items()}
    # none of them the fallback, which a run without measuring would compute with too
    assert values == {
        "model.loss": "one_pass",
        "model.cell": "unfused",
        "context.large_buffers": "reuse",
    }
    import mxnet as mx

    a = mx.nd.load(str(straight / "model-0002.params"))
    b = mx.nd.load(str(stopped / "model-0002.params"))
    assert sorted(a) == sorted(b)
    for name in a:
        assert (a[name].asnumpy() == b[name].asnumpy()).all(), name


def test_thread_candidates() -> None:
    assert kernels.thread_candidates(1) == [1]
    assert kernels.thread_candidates(2) == [1, 2]
    assert kernels.thread_candidates(6) == [1, 2, 4, 6]
    assert kernels.thread_candidates(16) == [1, 2, 4, 8, 16]


def _clear_openmp_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset both variables for this test; monkeypatch puts the originals back after it."""
    for name in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY"):
        monkeypatch.setenv(name, "1")
        monkeypatch.delenv(name)


@pytest.mark.usefixtures("figures_given")
def test_openmp_settings_are_measured_kept_and_recorded_whatever_the_load(
    tiny_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mxtrain import devices

    monkeypatch.setenv("MXTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    _clear_openmp_environment(monkeypatch)
    monkeypatch.setattr(devices, "usable_cores", lambda: 4)
    monkeypatch.setattr(devices, "busy_cpus", lambda: 3.0)  # busy: ignored all the same
    monkeypatch.setattr(kernels, "busy_cpus", lambda: 0.0)  # measured quietly
    asked = []

    def fake(threads: int, policy: str) -> float:  # 4 threads, passive is fastest
        asked.append((threads, policy))
        return 100.0 / threads + (0 if policy == "passive" else 5)

    monkeypatch.setattr(kernel_choices, "measure_threads", fake)
    run = fit(tiny_config, "threads")
    assert sorted(asked) == [(n, p) for n in (1, 2, 4) for p in ("active", "passive")]
    choices = recorded(run)
    assert choices["context.omp_threads"]["value"] == "4"
    assert choices["context.omp_threads"]["figures_ms"]["4 passive"] == 25.0
    assert choices["context.omp_wait_policy"]["value"] == "passive"
    # the count rounds differently from the next one: it does not follow the load; config.yaml
    # records what ran, so a resume runs the same threads
    saved = yaml.safe_load((run / "config.yaml").read_text())["context"]
    assert (saved["omp_threads"], saved["omp_wait_policy"]) == (4, "passive")
    status = json.loads((run / "run.json").read_text())
    assert "4 chosen for this machine" in status["threads"]["omp_threads_auto"]
    # the next run reads the cache
    _clear_openmp_environment(monkeypatch)
    asked.clear()
    again = recorded(fit(tiny_config, "threads-again"))
    assert asked == []
    assert again["context.omp_threads"]["source"] == "cache"


@pytest.mark.usefixtures("figures_given")
def test_exported_or_configured_openmp_settings_are_kept(
    tiny_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mxtrain import devices

    monkeypatch.setenv("MXTRAIN_CACHE_DIR", str(tmp_path / "cache"))

    def refuse(threads: int, policy: str) -> float:  # pragma: no cover - failing is the point
        raise AssertionError("measured")

    monkeypatch.setattr(kernel_choices, "measure_threads", refuse)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # as conftest exports it
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    run = fit(tiny_config, "exported")  # one thread: no team whose waiting could matter
    assert "context.omp_threads" not in recorded(run)
    assert yaml.safe_load((run / "config.yaml").read_text())["context"]["omp_threads"] == 1
    _clear_openmp_environment(monkeypatch)
    monkeypatch.setattr(devices, "usable_cores", lambda: 2)
    run = fit(tiny_config, "configured", "context.omp_threads=1", "context.omp_wait_policy=active")
    assert "context.omp_threads" not in recorded(run)
    _clear_openmp_environment(monkeypatch)
    monkeypatch.setenv("DMLC_ROLE", "worker")  # a distributed process never measures
    assert devices._measured_threads(devices_config(tiny_config)) is None


def devices_config(config: Path):
    from mxtrain.config import load_config

    return load_config(config).context


def test_a_kept_choice_is_never_measured_again_because_the_load_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = kernels.KernelCache(tmp_path / "kernels.json")
    load = {"now": 1.5}
    monkeypatch.setattr(kernels, "busy_cpus", lambda: load["now"])
    measured = []

    def measure() -> dict[str, float]:
        measured.append(load["now"])
        if load["now"]:
            return {"softmax": 10.0, "log_softmax": 20.0}
        return {"softmax": 10.0, "log_softmax": 5.0}

    first = kernels.decide(cache, "machine", "model.loss", measure, "softmax")
    assert (first.source, first.value) == ("measured", "softmax")
    assert cache.get("machine", "model.loss")["load"] == 1.5
    for now in (0.0, 3.0, 0.0):  # quiet, busier, quiet again: the choice stands
        load["now"] = now
        again = kernels.decide(
            kernels.KernelCache(tmp_path / "kernels.json"), "machine", "model.loss", measure, "x"
        )
        assert (again.source, again.value) == ("cache", "softmax")
    assert measured == [1.5]
    # only the user's request measures again
    renewed = kernels.decide(cache, "machine", "model.loss", measure, "x", remeasure=True)
    assert (renewed.source, renewed.value) == ("measured", "log_softmax")
    assert measured == [1.5, 0.0]
    # another machine key (another CPU, MXNet or mxtrain version) measures for itself
    other = kernels.decide(cache, "other machine", "model.loss", measure, "x")
    assert other.source == "measured"


_RACER = """
import json, sys, time
from pathlib import Path
from mxtrain.engine import kernels
def measure():
    with open(sys.argv[2], "a") as f:
        f.write("measured\\n")
    time.sleep(1.0)
    return {sys.argv[3]: 1.0, "other": 2.0}
cache = kernels.KernelCache(Path(sys.argv[1]))
print(kernels.decide(cache, "machine", "model.loss", measure, "fallback").value)
"""


def test_runs_starting_together_agree_on_one_measurement(tmp_path: Path) -> None:
    """Two processes deciding at once: the second waits for the first's choice."""
    import subprocess
    import sys

    log = tmp_path / "measured.txt"
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, str(tmp_path / "kernels.json"), str(log), name],
            stdout=subprocess.PIPE,
            text=True,
        )
        for name in ("first", "second")
    ]
    try:
        values = {racer.communicate(timeout=120)[0].strip() for racer in racers}
    finally:
        for racer in racers:
            if racer.poll() is None:
                racer.kill()
    assert log.read_text().splitlines() == ["measured"]
    assert len(values) == 1 and values <= {"first", "second"}


def test_measuring_off_takes_every_fallback_and_leaves_the_cache_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = kernels.KernelCache(tmp_path / "kernels.json")
    monkeypatch.setattr(kernels, "busy_cpus", lambda: 0.0)
    kept = kernels.decide(cache, "machine", "model.loss", lambda: {"log_softmax": 1.0}, "x")
    assert (kept.source, kept.value) == ("measured", "log_softmax")
    before = (tmp_path / "kernels.json").read_text()
    monkeypatch.setenv(kernels.MEASURE_ENV, "0")

    def refuse() -> dict[str, float]:
        raise AssertionError("measured with MXTRAIN_MEASURE=0")

    for key in ("model.loss", "model.cell"):  # kept or not: the fallback
        off = kernels.decide(cache, "machine", key, refuse, "softmax")
        assert (off.source, off.value, off.figures) == ("fallback", "softmax", {})
        assert "MXTRAIN_MEASURE=0" in off.why
    assert (tmp_path / "kernels.json").read_text() == before


def test_a_run_with_measuring_off_records_its_fallbacks(
    tiny_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MXTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(kernels.MEASURE_ENV, "0")
    monkeypatch.setattr(kernel_choices, "measure_in_child", lambda request: pytest.fail("measured"))
    run = fit(tiny_config, "off", "model.cell=auto")
    choices = recorded(run)
    for key in MEASURED:
        assert choices[key]["source"] == "fallback", choices[key]
        assert "MXTRAIN_MEASURE=0" in choices[key]["why"]
    assert not (tmp_path / "cache" / "kernels.json").exists()
