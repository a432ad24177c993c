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
from mxtrain import option_checks
from mxtrain.config import load_config, parse_config
from mxtrain.errors import ConfigError
from mxtrain.option_checks import MAX_THREADS

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


def refusal(overrides: list[str], base: str = BASE) -> str:
    """The message of the ConfigError that loading BASE with ``overrides`` raises."""
    with pytest.raises(ConfigError) as caught:
        parse_config(
            textwrap.dedent(base), source="c.yaml", base_dir=Path("."), overrides=overrides
        )
    message = str(caught.value)
    assert "\n" not in message
    return message


ROWS = """\
model: {name: mlp, hidden: [16]}
data:
  train: {iterator: ndarray, source: x.npy, batch_size: 32}
"""
IMAGES = """\
model: {name: lenet}
data:
  train: {iterator: image_record, source: a.rec, data_shape: [3, 8, 8], num_classes: 10}
"""


# -- C4: thread counts are bounded -------------------------------------------------------------


@pytest.mark.parametrize("key", ["omp_threads", "engine_threads"])
@pytest.mark.parametrize("value", [1025, 1_000_000, 2**31 - 1])
def test_thread_counts_above_the_cap_are_refused(key: str, value: int) -> None:
    message = refusal([f"context.{key}={value}"])
    assert message.startswith(f"--set context.{key}={value}: context.{key} must be at most 1,024")
    assert "MAX_THREADS" in message


@pytest.mark.parametrize("key", ["omp_threads", "engine_threads"])
def test_thread_counts_up_to_the_cap_are_accepted(key: str) -> None:
    config = parse_config(BASE, source="c", base_dir=Path("."), overrides=[f"context.{key}=1024"])
    assert getattr(config.context, key) == MAX_THREADS == 1024


def test_decoding_threads_are_bounded() -> None:
    assert "preprocess_threads must be at most 1,024" in refusal(
        ["data.train.preprocess_threads=1000000"], IMAGES
    )


def test_an_exported_thread_count_above_the_cap_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from mxtrain import devices

    monkeypatch.setenv("OMP_NUM_THREADS", "1000000")
    config = parse_config(BASE, source="c", base_dir=Path("."))
    with pytest.raises(ConfigError, match=r"OMP_NUM_THREADS=1000000 \(exported\)"):
        devices.configure_threads(config.context)
    monkeypatch.setenv("OMP_NUM_THREADS", "1024")
    assert devices.configure_threads(config.context)["OMP_NUM_THREADS"] == "1024"


# -- C1: integers the schema types, and sizes MXNet's 32-bit shapes cannot hold ----------------


@pytest.mark.parametrize("value", ["1e30", "1.5", ".inf", "-.inf", ".nan", "1e19", str(2**63)])
def test_non_integers_and_huge_integers_are_refused_naming_the_key(value: str) -> None:
    message = refusal([f"data.train.batch_size={value}"])
    assert message.startswith(f"--set data.train.batch_size={value}: data.train.batch_size must ")


def test_an_integral_float_within_range_is_an_integer() -> None:
    config = parse_config(BASE, source="c", base_dir=Path("."), overrides=["fit.num_epoch=1e3"])
    assert config.fit.num_epoch == 1000 and isinstance(config.fit.num_epoch, int)


def test_an_integer_beyond_the_floats_is_refused_where_a_number_is_needed() -> None:
    message = refusal([f"optimizer.learning_rate={10**400}"])
    assert "optimizer.learning_rate must be a number" in message


@pytest.mark.parametrize(
    ("base", "override", "key"),
    [
        (BASE, "data.train.buckets=[5, 2147483647]", "data.train.buckets"),
        (BASE, "data.train.batch_size=2147483648", "data.train.batch_size"),
        (BASE, "data.train.batch_size=300000000", "data.train.batch_size"),
        (BASE, "data.train.batch_tokens=3000000000", "data.train.batch_tokens"),
        (ROWS, "data.train.num_classes=1e9", "data.train.num_classes"),
        (ROWS, "data.train.batch_size=3000000000", "data.train.batch_size"),
        (ROWS, "data.train.vocab_size=3000000000", "data.train.vocab_size"),
        (IMAGES, "data.train.data_shape=[3, 100000, 100000]", "data.train.data_shape"),
        (IMAGES, "data.train.num_classes=1000000000", "data.train.num_classes"),
    ],
)
def test_batches_larger_than_a_tensor_are_refused(base: str, override: str, key: str) -> None:
    message = refusal([override], base)
    assert f"{key} is too large" in message
    assert "2,147,483,647 (2**31 - 1)" in message


def test_a_batch_larger_than_the_memory_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(option_checks, "physical_memory", lambda: 2**30)
    message = refusal(["data.train.batch_size=30000000"])
    assert "data.train.batch_size is too large" in message
    assert "1.5 GiB, more than this machine's 1.0 GiB of memory" in message
