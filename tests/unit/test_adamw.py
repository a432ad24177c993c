"""mxtrain's AdamW against a NumPy reference of the decoupled-weight-decay rule."""

from __future__ import annotations

import mxnet as mx
import numpy as np
import pytest

import mxtrain.optimizers  # noqa: F401 - registers adamw


def reference(w, grads, lr, wd, beta1=0.9, beta2=0.999, eps=1e-8, rescale=1.0, correct=True):
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    for t, g in enumerate(grads, start=1):
        g = g * rescale
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        step = np.sqrt(1 - beta2**t) / (1 - beta1**t) if correct else 1.0
        w = w - lr * (step * m / (np.sqrt(v) + eps) + wd * w)
    return w


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
    expected = reference(w0, grads, 0.05, 0.1, rescale=0.5, correct=correct_bias)
    # float32 arithmetic over 5 steps; small entries lose relative precision by cancellation
    np.testing.assert_allclose(weight.asnumpy(), expected, rtol=1e-4, atol=2e-5)


def test_weight_decay_is_decoupled_from_the_gradient() -> None:
    """With a zero gradient Adam's step is zero, so only the decay moves the weight."""
    opt = mx.optimizer.create("adamw", learning_rate=0.1, wd=0.5)
    updater = mx.optimizer.get_updater(opt)
    weight = mx.nd.ones((3,))
    updater(0, mx.nd.zeros((3,)), weight)
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
