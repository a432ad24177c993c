"""Optimizer, schedule, initializer and metric values that reached MXNet unchecked (fuzz
classes C2 and C3): each is refused by the config loader at its key, or MXNet takes it.

The property tests feed non-finite, negative, huge and tiny numbers into these sections; a
config that loads must then build an optimizer that updates, a schedule whose rates MXNet's
operators take, and an initializer that fills arrays. Examples are derandomized and have no
deadline: no verdict depends on time.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

import mxnet as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import mxtrain.optimizers  # noqa: F401 - registers mxtrain's optimizers
from mxtrain.build import build_initializer, build_lr_scheduler, build_metric, optimizer_arguments
from mxtrain.config import Config, load_config
from mxtrain.config.schema import (
    MIN_RATE,
    OPTIMIZERS,
    SUPPORTED_OPTIMIZERS,
    OptimizerSection,
)
from mxtrain.data.base import DataInfo
from mxtrain.errors import ConfigError
from mxtrain.option_checks import FLOAT32_MAX, FLOAT32_TINY, Bounds
from mxtrain.registry import metric_problem

#: MXNet's registry entries that are no optimizer a config may name (its test optimizer, a
#: deprecated alias of sgd): the loader reports them as unknown
NOT_OPTIMIZERS = {"test", "ccsgd"}

BASE = """\
model: {name: tiny}
data:
  train: {iterator: tiny_iter, source: train.txt}
