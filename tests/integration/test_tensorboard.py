"""logging.tensorboard: event files with the run's scalars, and a clear error without the writer."""

from __future__ import annotations

import builtins
import struct
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from mxtrain.cli.main import cli


def read_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] from every TFRecord event file in ``folder``."""
    from tensorboardX.proto import event_pb2

    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        at = 0
        while at < len(data):
            (length,) = struct.unpack("<Q", data[at : at + 8])
            record = data[at + 12 : at + 12 + length]  # skip the length's CRC
            at += 12 + length + 4  # and the record's CRC
            event = event_pb2.Event.FromString(record)
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def test_fit_writes_train_and_eval_scalars(tiny_config: Path) -> None:
    args = ["fit", str(tiny_config), "--set", "logging.tensorboard=true", "--progress", "plain"]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    scalars = read_scalars(tiny_config.parent / "runs" / "tiny" / "tensorboard")
    assert {"train/perplexity", "train/lr", "eval/perplexity", "speed/samples_per_s"} <= set(
        scalars
    )
    # two epochs of 17 batches, log_interval 5: steps are update counts, increasing
    steps = [step for step, _ in scalars["train/perplexity"]]
    assert steps == sorted(steps) and steps[0] == 5 and len(steps) == 6
    evals = scalars["eval/perplexity"]
    assert [s for s, _ in evals] == [17, 34]
    assert all(0 < v < 100 for _, v in evals)


def test_missing_writer_is_a_config_error_before_the_run_folder(
    tiny_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_import = builtins.__import__

    def no_tensorboardx(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("tensorboardX"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensorboardx)
    result = CliRunner().invoke(cli, ["fit", str(tiny_config), "--set", "logging.tensorboard=true"])
    assert result.exit_code == 2, result.output
    assert "tensorboardX" in result.output and "mxtrain[tensorboard]" in result.output
    assert "Traceback" not in result.output
    assert not (tiny_config.parent / "runs" / "tiny").exists()
