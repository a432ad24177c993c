"""Fuzz findings about sizes: many ``--set`` overrides, integer sizes MXNet cannot hold,
thread counts that crash natively. Every one must end in a ConfigError naming the key (or the
command-line argument), before anything runs.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import mxtrain.config.loader as loader_module
from mxtrain.config import load_config, parse_config
from mxtrain.errors import ConfigError

LOADER_FILE = loader_module.__file__

BASE = """\
model: {name: lstm_lm, num_embed: 8, num_hidden: 12, num_layers: 1}
data:
  train: {iterator: bucket_sentence, source: train.txt, batch_size: 8, buckets: [5, 9, 13]}
"""


def loader_lines_run(overrides: list[str]) -> int:
    """How many lines of loader.py run to parse BASE with ``overrides``: a count of
    operations that does not depend on the machine's speed."""
    count = 0

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "line":
            count += 1
        return local

    def on_call(frame: FrameType, event: str, arg: Any) -> Any:
        return local if frame.f_code.co_filename == LOADER_FILE else None

    sys.settrace(on_call)
    try:
        with pytest.raises(ConfigError):  # the keys are unknown: refused after all applied
            parse_config(BASE, source="<t>", base_dir=Path("."), overrides=overrides)
    finally:
        sys.settrace(None)
    return count


# -- K1: N overrides cost O(N) -------------------------------------------------------------------


def test_applying_distinct_overrides_is_near_linear() -> None:
    small = loader_lines_run([f"model.k{i}=1" for i in range(500)])
    large = loader_lines_run([f"model.k{i}=1" for i in range(2000)])
    # 4x the overrides: linear work is ~4x; the old quadratic scan of every location per
    # override was ~16x
    assert large / small < 6, (small, large)


def test_overrides_below_a_replaced_section_are_forgotten() -> None:
    """Replacing a section drops the locations of the keys that were below it."""
    locs = loader_module.Locations("<default>")
    locs.set(("a",), "l1")
    locs.set(("a", "b"), "l2")
    locs.set(("a", "b", "c"), "l3")
    locs.set(("a", "d"), "l4")
    locs.set(("e",), "l5")
    locs.drop_under(("a", "b"))
    assert not locs.known(("a", "b")) and not locs.known(("a", "b", "c"))
    assert locs.where(("a", "b", "c")) == "l1"
    assert locs.known(("a", "d")) and locs.known(("e",))
    locs.set(("a", "b", "c"), "l6")  # linked again after being forgotten
    locs.drop_under(("a",))
    assert not any(locs.known(p) for p in [("a",), ("a", "b", "c"), ("a", "d")])
    assert locs.known(("e",))
    locs.drop_under(())
    assert not locs.known(("e",))


def test_the_last_of_many_overrides_wins(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(BASE)
    config = load_config(tmp_path / "c.yaml", [f"fit.num_epoch={i}" for i in range(1, 3001)])
    assert config.fit.num_epoch == 3000
    assert config.where("fit", "num_epoch") == "--set fit.num_epoch=3000"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(textwrap.dedent(text))
    return path
