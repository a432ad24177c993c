"""Fuzz findings on export and inference, at the unit level: MXNet's error text rendered in
one line, bucket keys read from a run folder checked, parameter shapes compared in words."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mxnet as mx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mxtrain.engine.bucketing import BucketingModule
from mxtrain.errors import ConfigError, ExitCode, RunFolderError
from mxtrain.mxnet_errors import exception_summary, mxnet_reason
from mxtrain.option_checks import MAX_SEQUENCE_LENGTH
from mxtrain.run.bucket_keys import (
    check_keys,
    key_problem,
    read_model_inputs,
)
from mxtrain.run.folder import RunFolder
from mxtrain.run.params import ParamsMismatchError, param_problems, params_mismatch_error

# ----------------------------------------------------------------------------- MXNet's text

FRAMES = [
    "Traceback (most recent call last):",
    '  File "../src/ndarray/./../operator/tensor/../elemwise_op_common.h", line 134',
    "Stack trace:",
    "  [bt] (0) /usr/lib/libmxnet.so(+0x1234) [0x7f00]",
]


def raised(text: str) -> Exception:
    return mx.base.MXNetError(text)


def test_a_real_mxnet_error_loses_its_traceback() -> None:
    a, b = mx.nd.zeros((2, 3)), mx.nd.zeros((4, 3))
    with pytest.raises(mx.base.MXNetError) as caught:
        a.copyto(b)
    assert "Traceback" in str(caught.value)  # what MXNet itself says
    reason = mxnet_reason(caught.value)
    assert reason.startswith("Incompatible attr") and "expected [2,3], got [4,3]" in reason
    assert "Traceback" not in reason and "File" not in reason and "\n" not in reason


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            'Traceback (most recent call last):\n  File "../src/ndarray/ndarray.cc", line 1854\n'
            "MXNetError: Check failed: fi->Read(&header): Invalid NDArray file format",
            "Invalid NDArray file format",
        ),
        (
            "[19:00:01] ../src/operator/nn/pooling.cc:192: Check failed: param.kernel[0] <= "
            "dshape[2]: kernel size (3) exceeds input\nStack trace:\n  [bt] (0) libmxnet.so",
            "kernel size (3) exceeds input",
        ),
        (
            "simple_bind error. Arguments:\nx: (2, 3)\nMXNetError: Error in operator fc: Shape "
            "inconsistent, Provided = [4,4], inferred shape=(3,3)",
            "operator fc: Shape inconsistent, Provided = [4,4], inferred shape=(3,3)",
        ),
        ("plain words.", "plain words"),
        ("", "MXNetError"),
    ],
)
def test_mxnet_reason_keeps_the_one_line_that_says_what_failed(text: str, reason: str) -> None:
    assert mxnet_reason(raised(text)) == reason


def test_exception_summary_names_the_type() -> None:
    assert exception_summary(ZeroDivisionError("oops")) == "ZeroDivisionError: oops"
    text = f"{FRAMES[0]}\n{FRAMES[1]}\nMXNetError: Check failed: x: boom"
    assert exception_summary(raised(text)) == "MXNetError: boom"


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from(FRAMES), max_size=6),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=60),
)
def test_no_traceback_survives(frames: list[str], message: str) -> None:
    """Whatever MXNet puts around its message, the reason is one line without frames."""
    text = "\n".join([*frames, f"MXNetError: {message}", *frames])
    reason = mxnet_reason(raised(text))
    assert len(reason.splitlines()) == 1
    assert "Traceback (most recent call last)" not in reason
    assert not reason.startswith(('File "', "[bt]", "Stack trace:"))


# ----------------------------------------------------------------------------- bucket keys


@pytest.mark.parametrize(
    "key", [0, -1, MAX_SEQUENCE_LENGTH + 1, 50_000_000, True, 2.5, None, (), (3, 0), (2**16,) * 2]
)
def test_impossible_bucket_keys(key: Any) -> None:
    assert key_problem(key) is not None


@pytest.mark.parametrize("key", [1, 13, MAX_SEQUENCE_LENGTH, (3, 28, 28), (3_000_000,), "long"])
def test_possible_bucket_keys(key: Any) -> None:
    assert key_problem(key) is None


JSON_KEYS = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3).map(tuple),
    max_leaves=6,
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.lists(JSON_KEYS, max_size=5), JSON_KEYS))
def test_check_keys_accepts_or_names_the_file(keys: Any) -> None:
    """Any decoded JSON value: a list of possible keys back, or a RunFolderError naming the
    file (exit 5); never another exception."""
    file = Path("/runs/x/checkpoints/e0001-b000000/state.json")
    try:
        checked = check_keys(keys, file, "bucket_keys", trained=[5, 9, 13])
    except RunFolderError as exc:
        assert str(file) in str(exc) and exc.exit_code == ExitCode.RUN_FOLDER
        assert "bucket_keys" in str(exc) and "\n" not in str(exc)
    else:
        assert checked and all(k in (5, 9, 13) for k in checked)


def test_a_key_outside_the_training_buckets_is_refused() -> None:
    with pytest.raises(RunFolderError, match=r"100 is not one of the model's training buckets"):
        check_keys([5, 100], Path("state.json"), "bucket_keys", trained=[5, 9, 13])


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        "[]",
        '{"provide_data": []}',
        '{"default_bucket_key": 0, "provide_data": []}',
        '{"default_bucket_key": 13, "buckets": [5, 99999999], "provide_data": []}',
        '{"default_bucket_key": 13, "buckets": "all", "provide_data": []}',
    ],
)
def test_a_damaged_model_inputs_file_is_a_run_folder_error(tmp_path: Path, content: str) -> None:
    run = RunFolder(tmp_path)
    run.model_inputs_file.write_text(content)
    with pytest.raises(RunFolderError, match=r"model_inputs\.json"):
        read_model_inputs(run)


# ----------------------------------------------------------------------------- parameter shapes


def test_param_problems_names_every_mismatch() -> None:
    model = ({"w": (4, 3), "b": (4,)}, {"mean": (4,)})
    given = ({"w": mx.nd.zeros((2, 3)), "extra": mx.nd.zeros(1)}, {"mean": mx.nd.zeros(4)})
    problems = param_problems(model, given, source="the checkpoint")
    assert problems == [
        "the model's parameters b are not in the checkpoint",
        "the checkpoint has parameters not in the network: extra",
        "parameter w has shape (2, 3) in the checkpoint but the model needs (4, 3)",
    ]
    assert param_problems(model, given, source="x", allow_missing=True, allow_extra=True) == [
        problems[2].replace("the checkpoint", "x")
    ]


def test_the_mismatch_error_names_a_model_override() -> None:
    problems = ["parameter w has shape (2, 3) in the checkpoint but the model needs (4, 3)"]
    params, config = Path("run/checkpoints/e1/params.nd"), Path("run/config.yaml")
    error = params_mismatch_error(params, config, problems, ["fit.num_epoch=3"])
    assert isinstance(error, ParamsMismatchError) and error.exit_code == ExitCode.DATA
    assert "config.yaml" in str(error) and "(2, 3)" in str(error)
    error = params_mismatch_error(params, config, problems, [" model.num_hidden=32"])
    assert isinstance(error, ConfigError) and "model.num_hidden=32" in str(error)


def _fc(key: int) -> tuple[Any, list[str], list[str]]:
    data = mx.sym.Variable("data")
    out = mx.sym.FullyConnected(data, num_hidden=key, name="fc")
    return mx.sym.LinearRegressionOutput(out, name="lro"), ["data"], ["lro_label"]


def test_set_params_of_the_wrong_shape_is_said_in_words() -> None:
    module = BucketingModule(lambda key: _fc(4), 4)
    module.bind([("data", (2, 3))], [("lro_label", (2, 4))], for_training=False)
    module.init_params()
    assert module.param_shapes() == ({"fc_weight": (4, 3), "fc_bias": (4,)}, {})
    wrong = {"fc_weight": mx.nd.zeros((5, 3)), "fc_bias": mx.nd.zeros(4)}
    with pytest.raises(ValueError, match=r"fc_weight has shape \(5, 3\)") as caught:
        module.set_params(wrong, {})
    assert "Traceback" not in str(caught.value)


def test_model_inputs_record_round_trip(tmp_path: Path) -> None:
    run = RunFolder(tmp_path)
    record = {"default_bucket_key": 13, "buckets": [5, 9, 13], "provide_data": [["data", [8, 13]]]}
    run.model_inputs_file.write_text(json.dumps(record))
    assert read_model_inputs(run) == record
