"""tracking.mlflow end to end: a real MLflow file store, then `mlflow server` on loopback
(started and stopped by the test). The MLflow run holds the resolved config as parameters,
every number metrics.jsonl holds, tags and the best checkpoint; a resumed run continues it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from mxtrain.cli.main import cli
from mxtrain.fit.tracking import record_metrics
from mxtrain.run.folder import read_metrics

mlflow = pytest.importorskip("mlflow")


def fit(config: Path, uri: str, *sets: str) -> Path:
    tracking = f"tracking.mlflow={{uri: '{uri}', experiment: tiny}}"
    args = ["fit", str(config), "--progress", "quiet", "--set", tracking,
            "--set", "fit.num_epoch=3", "--set", "checkpoint.best_metric=perplexity"]  # fmt: skip
    for value in sets:
        args += ["--set", value]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return config.parent / "runs" / "tiny"


def expected_values(run: Path) -> Counter[str]:
    """How many values of each metric name the run's metrics.jsonl holds."""
    counts: Counter[str] = Counter()
    for record in read_metrics(run / "metrics.jsonl"):
        counts.update(record_metrics(record).keys())
    return counts


def check_run(uri: str, run: Path) -> None:
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    run_id = json.loads((run / "mlflow.json").read_text())["run_id"]
    tracked = client.get_run(run_id)
    assert tracked.info.status == "FINISHED"
    assert tracked.data.params["model.num_hidden"] == "12"
    assert tracked.data.params["optimizer.name"] == "sgd"
    assert tracked.data.tags["mxtrain.run_folder"] == str(run.absolute())
    assert "mxtrain.version" in tracked.data.tags
    expected = expected_values(run)
    assert set(tracked.data.metrics) == set(expected)
    for name, count in expected.items():
        assert len(client.get_metric_history(run_id, name)) == count, name
    artifacts = {a.path for a in client.list_artifacts(run_id, "best_checkpoint")}
    assert "best_checkpoint/config.yaml" in artifacts
    assert "best_checkpoint/params.nd" in artifacts


def test_a_file_store_gets_every_value_and_a_resumed_run_continues_it(tiny_config: Path) -> None:
    uri = (tiny_config.parent / "mlruns").as_uri()
    run = fit(tiny_config, uri, "fit.max_updates=7")  # stops inside the first epochs
    first_id = json.loads((run / "mlflow.json").read_text())["run_id"]
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    assert client.get_run(first_id).info.status == "FINISHED"  # stopped by a limit: finished
    resumed = CliRunner().invoke(
        cli, ["resume", str(run), "--set", "fit.max_updates=null", "--progress", "quiet"]
    )
    assert resumed.exit_code == 0, resumed.output
    assert json.loads((run / "mlflow.json").read_text())["run_id"] == first_id
    assert len(client.search_runs([client.get_experiment_by_name("tiny").experiment_id])) == 1
    check_run(uri, run)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_tracking_server_on_loopback_gets_the_run(tiny_config: Path) -> None:
    port = _free_port()
    store = tiny_config.parent / "server"
    store.mkdir()
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", f"sqlite:///{store / 'mlflow.db'}",
         "--artifacts-destination", str(store / "artifacts"), "--workers", "1"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
    )  # fmt: skip
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert server.poll() is None, "mlflow server exited"
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                assert time.monotonic() < deadline, "mlflow server did not start in 90 s"
                time.sleep(0.5)
        time.sleep(1.0)  # the socket accepts a little before the app answers
        run = fit(tiny_config, uri)
        check_run(uri, run)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)


def test_without_mlflow_installed_the_config_says_how_to_install_it(
    tiny_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "mlflow", None)
    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)
    monkeypatch.setitem(sys.modules, "mlflow.entities", None)
    result = CliRunner().invoke(
        cli, ["fit", str(tiny_config), "--set", "tracking.mlflow={uri: mlruns}"]
    )
    assert result.exit_code == 2 and "mxtrain[mlflow]" in result.output
