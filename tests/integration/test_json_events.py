"""`--json`: one JSON event per stdout line, in order, each with the fields it promises."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from mxtrain.cli.main import cli
from mxtrain.reporting import EVENT_SCHEMA_VERSION, EVENT_TYPES

REQUIRED = {
    "start": {"command", "run", "num_epoch", "environment"},
    "interval": {"epoch", "batch", "num_batches", "samples_per_s", "tokens_per_s", "lr", "train"},
    "eval": {"epoch", "batch", "eval", "seconds"},
    "checkpoint": {"tag", "epoch", "batch", "path", "best"},
    "epoch_end": {"epoch", "seconds", "samples_per_s", "train", "eval", "lr", "best"},
    "early_stop": {"epoch", "reason", "message"},
    "error": {"type", "message", "exit_code"},
    "end": {"command", "status", "exit_code", "duration_s"},
}


def events_of(stdout: str) -> list[dict[str, Any]]:
    events = [json.loads(line) for line in stdout.splitlines()]  # every line must parse
    for event in events:
        assert event["event"] in EVENT_TYPES, event
        assert event["schema_version"] == EVENT_SCHEMA_VERSION
        assert isinstance(event["time"], float)
        missing = REQUIRED[event["event"]] - set(event)
        assert not missing, (event["event"], missing)
    times = [e["time"] for e in events]
    assert times == sorted(times)
    return events


def test_fit_json_events_in_order(tiny_config: Path) -> None:
    result = CliRunner().invoke(
        cli,
        ["fit", str(tiny_config), "--json", "--set", "fit.early_stopping={patience: 1}"],
    )
    assert result.exit_code == 0, result.output
    events = events_of(result.stdout)
    kinds = [e["event"] for e in events]
    assert kinds[0] == "start" and kinds[-1] == "end"
    assert kinds.count("start") == kinds.count("end") == 1
    assert events[0]["command"] == "fit" and events[0]["environment"]["seed"] == 3
    epoch_ends = [e for e in events if e["event"] == "epoch_end"]
    assert [e["epoch"] for e in epoch_ends] == [1, 2]
    # Each epoch: its intervals, then the evaluation, the checkpoint and the summary.
    first_end = kinds.index("epoch_end")
    assert kinds[:first_end] == ["start", "interval", "interval", "interval", "eval", "checkpoint"]
    intervals = [e for e in events if e["event"] == "interval"]
    assert [(e["epoch"], e["batch"]) for e in intervals][:3] == [(1, 5), (1, 10), (1, 15)]
    assert intervals[0]["num_batches"] == 17 and intervals[0]["train"]["perplexity"] > 1
    assert epoch_ends[0]["best"] is True  # the first evaluation is the best so far
    end = events[-1]
    assert end["status"] == "finished" and end["exit_code"] == 0
    assert end["final_eval"] == epoch_ends[-1]["eval"]
    # Human output went to stderr, not into the event stream.
    assert "epoch 1 done" in result.stderr and "finished:" in result.stderr


def test_resume_json_events_and_early_stop(tiny_config: Path) -> None:
    first = CliRunner().invoke(cli, ["fit", str(tiny_config), "--quiet"])
    assert first.exit_code == 0, first.output
    run = tiny_config.parent / "runs" / "tiny"
    result = CliRunner().invoke(
        cli,
        ["resume", str(run), "--json", "--set", "fit.num_epoch=4", "--set", "fit.max_updates=40"],
    )
    assert result.exit_code == 0, result.output
    events = events_of(result.stdout)
    start, end = events[0], events[-1]
    assert start["command"] == "resume" and start["resumed_from"]["tag"] == "e0002-b000000"
    assert [e["epoch"] for e in events if e["event"] == "epoch_end"] == [3]
    stop = [e for e in events if e["event"] == "early_stop"]
    assert len(stop) == 1 and stop[0]["reason"] == "max_updates"
    assert end["status"] == "finished" and end["stop_reason"] == "max_updates"


def test_errors_become_an_error_event_then_end(tiny_config: Path) -> None:
    result = CliRunner().invoke(cli, ["fit", str(tiny_config), "--json", "--set", "fit.nope=1"])
    assert result.exit_code == 2
    events = events_of(result.stdout)
    assert [e["event"] for e in events] == ["error", "end"]
    assert events[0]["type"] == "ConfigError" and "fit.nope" in events[0]["message"]
    assert events[1]["status"] == "failed" and events[1]["exit_code"] == 2
    assert "error:" in result.stderr  # the one-paragraph message still goes to stderr
