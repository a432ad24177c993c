"""Sweep planning: --grid parsing, grid and random points, point names."""

from __future__ import annotations

import pytest

from mxtrain.errors import ConfigError
from mxtrain.sweep_plan import MAX_POINTS, Axis, parse_axis, plan_points, point_name


def test_values_split_on_top_level_commas_only() -> None:
    assert parse_axis("optimizer.learning_rate=0.1, 0.01") == Axis(
        "optimizer.learning_rate", ("0.1", "0.01")
    )
    assert parse_axis("context.ids=[0,1],[2,3]").values == ("[0,1]", "[2,3]")
    assert parse_axis("experiment.name='a,b',c").values == ("'a,b'", "c")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("learning_rate", "expected KEY=V1,V2"),
        ("model.=1", "expected KEY=V1,V2"),
        ("model.dropout=0.1,,0.2", "a value is empty"),
        ("model.dropout=0.1,0.1", "listed twice"),
    ],
)
def test_bad_grids_name_the_argument(text: str, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_axis(text)
    assert str(info.value).startswith(f"--grid {text}") and says in str(info.value)


def test_a_grid_runs_every_combination_first_axis_slowest() -> None:
    axes = [Axis("a", ("1", "2")), Axis("b", ("x", "y", "z"))]
    points = plan_points(axes)
    assert points[:4] == [
        (("a", "1"), ("b", "x")),
        (("a", "1"), ("b", "y")),
        (("a", "1"), ("b", "z")),
        (("a", "2"), ("b", "x")),
    ]
    assert len(points) == 6


def test_random_points_are_distinct_reproducible_and_in_grid_order() -> None:
    axes = [Axis("a", tuple(str(i) for i in range(10))), Axis("b", ("x", "y"))]
    drawn = plan_points(axes, sample=5, seed=3)
    assert drawn == plan_points(axes, sample=5, seed=3)
    assert len(set(drawn)) == 5 and drawn == sorted(drawn, key=plan_points(axes).index)
    assert drawn != plan_points(axes, sample=5, seed=4)
    with pytest.raises(ConfigError, match="only 20 points"):
        plan_points(axes, sample=21)


def test_huge_grids_and_repeated_keys_are_refused() -> None:
    wide = Axis("a", tuple(str(i) for i in range(1000)))
    with pytest.raises(ConfigError, match=f"more than {MAX_POINTS:,}"):
        plan_points([wide, Axis("b", tuple(str(i) for i in range(11)))])
    with pytest.raises(ConfigError, match="given twice"):
        plan_points([Axis("a", ("1",)), Axis("a", ("2",))])


def test_point_names_are_valid_run_names() -> None:
    point = (("optimizer.learning_rate", "0.01"), ("data.train.source", "a/b c.txt"))
    assert point_name(7, point) == "007_learning_rate=0.01,source=a_b_c.txt"
    long = (("model.dropout", "9" * 400),)
    assert len(point_name(1, long).encode()) <= 200
