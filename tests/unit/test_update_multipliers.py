"""optimizer.lr_mult / optimizer.wd_mult in the module: per-parameter learning-rate and
weight-decay multipliers chosen by glob."""

from __future__ import annotations

import mxnet as mx
import numpy as np
import pytest
from batch_helpers import ArrayBatch, initialised_module

from mxtrain.engine.bucketing import BucketingModule
from mxtrain.engine.parameters import ParamPatternError, resolve_multipliers

ROWS, FEATURES = 8, 5
LR, WD = 0.5, 0.1
NAMES = ["fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias"]


def _sym_gen(_key: int):  # type: ignore[no-untyped-def]
    data = mx.sym.Variable("data")
    label = mx.sym.Variable("label")
    hidden = mx.sym.FullyConnected(data, num_hidden=4, name="fc1")
    out = mx.sym.FullyConnected(mx.sym.tanh(hidden), num_hidden=3, name="fc2")
    loss = mx.sym.MakeLoss(mx.sym.sum(mx.sym.square(out - label), axis=1), name="loss")
    return loss, ("data",), ("label",)


def _one_step(devices: int, on_kvstore: bool | None, **multipliers: dict) -> dict:
    module, start = initialised_module(_sym_gen, devices, ROWS, FEATURES, 3)
    module.init_optimizer(
        kvstore="local",
        optimizer="sgd",
        optimizer_params={"learning_rate": LR, "wd": WD},
        update_on_kvstore=on_kvstore,
        **multipliers,
    )
    rng = np.random.default_rng(1)
    batch = ArrayBatch(rng.normal(size=(ROWS, FEATURES)), rng.normal(size=(ROWS, 3)))
    module.forward_backward(batch)
    grads = {n: module.grad_array(n).asnumpy() for n in module.param_names}
    module.update()
    after = {k: v.asnumpy() for k, v in module.get_params()[0].items()}
    return {
        "start": start,
        "grads": grads,
        "after": after,
        "multipliers": module.update_multipliers(),
    }


@pytest.mark.parametrize(
    ("devices", "on_kvstore"), [(1, None), (2, False), (2, True)], ids=["1dev", "2dev", "2dev-kv"]
)
def test_each_parameter_steps_by_its_own_rate_and_decay(
    devices: int, on_kvstore: bool | None
) -> None:
    lr_mult = {"fc1_*": 0.25, "fc2_bias": 0.0}
    wd_mult = {"fc1_bias": 2.0, "fc2_weight": 0.5}
    result = _one_step(devices, on_kvstore, lr_mult=lr_mult, wd_mult=wd_mult)
    grads = _one_step(1, None)["grads"]  # the whole batch's (2 devices hold a half each)
    expected_lr = {"fc1_weight": 0.25, "fc1_bias": 0.25, "fc2_weight": 1.0, "fc2_bias": 0.0}
    # MXNet decays no bias unless told: fc2_bias keeps its default 0
    expected_wd = {"fc1_weight": 1.0, "fc1_bias": 2.0, "fc2_weight": 0.5, "fc2_bias": 0.0}
    assert result["multipliers"] == {n: (expected_lr[n], expected_wd[n]) for n in NAMES}
    for name in NAMES:
        w, g = result["start"][name], grads[name]
        # plain SGD: w -= lr * lr_mult * (grad / batch + wd * wd_mult * w)
        step = LR * expected_lr[name] * (g / ROWS + WD * expected_wd[name] * w)
        np.testing.assert_allclose(result["after"][name], w - step, rtol=1e-5, atol=1e-6)


def test_without_multipliers_mxnet_defaults_apply() -> None:
    result = _one_step(1, None)
    assert result["multipliers"] == {
        "fc1_weight": (1.0, 1.0),
        "fc1_bias": (1.0, 0.0),
        "fc2_weight": (1.0, 1.0),
        "fc2_bias": (1.0, 0.0),
    }


def test_resolution_does_not_depend_on_glob_order() -> None:
    globs = {"fc1_*": 0.1, "*_bias": 2.0}
    with pytest.raises(ParamPatternError, match="'fc1_bias' matches both") as err:
        resolve_multipliers(NAMES, globs, "lr_mult")
    assert err.value.option == "lr_mult"
    with pytest.raises(ParamPatternError, match="'fc1_bias' matches both"):
        resolve_multipliers(NAMES, dict(reversed(list(globs.items()))), "lr_mult")
    assert resolve_multipliers(NAMES, {"fc?_weight": 3}, "wd_mult") == {
        "fc1_weight": 3.0,
        "fc2_weight": 3.0,
    }


def test_a_glob_matching_nothing_is_refused_before_anything_is_created() -> None:
    module = BucketingModule(_sym_gen, 1, [mx.cpu(0)])
    module.bind([("data", (ROWS, FEATURES))], [("label", (ROWS, 3))])
    module.init_params(mx.init.Uniform(1.0))
    with pytest.raises(ParamPatternError, match="'embed_\\*' matches no parameter") as err:
        module.init_optimizer(optimizer="sgd", wd_mult={"embed_*": 0.0})
    assert err.value.option == "wd_mult"
    assert "fc1_weight" in str(err.value)
    assert not module.optimizer_initialized
