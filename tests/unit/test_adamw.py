"""mxtrain's AdamW against a NumPy reference of the decoupled-weight-decay rule."""

from __future__ import annotations

import mxnet as mx
import numpy as np
import pytest
from float_bounds import FLOAT32_U

import mxtrain.optimizers  # noqa: F401 - registers adamw


def _f32(value: float) -> float:
    """``value`` as the operator sees it: MXNet passes hyperparameters as float32."""
    return float(np.float32(value))


def reference(w, grads, lr, wd, beta1=0.9, beta2=0.999, eps=1e-8, rescale=1.0, correct=True):
    """The AdamW rule in float64 with the operator's float32 hyperparameters, and a bound on
    how far float32 arithmetic can take the operator from it, whatever order a kernel uses.

    Each float32 operation is off by at most u = 2**-24 of its result. First order in u,
    with dx the bound carried for a quantity x (1 - beta is exact in float32: Sterbenz):
    m = b1*m + (1-b1)*g and v = b2*v + (1-b2)*g*g round g (rescale), each product and the
    sum: dm' = b1*dm + 4u*(b1|m| + (1-b1)|g|), dv' = b2*dv + 5u*(b2*v + (1-b2)*g*g).
    r = step*m/(sqrt(v)+eps) adds the sqrt, +eps, / and * roundings (4u|r|) to what m's
    and v's errors carry. w' = w - lr*(r + wd*w) adds four more (wd*w, +, lr*, -) and keeps
    w's own error, scaled by at most (1 + lr*wd)."""
    u = FLOAT32_U

    # the bias correction is computed in Python from the float64 betas, then passed on
    def bias_correction(t: int, b1: float = beta1, b2: float = beta2) -> float:
        return _f32(np.sqrt(1 - b2**t) / (1 - b1**t)) if correct else 1.0

    lr, wd, beta1, beta2, eps = map(_f32, (lr, wd, beta1, beta2, eps))
    w = w.astype(np.float64)
    m, v, dw, dm, dv = (np.zeros_like(w) for _ in range(5))
    for t, g in enumerate(grads, start=1):
        g = g.astype(np.float64) * rescale
        dm = beta1 * dm + 4 * u * (beta1 * np.abs(m) + (1 - beta1) * np.abs(g))
        dv = beta2 * dv + 5 * u * (beta2 * v + (1 - beta2) * g * g)
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        step = bias_correction(t)
        denom = np.sqrt(v) + eps
        r = step * m / denom
        dr = step * (dm / denom + np.abs(m) * dv / (2 * np.sqrt(v) * denom**2)) + 4 * u * np.abs(r)
        dw = dw * (1 + lr * wd) + lr * dr + 4 * u * (np.abs(w) + lr * (np.abs(r) + wd * np.abs(w)))
        w = w - lr * (r + wd * w)
    return w, dw


@pytest.mark.parametrize("correct_bias", [True, False])
def test_adamw_matches_reference(correct_bias: bool) -> None:
    rng = np.random.default_rng(0)
    w0 = rng.normal(size=(4, 3)).astype(np.float32)
    grads = [rng.normal(size=(4, 3)).astype(np.float32) for _ in range(5)]
    opt = mx.optimizer.create(
        "adamw", learning_rate=0.05, wd=0.1, rescale_grad=0.5, correct_bias=correct_bias
    )
    updater = mx.optimizer.get_updater(opt)
    weight = mx.nd.array(w0)
    for g in grads:
        updater(0, mx.nd.array(g), weight)
    expected, bound = reference(w0, grads, 0.05, 0.1, rescale=0.5, correct=correct_bias)
    error = np.abs(weight.asnumpy() - expected)
    assert (error <= bound).all(), f"error {error.max():.3g}, bound {bound[error.argmax()]:.3g}"


def test_weight_decay_is_decoupled_from_the_gradient() -> None:
    """With a zero gradient Adam's step is zero, so only the decay moves the weight."""
    opt = mx.optimizer.create("adamw", learning_rate=0.1, wd=0.5)
    updater = mx.optimizer.get_updater(opt)
    weight = mx.nd.ones((3,))
    updater(0, mx.nd.zeros((3,)), weight)
    # 1 - lr*(wd*1) in float32 from float32 lr and wd: at most ~4 roundings of u = 6e-8 each
    np.testing.assert_allclose(weight.asnumpy(), np.full(3, 1 - 0.1 * 0.5), rtol=1e-6)


def test_adamw_trains_from_yaml_and_resumes_exactly(tiny_config) -> None:
    from click.testing import CliRunner

    from mxtrain.cli.main import cli

    def run(*args: str) -> None:
        result = CliRunner().invoke(cli, list(args))
        assert result.exit_code == 0, result.output

    opts = ["--set", "optimizer.name=adamw", "--set", "optimizer.learning_rate=0.01"]
    opts += ["--set", "optimizer.wd=0.1"]
    run("fit", str(tiny_config), *opts, "--name", "straight")
    run("fit", str(tiny_config), *opts, "--name", "split", "--set", "fit.num_epoch=1")
    run("resume", str(tiny_config.parent / "runs" / "split"), "--set", "fit.num_epoch=2")
    runs = tiny_config.parent / "runs"
    a = mx.nd.load(str(runs / "straight" / "model-0002.params"))
    b = mx.nd.load(str(runs / "split" / "model-0002.params"))
    for key in a:
        np.testing.assert_array_equal(a[key].asnumpy(), b[key].asnumpy(), err_msg=key)