"""

FUZZ = settings(
    derandomize=True,
    deadline=None,
    database=None,
    max_examples=300,
    suppress_health_check=list(HealthCheck),
)


def load(tmp_path: Path, text: str, *overrides: str) -> Config:
    from test_config import REG  # the tiny registries of the config tests

    path = tmp_path / "exp.yaml"
    path.write_text(text, encoding="utf-8")
    return load_config(path, overrides=list(overrides), registries=REG)


def refusal(tmp_path: Path, text: str, *overrides: str) -> str:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text, *overrides)
    message = str(info.value)
    assert message.startswith((str(tmp_path), "--set ")), message
    return message


# --------------------------------------------------------------------------------------------
# C2: every optimizer MXNet registers trains with mxtrain, or the config says why not
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(mx.optimizer.Optimizer.opt_registry))
def test_every_registered_optimizer_is_supported_or_refused(tmp_path: Path, name: str) -> None:
    if name in NOT_OPTIMIZERS:
        assert name not in OPTIMIZERS
        assert f"unknown optimizer {name!r}" in refusal(tmp_path, BASE, f"optimizer.name={name}")
        return
    spec = OPTIMIZERS[name]
    if spec.refusal is None:
        assert name in SUPPORTED_OPTIMIZERS
        assert load(tmp_path, BASE, f"optimizer.name={name}").optimizer.name == name
        return
    message = refusal(tmp_path, BASE + f"optimizer:\n  name: {name}\n")
    assert f"exp.yaml:5: optimizer.name {name} cannot be used: {spec.refusal}" in message
    assert "Supported optimizers: " + ", ".join(SUPPORTED_OPTIMIZERS) in message


def one_update(name: str, params: dict[str, Any], steps: int = 3) -> np.ndarray:
    """A (4, 3) weight after ``steps`` updates by optimizer ``name``; rows 1 and 3 always get
    a gradient of exactly 0 (unseen embedding rows, dead units)."""
    opt = mx.optimizer.create(name, **params)
    weight = mx.nd.array(np.arange(12, dtype=np.float32).reshape(4, 3) / 10)
    state = opt.create_state_multi_precision(0, weight)
    grad = mx.nd.array([[0.5, -1, 2], [0, 0, 0], [-3, 1, 0.25], [0, 0, 0]])
    for _ in range(steps):
        opt.update_multi_precision(0, weight, grad, state)
    return weight.asnumpy()


@pytest.mark.parametrize("name", SUPPORTED_OPTIMIZERS)
def test_supported_optimizers_keep_weights_with_zero_gradients_finite(name: str) -> None:
    # MXNet's adamax divided 0 by 0 there, which made the first epoch diverge
    spec = OPTIMIZERS[name]
    defaults = {k: p.default for k, p in spec.params.items()}
    weight = one_update(name, {"learning_rate": spec.learning_rate, **defaults})
    assert np.isfinite(weight).all(), weight


def test_adamax_matches_mxnet_where_gradients_are_not_zero() -> None:
    params = {"learning_rate": 0.002}
    ours = one_update("adamax", params)
    opt = mx.optimizer.optimizer.Adamax(**params)  # MXNet's own class
    weight = mx.nd.array(np.arange(12, dtype=np.float32).reshape(4, 3) / 10)
    state = opt.create_state(0, weight)
    grad = mx.nd.array([[0.5, -1, 2], [0, 0, 0], [-3, 1, 0.25], [0, 0, 0]])
    for _ in range(3):
        opt.update(0, weight, grad, state)
    theirs = weight.asnumpy()
    np.testing.assert_array_equal(ours[[0, 2]], theirs[[0, 2]])
    assert np.isnan(theirs[[1, 3]]).all()  # the defect, still in MXNet
    initial = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    np.testing.assert_array_equal(ours[[1, 3]], initial[[1, 3]])  # nothing to learn: unchanged


# --------------------------------------------------------------------------------------------
# C3: the reported values, each refused at its key
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("fit.bucket_memory=.inf", "fit.bucket_memory must be a number or 'auto' or null, got inf"),
        ("fit.bucket_memory=1e300", "fit.bucket_memory must be at most 1e+06, got 1e+300."),
        ("fit.max_time=.nan", "got nan (float). NaN and infinities are not accepted"),
        ("optimizer.learning_rate=1e308", "optimizer.learning_rate must be in [1e-20, 1e+06]"),
        ("optimizer.learning_rate=1e-300", "optimizer.learning_rate must be in [1e-20, 1e+06]"),
        ("optimizer.wd=-.inf", "optimizer.wd must be a finite number, got -inf"),
        ("optimizer.lr_mult={'*': 1e308}", "optimizer.lr_mult.* must be 0 or in [1e-06, 1e+06]"),
        ("optimizer.momentum=1", "optimizer.momentum must be in [0, 1) for the sgd optimizer"),
        ("optimizer.momentum=.nan", "optimizer.momentum must be a finite number, got nan"),
        ("optimizer.clip_gradient=1e39", "optimizer.clip_gradient must be a finite number of"),
        ("optimizer.rescale_grad=1e-39", "optimizer.rescale_grad must be 0 or of magnitude"),
        (
            "optimizer.lr_scheduler={type: poly, max_update: 10, pwr: -1}",
            "optimizer.lr_scheduler.pwr must be greater than 0, got -1.0.",
        ),
        (
            "optimizer.lr_scheduler={type: poly, max_update: 1e300}",
            # the loader's 64-bit integer rule answers before the schedule's own 1e15 cap
            "optimizer.lr_scheduler.max_update must be an integer or null, got 1e+300",
        ),
        (
            "optimizer.lr_scheduler={type: multifactor, steps: [1e308], unit: epochs}",
            "optimizer.lr_scheduler.steps must be at most 1e+15",
        ),
        (
            "optimizer.lr_scheduler={type: factor, step: 2, stop_factor_lr: 1e-30}",
            "optimizer.lr_scheduler.stop_factor_lr must be 0 or in [1e-20, 1e+06]",
        ),
        ("initializer.sigma=-1", "initializer.sigma must be greater than 0 for the normal"),
        (
            "initializer.overrides=[{pattern: '*_bias', name: normal, sigma: -1}]",
            "initializer.overrides.0.sigma must be greater than 0 for the normal initializer",
        ),
        (
            "initializer.overrides=[{pattern: '*_bias', name: uniform, scale: .inf}]",
            "initializer.overrides.0.scale must be a finite number, got inf",
        ),
    ],
)
def test_values_out_of_their_consumers_range_are_refused_at_their_key(
    tmp_path: Path, override: str, expected: str
) -> None:
    text = BASE + "initializer:\n  name: normal\n" if "sigma=" in override else BASE
    message = refusal(tmp_path, text, override)
    assert message.startswith(f"--set {override}: "), message
    assert expected in message


def test_lamb_bounds_must_be_ordered(tmp_path: Path) -> None:
    text = BASE + "optimizer:\n  name: lamb\n  lower_bound: 2\n  upper_bound: 1\n"
    assert "exp.yaml:6: optimizer.lower_bound must not exceed upper_bound" in refusal(
        tmp_path, text
    )


def test_signum_weight_decay_needs_momentum(tmp_path: Path) -> None:
    text = BASE + "optimizer:\n  name: signum\n  momentum: 0\n  wd_lh: 0.1\n"
    assert "exp.yaml:7: optimizer.wd_lh needs momentum above 0 with signum" in refusal(
        tmp_path, text
    )


def test_huge_integer_for_a_float_key_is_refused(tmp_path: Path) -> None:
    message = refusal(tmp_path, BASE + "optimizer:\n  learning_rate: " + "9" * 400 + "\n")
    assert "exp.yaml:5: optimizer.learning_rate must be a finite number" in message


def test_bounds_describe_what_they_accept() -> None:
    assert Bounds(0.0, 1.0, high_open=True).describe() == "in [0, 1)"
    assert Bounds(0.0, low_open=True).describe() == "greater than 0"
    assert Bounds(high=5).describe() == "at most 5"
    unit = Bounds(0.0, 1.0, high_open=True)
    assert 0.0 in unit and 0.5 in unit
    assert 1.0 not in unit and math.nan not in unit and -math.inf not in unit


# --------------------------------------------------------------------------------------------
# schedules: rates too small for MXNet's operators become 0 instead of stopping training
# --------------------------------------------------------------------------------------------


def test_decaying_schedules_never_give_mxnet_a_rate_it_refuses(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        BASE,
        "optimizer.lr_scheduler={type: poly, max_update: 50, pwr: 60, warmup_steps: 40}",
        "optimizer.lr_mult={'*': 1e-6}",
    )
    scheduler = build_lr_scheduler(config.optimizer.lr_scheduler, config.optimizer.learning_rate)
    rates = [scheduler(n) for n in range(0, 60)]
    assert 0.0 in rates[1:]  # the end of the decay is tiny: flushed to 0
    for rate in rates:
        assert rate == 0.0 or rate >= MIN_RATE
        lr = rate * 1e-6  # the multiplier MXNet applies after the schedule
        mx.nd.sgd_update(mx.nd.ones(2), mx.nd.ones(2), lr=lr, wd=0).wait_to_read()


# --------------------------------------------------------------------------------------------
# metrics named by a Python path
# --------------------------------------------------------------------------------------------


def test_metric_problem_names_what_is_wrong() -> None:
    assert metric_problem(mx.metric.Accuracy) is None
    assert metric_problem(mx.metric.Accuracy()) is None
    assert "argument(s) metric" in str(metric_problem(mx.metric.create))
    assert "argument(s) name" in str(metric_problem(mx.metric.EvalMetric))
    assert "is a int, not a metric" in str(metric_problem(3))
    assert "without the metric method(s) get_interval" in str(metric_problem(dict))


def test_a_factory_that_makes_no_metric_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text(
        textwrap.dedent(
            """\
            def makes_a_number():
                return 3.0

            def fails():
                raise KeyError("vocab")
            """
        )
    )
    info = DataInfo(task="lm", vocab_size=10, pad_id=0)
    with pytest.raises(ConfigError, match="made a float, which lacks the metric method"):
        build_metric("bad.py:makes_a_number", info, tmp_path)
    with pytest.raises(ConfigError, match="failed while creating the metric: KeyError"):
        build_metric("bad.py:fails", info, tmp_path)


# --------------------------------------------------------------------------------------------
# property: loaded values are values MXNet takes
# --------------------------------------------------------------------------------------------

EDGES = (math.nan, math.inf, -math.inf, 0, -1, 1, 0.5, 0.999999, 1.0, 2, 1e-45, 1e-30, 1e-21)
HUGE = (1e-20, 1e-7, 1e6, 1e7, 1e30, 1e39, 1e300, -1e300, 2**63, 10**20, 10**400)
NUMBERS = st.one_of(
    st.sampled_from((*EDGES, *HUGE)),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**30), max_value=10**30),
)

#: values a user would write, so that enough examples load and reach MXNet
PLAUSIBLE = st.one_of(
    st.sampled_from([0, 0.1, 0.5, 0.9, 0.99, 1e-3, 1e-8, 2, 10, 100]),
    st.floats(min_value=0, max_value=1),
)
#: mostly plausible values, a bad one now and then
MIXED = st.one_of(PLAUSIBLE, PLAUSIBLE, PLAUSIBLE, NUMBERS)


def _schedules() -> st.SearchStrategy[dict[str, Any]]:
    kinds = {
        "factor": ("step", "factor", "stop_factor_lr"),
        "multifactor": ("factor",),
        "poly": ("max_update", "final_lr", "pwr"),
        "cosine": ("max_update", "final_lr"),
    }
    common = ("warmup_steps", "warmup_begin_lr")

    @st.composite
    def build(draw: Any) -> dict[str, Any]:
        kind = draw(st.sampled_from(sorted(kinds)))
        required = {"step": 3, "max_update": 30}
        schedule: dict[str, Any] = {"type": kind}
        schedule |= {k: v for k, v in required.items() if k in kinds[kind]}
        if kind == "multifactor":
            schedule["steps"] = draw(st.lists(MIXED, min_size=1, max_size=3))
        for key in draw(st.sets(st.sampled_from(kinds[kind] + common), max_size=3)):
            schedule[key] = draw(MIXED)
        return schedule

    return build()


@st.composite
def optimizer_sections(draw: Any) -> dict[str, Any]:
    name = draw(st.sampled_from(SUPPORTED_OPTIMIZERS))
    floats = [k for k, p in OPTIMIZERS[name].params.items() if p.type is not bool]
    keys = ["learning_rate", "wd", "clip_gradient", "clip_global_norm", "rescale_grad", *floats]
    section: dict[str, Any] = {"name": name}
    for key in draw(st.sets(st.sampled_from(keys), max_size=3)):
        section[key] = draw(MIXED)
    if draw(st.booleans()):
        section["lr_mult"] = {"*": draw(MIXED)}
    if draw(st.booleans()):
        section["lr_scheduler"] = draw(_schedules())
    return section


@st.composite
def initializer_sections(draw: Any) -> dict[str, Any]:
    from mxtrain.config.schema import INITIALIZERS

    def one(name: str) -> dict[str, Any]:
        params = [k for k, p in INITIALIZERS[name].params.items() if p.type is float]
        chosen = draw(st.sets(st.sampled_from(params), max_size=1)) if params else set()
        return {"name": name, **{k: draw(NUMBERS) for k in chosen}}

    section = one(draw(st.sampled_from(["xavier", "uniform", "normal", "orthogonal"])))
    override = one(draw(st.sampled_from(["uniform", "normal", "orthogonal", "zero"])))
    section["overrides"] = [{"pattern": "*_weight", **override}]
    return section


def _flow(value: Any) -> str:
    """A YAML flow rendering that keeps NaN, infinities and huge integers as written."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"'{k}': {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    if isinstance(value, float):
        if math.isnan(value):
            return ".nan"
        if math.isinf(value):
            return ".inf" if value > 0 else "-.inf"
        return repr(value)
    if isinstance(value, str):
        return f"'{value}'"
    return str(value)


def assert_mxnet_takes_the_optimizer(section: OptimizerSection) -> None:
    name, params = optimizer_arguments(section)
    params.pop("lr_scheduler", None)
    mult = max(section.lr_mult.values(), default=1.0)
    scheduler = build_lr_scheduler(section.lr_scheduler, section.learning_rate)
    rates = [section.learning_rate]
    if scheduler is not None:
        spec = section.lr_scheduler
        horizon = max(spec.max_update or 0, *(spec.steps or (0,)), spec.step or 0, 1)
        horizon = int(min(horizon + spec.warmup_steps, 10**15))
        counts = {0, 1, 2, horizon - 1, horizon, horizon + 1, horizon // 2}
        rates = [scheduler(n) for n in sorted(c for c in counts if c >= 0)]
    for rate in rates:
        assert rate == 0.0 or MIN_RATE <= rate <= FLOAT32_MAX, rate
        # what the operators get: the rate times the multiplier, each update
        one_update(name, {**params, "learning_rate": rate * mult if rate else 0.0}, steps=2)


@FUZZ
@given(section=optimizer_sections())
def test_loaded_optimizer_sections_are_values_mxnet_takes(
    tmp_path_factory: pytest.TempPathFactory, section: dict[str, Any]
) -> None:
    folder = tmp_path_factory.mktemp("opt")
    try:
        config = load(folder, BASE + f"optimizer: {_flow(section)}\n")
    except ConfigError as exc:
        assert str(exc).startswith(str(folder)), exc
        event("refused at " + str(exc).split(": ")[1].split(" ")[0])
        return
    event("loaded")
    assert_mxnet_takes_the_optimizer(config.optimizer)


@FUZZ
@given(section=initializer_sections())
def test_loaded_initializer_sections_fill_arrays(
    tmp_path_factory: pytest.TempPathFactory, section: dict[str, Any]
) -> None:
    folder = tmp_path_factory.mktemp("init")
    try:
        config = load(folder, BASE + f"initializer: {_flow(section)}\n")
    except ConfigError as exc:
        assert str(exc).startswith(str(folder)), exc
        event("refused at " + str(exc).split(": ")[1].split(" ")[0])
        return
    event("loaded")
    initializer = build_initializer(config.initializer)
    for name in ("fc_weight", "lstm_bias", "embed_weight"):
        array = mx.nd.zeros((4, 3))
        initializer(mx.init.InitDesc(name), array)
        assert not np.isnan(array.asnumpy()).any()


@FUZZ
@given(value=NUMBERS)
def test_loaded_bucket_memory_makes_a_budget(
    tmp_path_factory: pytest.TempPathFactory, value: Any
) -> None:
    folder = tmp_path_factory.mktemp("fit")
    try:
        config = load(folder, BASE + f"fit: {{bucket_memory: {_flow(value)}}}\n")
    except ConfigError as exc:
        assert str(exc).startswith(str(folder)), exc
        event("refused at " + str(exc).split(": ")[1].split(" ")[0])
        return
    event("loaded")
    memory = config.fit.bucket_memory
    assert isinstance(memory, float) and memory >= 1
    # BucketingModule's budget: bucket_memory times the largest bucket's input positions
    assert int(memory * 10**9) >= 10**9


def test_float32_limits_are_float32s() -> None:
    assert np.float32(FLOAT32_MAX) == np.finfo(np.float32).max
    assert np.float32(FLOAT32_TINY) == np.finfo(np.float32).tiny


def test_sgld_runs_at_a_learning_rate_of_0() -> None:
    # MXNet's SGLD draws noise of scale sqrt(lr): its sampler refused 0 at a schedule's end
    weight = one_update("sgld", {"learning_rate": 0.0})
    np.testing.assert_array_equal(weight, np.arange(12, dtype=np.float32).reshape(4, 3) / 10)
    assert not np.array_equal(one_update("sgld", {"learning_rate": 0.1}), weight)
