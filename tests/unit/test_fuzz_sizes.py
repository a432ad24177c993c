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
from hypothesis import given, settings
from hypothesis import strategies as st

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
    assert "optimizer.learning_rate must be a finite number" in message


@pytest.mark.parametrize(
    ("base", "override", "key"),
    [
        (
            BASE,
            "data.train={source: t.txt, batch_size: 30000, buckets: [5, 100000]}",
            "data.train.buckets",
        ),
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


def test_bucket_lengths_are_bounded() -> None:
    message = refusal(["data.train.buckets=[5, 200000]"])
    assert "data.train.buckets must be at most 100,000 long, got 200,000" in message


# -- C1: sizes known once the graph is built (vocabulary, auto buckets, export shapes) ----------


def embedding_graph(vocab: int, width: int) -> Any:
    import mxnet as mx

    data = mx.sym.Variable("data")
    embed = mx.sym.Embedding(data, input_dim=vocab, output_dim=width, name="embed")
    return mx.sym.FullyConnected(embed, num_hidden=vocab, flatten=False, name="pred")


def test_a_graph_tensor_over_the_limit_is_named() -> None:
    from mxtrain.graph_sizes import graph_problem

    graph = embedding_graph(10_000, 1_048_576)
    problem = graph_problem(graph, {"data": (8, 13)}, activations_in_memory=False)
    assert problem is not None and problem.tensor == "the tensor embed_weight"
    assert problem.shape == (10_000, 1_048_576)
    assert "2**31 - 1" in problem.describe()
    small = embedding_graph(100, 16)
    assert graph_problem(small, {"data": (8, 13)}, activations_in_memory=True) is None
    huge_input = graph_problem(small, {"data": (10**12, 5)}, activations_in_memory=False)
    assert huge_input is not None and huge_input.tensor == "the input data"


def test_a_graph_larger_than_the_memory_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from mxtrain import graph_sizes

    monkeypatch.setattr(graph_sizes, "physical_memory", lambda: 2**20)  # 1 MiB
    graph = embedding_graph(1000, 512)  # a 2 MiB parameter
    problem = graph_sizes.graph_problem(graph, {"data": (2, 3)}, activations_in_memory=False)
    assert problem is not None and problem.tensor == "the tensor embed_weight"
    assert "more than this machine's 0.0 GiB" in problem.describe()
    monkeypatch.setattr(graph_sizes, "physical_memory", lambda: 3 * 2**20)  # 3 MiB
    graph = embedding_graph(200, 512)  # 0.4 MiB per weight, 4 MiB of outputs
    assert graph_sizes.graph_problem(graph, {"data": (64, 32)}, activations_in_memory=False) is None
    problem = graph_sizes.graph_problem(graph, {"data": (64, 32)}, activations_in_memory=True)
    assert problem is not None and "parameters and layer outputs" in problem.tensor


def test_the_keys_of_a_tensor_are_those_whose_values_are_its_dimensions() -> None:
    from mxtrain.graph_sizes import keys_of

    sizes = {"model.num_embed": 1_048_576, "data.train.buckets": [5, 13], "model.flag": True}
    assert keys_of((8, 13, 1_048_576), sizes) == ["model.num_embed", "data.train.buckets"]


SIZE_KEYS = [
    "data.train.batch_size",
    "data.train.batch_tokens",
    "data.train.num_buckets",
    "data.train.max_vocab",
    "model.num_embed",
    "model.num_hidden",
    "model.num_layers",
    "context.omp_threads",
    "context.engine_threads",
    "context.count",
    "fit.num_epoch",
    "fit.max_batches_per_epoch",
]
NUMBERS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([2**31 - 1, 2**31, 2**63 - 1, 2**63, 1024, 1025, 100_000, 100_001]),
)


@settings(derandomize=True, deadline=None, database=None, max_examples=300)
@given(st.lists(st.tuples(st.sampled_from(SIZE_KEYS), NUMBERS), min_size=1, max_size=3))
def test_any_number_for_a_size_loads_within_the_limits_or_is_refused_cleanly(
    settings_: list[tuple[str, Any]],
) -> None:
    overrides = [f"{key}={value!r}" for key, value in settings_]
    overrides = [o.replace("=nan", "=.nan").replace("=inf", "=.inf") for o in overrides]
    overrides = [o.replace("=-inf", "=-.inf") for o in overrides]
    try:
        config = parse_config(BASE, source="c.yaml", base_dir=Path("."), overrides=overrides)
    except ConfigError as exc:
        assert str(exc).startswith("--set "), str(exc)
        return
    train = config.data.train.options
    assert 1 <= train.batch_size * max(train.buckets) <= 2**31 - 1
    for key in ("omp_threads", "engine_threads"):
        assert getattr(config.context, key) == "auto" or 1 <= getattr(config.context, key) <= 1024
