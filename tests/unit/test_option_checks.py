"""The checks every options class shares raise InvalidValue naming their key."""

from __future__ import annotations

import pytest

from mxtrain.errors import InvalidValue
from mxtrain.option_checks import (
    check_at_least,
    check_greater_than_zero,
    check_positive_int,
    check_sharding,
    not_int,
)


def test_not_int_refuses_bools_and_floats() -> None:
    assert not not_int(3) and not_int(True) and not_int(3.0) and not_int("3")


@pytest.mark.parametrize("value", [0, -1, 2.0, True, "4", None])
def test_positive_int(value: object) -> None:
    with pytest.raises(InvalidValue) as caught:
        check_positive_int("batch_size", value)
    assert caught.value.key == "batch_size"
    assert str(caught.value) == f"batch_size must be a positive integer, not {value!r}"
    check_positive_int("batch_size", 1)


def test_numbers_above_and_at_least() -> None:
    check_greater_than_zero("lr", None)  # not set
    check_greater_than_zero("lr", 1e-9)
    with pytest.raises(InvalidValue, match="lr must be greater than 0, got 0"):
        check_greater_than_zero("lr", 0)
    check_at_least("momentum", 0.0, 0)
    with pytest.raises(InvalidValue, match=r"must be at least 0, got -0\.1"):
        check_at_least("momentum", -0.1, 0)


@pytest.mark.parametrize(
    ("parts", "index", "key"), [(0, 0, "num_parts"), (2, 2, "part_index"), (2, -1, "part_index")]
)
def test_sharding(parts: int, index: int, key: str) -> None:
    with pytest.raises(InvalidValue) as caught:
        check_sharding(parts, index)
    assert caught.value.key == key
    check_sharding(3, 2)
    with pytest.raises(InvalidValue, match=r"part_index must be in 0\.\.1 \(num_parts is 2\)"):
        check_sharding(2, True)
