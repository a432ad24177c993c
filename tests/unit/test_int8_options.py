"""--int8's pieces that need no model: options, devices, the kept ranges, the sample."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mxtrain.errors import ConfigError
from mxtrain.inference.int8 import (
    Int8Options,
    _evenly_spread,
    _stored_ranges,
    check_int8_devices,
)


def test_options_and_devices() -> None:
    with pytest.raises(ConfigError, match="--calibration-batches must be a positive integer"):
        Int8Options(calibration_batches=0)
    with pytest.raises(ConfigError, match="runs on CPUs") as caught:
        check_int8_devices(["cpu(0)", "gpu(1)"])
    assert "gpu(1)" in caught.value.message


def test_kept_ranges_are_reused_only_for_the_same_checkpoint_data_and_sample(
    tmp_path: Path,
) -> None:
    kept = tmp_path / "e0001.json"
    record = {
        "format": 1,
        "params_sha256": "abc",
        "calibration_data": "data.train",
        "calibration_batches": 20,
        "ranges": {"data": [-1.0, 2.0]},
    }
    kept.write_text(json.dumps(record))
    assert _stored_ranges(kept, "abc", "data.train", 20) == {"data": (-1.0, 2.0)}
    assert _stored_ranges(kept, "abd", "data.train", 20) is None
    assert _stored_ranges(kept, "abc", "other.txt", 20) is None
    assert _stored_ranges(kept, "abc", "data.train", 5) is None
    kept.write_text("{not json")
    assert _stored_ranges(kept, "abc", "data.train", 20) is None
    assert _stored_ranges(tmp_path / "missing.json", "abc", "data.train", 20) is None


class _Batches:
    def __init__(self, count: int) -> None:
        self.count = count

    def reset(self) -> None:
        pass

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(range(self.count))


def test_the_sample_is_spread_over_the_data() -> None:
    assert _evenly_spread(_Batches(3), 20) == {0, 1, 2}
    assert _evenly_spread(_Batches(100), 4) == {0, 25, 50, 75}
