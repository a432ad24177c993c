"""`mxtrain lr-find`: the learning-rate range test from a config, to a PNG, no run folder."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from mxtrain.cli.main import cli
from mxtrain.engine.lr_range import RangePoint, lr_range_test, rates, suggest


def invoke(*args: object):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_the_sweep_draws_the_loss_and_suggests_a_rate_without_a_run_folder(
    tiny_config: Path,
) -> None:
    output = tiny_config.parent / "lr.png"
    result = invoke(
        "lr-find", tiny_config, "--updates", 40, "--start-lr", 1e-4, "--end-lr", 100,
        "-o", output, "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert output.read_bytes().startswith(b"\x89PNG")
    assert not (tiny_config.parent / "runs").exists()  # nothing written to any run folder
    found = json.loads(result.output.strip().splitlines()[-1])
    points = found["points"]
    assert 5 <= len(points) <= 40 and points[0]["lr"] == pytest.approx(1e-4)
    growth = [b["lr"] / a["lr"] for a, b in itertools.pairwise(points)]
    assert growth == pytest.approx([(100 / 1e-4) ** (1 / 39)] * len(growth))
    assert found["stopped"] in (None, "diverged")
    assert len(points) == 40 if found["stopped"] is None else len(points) < 40
    assert found["suggested_lr"] is None or 1e-4 <= found["suggested_lr"] <= 100
    assert "suggested learning rate" in result.output or "no suggestion" in result.output
    # the same config, seed and machine give the same sweep
    again = invoke(
        "lr-find", tiny_config, "--updates", 40, "--start-lr", 1e-4, "--end-lr", 100,
        "-o", output, "--force", "--json",
    )  # fmt: skip
    assert json.loads(again.output.strip().splitlines()[-1]) == found


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--start-lr", "1", "--end-lr", "0.1"], "must be below --end-lr"),
        (["--updates", "2"], "--updates"),
        (["--set", "kvstore.type=dist_sync"], "lr-find runs in one process"),
        (["-o", "lr.txt"], "PNG"),
    ],
)
def test_bad_arguments_are_refused_before_any_training(
    tiny_config: Path, args: list[str], says: str
) -> None:
    result = invoke("lr-find", tiny_config, *args)
    assert result.exit_code == 2 and says in result.output
    assert "Traceback" not in result.output


def test_the_suggestion_is_the_steepest_descent_before_the_lowest_loss() -> None:
    lrs = rates(1e-3, 1.0, 31)
    # falls slowly, then fast around lr 0.03 (index 15), bottoms at index 24, then rises
    losses = [
        3.0 - 0.01 * i if i < 13 else 2.88 - 0.3 * (i - 12) if i < 17 else 1.7 - 0.01 * (i - 16)
        for i in range(25)
    ] + [2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    points = [
        RangePoint(i + 1, lr, loss, loss)
        for i, (lr, loss) in enumerate(zip(lrs, losses, strict=True))
    ]
    best = suggest(points)
    assert best is not None and lrs[12] <= best <= lrs[16]
    assert suggest(points[:4]) is None  # too few points to say


class _FakeMetric:
    def __init__(self) -> None:
        self.value = 0.0

    def get(self) -> dict[str, float]:
        return {"perplexity": self.value}


class _FakeModule:
    """A model whose loss is the rate itself once it passes 1: it diverges there."""

    def __init__(self) -> None:
        self.optimizer = self
        self.lr = 0.0

    def set_learning_rate(self, lr: float) -> None:
        self.lr = lr

    def forward_backward(self, batch: object) -> None:
        pass

    def update_metric(self, metric: _FakeMetric, labels: object) -> None:
        metric.value = float(np.exp(2.0 + max(0.0, self.lr - 1.0) * 10))

    def update(self) -> None:
        pass


class _Batches:
    def __init__(self) -> None:
        self.label = None

    def reset(self) -> None:
        pass

    def __iter__(self):
        return iter([self, self])


def test_the_sweep_stops_once_the_smoothed_loss_diverges() -> None:
    points, stopped = lr_range_test(
        _FakeModule(), _Batches(), _FakeMetric, start=0.01, end=100.0, updates=60, seed=1
    )
    assert stopped == "diverged" and len(points) < 60
    assert points[-1].smoothed > 4 * min(p.smoothed for p in points)
    assert points[-1].lr > 1.0
