"""Reading runs back: summaries of hand-made run folders, best values, curves, sparklines."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from mxtrain.config.saved import read_config_tree
from mxtrain.errors import ConfigError, RunFolderError
from mxtrain.formatting import format_duration
from mxtrain.run.history import (
    SPARK_BLOCKS,
    best_value,
    epoch_rows,
    find_runs,
    list_checkpoint_info,
    load_run,
    metric_curves,
    resolve_run,
    sparkline,
)

CONFIG = """\
experiment: {{name: x, seed: 1, runs_dir: runs}}
fit: {{num_epoch: 4, metrics: [{metrics}]}}
checkpoint: {{best_metric: {best}, best_mode: {mode}}}
"""


def epoch_record(epoch: int, train: dict[str, float], evals: dict[str, float] | None) -> dict:
    return {"event": "epoch", "epoch": epoch, "batch": 10, "train": train, "eval": evals}


def make_run(
    root: Path,
    name: str,
    *,
    status: dict[str, Any] | None,
    records: list[dict[str, Any]] = (),  # type: ignore[assignment]
    metrics: str = "perplexity",
    best: str = "null",
    mode: str = "auto",
) -> Path:
    """A run folder as `mxtrain fit` leaves it (no MXNet needed)."""
    path = root / name
    path.mkdir(parents=True)
    if status is not None:
        (path / "run.json").write_text(json.dumps(status))
    (path / "config.yaml").write_text(CONFIG.format(metrics=metrics, best=best, mode=mode))
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_sparkline_scales_between_min_and_max() -> None:
    assert sparkline([1.0, 2.0, 3.0]) == SPARK_BLOCKS[0] + SPARK_BLOCKS[4] + SPARK_BLOCKS[-1]
    assert sparkline([5.0, 1.0]) == SPARK_BLOCKS[-1] + SPARK_BLOCKS[0]
    assert sparkline([2.0, 2.0]) == SPARK_BLOCKS[4] * 2
    assert sparkline([1.0, None, float("nan"), 0.0]) == SPARK_BLOCKS[-1] + "  " + SPARK_BLOCKS[0]
    assert sparkline([]) == ""


def test_best_value_follows_the_metric_direction_and_best_mode() -> None:
    rows = epoch_rows(
        [
            epoch_record(
                1, {"perplexity": 90.0, "accuracy": 0.2}, {"perplexity": 80.0, "accuracy": 0.3}
            ),
            epoch_record(
                2, {"perplexity": 70.0, "accuracy": 0.4}, {"perplexity": 60.0, "accuracy": 0.5}
            ),
            epoch_record(
                3, {"perplexity": 65.0, "accuracy": 0.45}, {"perplexity": 75.0, "accuracy": 0.2}
            ),
        ]
    )
    lower = best_value({"fit": {"metrics": ["perplexity"]}}, rows)
    assert lower is not None and (lower.metric, lower.split, lower.value, lower.epoch) == (
        "perplexity",
        "eval",
        60.0,
        2,
    )
    higher = best_value({"checkpoint": {"best_metric": "accuracy"}}, rows)
    assert higher is not None and (higher.value, higher.epoch) == (0.5, 2)
    forced_min = best_value({"checkpoint": {"best_metric": "accuracy", "best_mode": "min"}}, rows)
    assert forced_min is not None and (forced_min.value, forced_min.epoch) == (0.2, 3)
    # no eval data: judged on the train values
    train_only = epoch_rows([epoch_record(1, {"perplexity": 9.0}, None)])
    best = best_value(None, train_only)
    assert best is not None and (best.split, best.value) == ("train", 9.0)


def test_find_runs_lists_every_status_newest_first_and_survives_damage(tmp_path: Path) -> None:
    now = time.time()
    make_run(
        tmp_path,
        "done",
        status={"status": "finished", "started": now - 500, "ended": now - 400},
        records=[
            epoch_record(e, {"perplexity": 50.0 - e}, {"perplexity": 40.0 - e}) for e in (1, 2)
        ],
    )
    make_run(
        tmp_path,
        "live",
        status={"status": "running", "started": now - 60},
        records=[{"event": "interval", "epoch": 1, "batch": 5, "train": {"perplexity": 99.0}}],
    )
    make_run(
        tmp_path, "crashed", status={"status": "failed", "started": now - 1000, "ended": now - 990}
    )
    broken = make_run(tmp_path, "broken", status=None)
    (broken / "run.json").write_text('{"status": "fini')  # torn write from another tool
    (tmp_path / "notes").mkdir()  # not a run: skipped
    make_run(tmp_path, ".done.replaced-20260101-000000", status={"status": "finished"})

    runs = find_runs(tmp_path)
    listed = time.time()
    by_name = {run.name: run for run in runs}
    assert set(by_name) == {"done", "live", "crashed", "broken"}
    assert [run.name for run in runs if run.started is not None] == ["live", "done", "crashed"]
    assert by_name["done"].status == "finished"
    assert (by_name["done"].epochs_done, by_name["done"].num_epoch) == (2, 4)
    assert by_name["done"].best is not None and by_name["done"].best.value == 38.0
    assert by_name["done"].duration_s == pytest.approx(100.0)
    assert by_name["live"].status == "running" and by_name["live"].epochs_done == 0
    # a running run counts to the time it is listed: between 60 s and 60 s plus the time this
    # test took, however slow the machine (1 ms covers the rounding of epoch seconds)
    assert 60.0 - 1e-3 <= by_name["live"].duration_s <= listed - now + 60.0 + 1e-3
    assert by_name["crashed"].status == "failed"
    assert by_name["broken"].status == "unreadable"
    assert "run.json is not valid JSON" in (by_name["broken"].problem or "")
    # the JSON form is plain data
    json.dumps([run.to_json() for run in runs])


def test_find_runs_on_a_missing_folder_says_so(tmp_path: Path) -> None:
    with pytest.raises(RunFolderError, match="does not exist"):
        find_runs(tmp_path / "nope")


def test_resolve_run_by_path_or_by_name(tmp_path: Path) -> None:
    path = make_run(tmp_path / "runs", "exp", status={"status": "finished"})
    assert resolve_run(str(path)) == path
    assert resolve_run("exp", tmp_path / "runs") == tmp_path / "runs" / "exp"
    with pytest.raises(RunFolderError, match="not found"):
        resolve_run("other", tmp_path / "runs")
    with pytest.raises(RunFolderError, match="not a run folder"):
        resolve_run(str(tmp_path))


def test_load_run_reads_checkpoints_with_best_marker_and_sizes(tmp_path: Path) -> None:
    path = make_run(tmp_path, "exp", status={"status": "finished"})
    for tag, size in (("e0001-b000000", 10), ("e0002-b000000", 30), ("e0002-b000007", 5)):
        folder = path / "checkpoints" / tag
        folder.mkdir(parents=True)
        (folder / "params.nd").write_bytes(b"x" * size)
    (path / "checkpoints" / ".tmp-e0003-b000000-1").mkdir()  # unfinished: ignored
    (path / "checkpoints" / "best").write_text("e0002-b000000\n")
    info = list_checkpoint_info(path)
    assert [(c.tag, c.epoch, c.batch, c.size_bytes, c.best) for c in info] == [
        ("e0001-b000000", 1, 0, 10, False),
        ("e0002-b000000", 2, 0, 30, True),
        ("e0002-b000007", 2, 7, 5, False),
    ]
    assert load_run(path).checkpoints == info


def test_load_run_with_a_corrupt_config_still_loads(tmp_path: Path) -> None:
    path = make_run(tmp_path, "exp", status={"status": "finished"})
    (path / "config.yaml").write_text("fit: [unclosed\n")
    details = load_run(path)
    assert details.config is None
    assert "config.yaml:2" in (details.config_problem or "")


def test_metric_curves_place_intervals_within_their_epoch() -> None:
    records = [
        {"event": "interval", "epoch": 1, "batch": 5, "train": {"perplexity": 9.0}},
        {"event": "interval", "epoch": 1, "batch": 10, "train": {"perplexity": 8.0}},
        {"event": "eval", "epoch": 1, "batch": 5, "eval": {"perplexity": 8.5}},
        epoch_record(1, {"perplexity": 8.4}, {"perplexity": 7.9}),
        {"event": "interval", "epoch": 2, "batch": 5, "train": {"perplexity": 7.0}},
    ]
    curves = {curve.split: curve for curve in metric_curves(records, "perplexity")}
    assert curves["train"].x == [0.5, 1.0, 1.5] and curves["train"].y == [9.0, 8.0, 7.0]
    assert curves["eval"].x == [0.5, 1.0] and curves["eval"].y == [8.5, 7.9]
    assert metric_curves(records, "accuracy") == []
    # without interval records the epoch values make the train curve
    only_epochs = metric_curves([epoch_record(1, {"f1": 0.5}, None)], "f1")
    assert [(c.split, c.x, c.y) for c in only_epochs] == [("train", [1.0], [0.5])]


def test_format_duration() -> None:
    assert [format_duration(s) for s in (None, 5, 65, 3725, 90000)] == [
        "-",
        "5s",
        "1m05s",
        "1h02m",
        "1d01h",
    ]


def test_read_config_tree_keeps_plain_values_and_names_the_line(tmp_path: Path) -> None:
    good = tmp_path / "c.yaml"
    good.write_text("fit:\n  num_epoch: 3\n  metrics: [perplexity]\nmodel: {name: custom.mod:fn}\n")
    assert read_config_tree(good) == {
        "fit": {"num_epoch": 3, "metrics": ["perplexity"]},
        "model": {"name": "custom.mod:fn"},
    }
    bad = tmp_path / "bad.yaml"
    bad.write_text("fit:\n  num_epoch: 3\n   metrics: x\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml:3"):
        read_config_tree(bad)
