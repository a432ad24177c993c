"""Optimizers mxtrain adds to MXNet's registry (importing this module registers them), and
the learning-rate schedules it builds.

MXNet 1.9.1 ships the fused AdamW update operator (``mx.nd.contrib.adamw_update``) but no
optimizer class that uses it, so ``optimizer.name: adamw`` would not exist without this. Its
Adamax turns a weight whose gradients were all 0 so far into NaN and its SGLD fails at a
learning rate of 0: ``adamax`` and ``sgld`` are replaced by classes that do not.
"""

from __future__ import annotations

import math
from typing import Any

import mxnet as mx

# a kvstore server unpickles these classes while ``import mxnet`` is still running (it serves
# from inside that import), before ``mx.lr_scheduler`` is set: import the module by name
from mxnet import lr_scheduler

from mxtrain.config.schema import MIN_RATE
from mxtrain.option_checks import FLOAT32_TINY


@mx.optimizer.register
class AdamW(mx.optimizer.Optimizer):
    """Adam with decoupled weight decay (Loshchilov & Hutter, 2019).

    Each step: ``w -= lr * (m_hat / (sqrt(v_hat) + epsilon) + wd * w)``, the same rule as
    PyTorch's ``torch.optim.AdamW``: weight decay is scaled by the (scheduled) learning rate
    but is not part of the gradient, so it is not normalised by Adam's second moment.
    """

    def __init__(
        self,
        learning_rate: float = 0.001,
        beta1: float = 0.9,
        beta2: float = 0.999,
        epsilon: float = 1e-8,
        correct_bias: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.beta1 = beta1
        self.beta2 = beta2
        self.epsilon = epsilon
        self.correct_bias = correct_bias
        self._rescale: dict[tuple[Any, float], Any] = {}

    def create_state(self, index: Any, weight: Any) -> tuple[Any, Any]:
        zeros = {"ctx": weight.context, "dtype": weight.dtype, "stype": weight.stype}
        return mx.nd.zeros(weight.shape, **zeros), mx.nd.zeros(weight.shape, **zeros)

    def _rescale_array(self, ctx: Any) -> Any:
        # The operator takes rescale_grad as an array (it skips the step on NaN/Inf/0);
        # keep one per device and value instead of allocating one per update.
        key = (ctx, float(self.rescale_grad))
        array = self._rescale.get(key)
        if array is None:
            array = self._rescale[key] = mx.nd.full((1,), self.rescale_grad, ctx=ctx)
        return array

    def update(self, index: Any, weight: Any, grad: Any, state: Any) -> None:
        self._update_count(index)
        lr = self._get_lr(index)
        wd = self._get_wd(index)
        step_size = 1.0
        if self.correct_bias:
            t = self._index_update_count[index]
            step_size = math.sqrt(1.0 - self.beta2**t) / (1.0 - self.beta1**t)
        mean, var = state
        # adamw_update computes w -= eta * (lr * m / (sqrt(v) + eps) + wd * w): eta carries
        # the learning rate and lr the bias correction, which gives the rule above.
        mx.nd.contrib.adamw_update(
            weight,
            grad,
            mean,
            var,
            self._rescale_array(weight.context),
            lr=step_size,
            eta=lr,
            beta1=self.beta1,
            beta2=self.beta2,
            epsilon=self.epsilon,
            wd=wd,
            clip_gradient=self.clip_gradient if self.clip_gradient is not None else -1.0,
            out=weight,
        )


class Adamax(mx.optimizer.Adamax):
    """MXNet's Adamax (the same parameters and states) without its 0 / 0: a weight whose
    gradients were all 0 so far (an embedding row not yet seen, a dead unit) has a mean and
    a peak of 0, and MXNet's ``m / u`` makes it NaN at the first update. Wherever the peak is
    positive the update is MXNet's, operation for operation."""

    def update(self, index: Any, weight: Any, grad: Any, state: Any) -> None:
        self._update_count(index)
        lr = self._get_lr(index)
        wd = self._get_wd(index)
        lr /= 1.0 - self.beta1 ** self._index_update_count[index]
        grad = grad * self.rescale_grad + wd * weight
        if self.clip_gradient is not None:
            grad = mx.nd.clip(grad, -self.clip_gradient, self.clip_gradient)
        mean, peak = state
        mean[:] *= self.beta1
        mean[:] += (1.0 - self.beta1) * grad
        peak[:] = mx.nd.maximum(self.beta2 * peak, mx.nd.abs(grad))
        weight[:] -= lr * mean / mx.nd.maximum(peak, FLOAT32_TINY)


class SGLD(mx.optimizer.SGLD):
    """MXNet's SGLD, which also runs at a learning rate of 0 (a schedule's last update):
    MXNet draws its noise with a standard deviation of sqrt(lr), and its sampler refuses 0.
    At any other rate the update is MXNet's, operation for operation."""

    def update(self, index: Any, weight: Any, grad: Any, state: Any) -> None:
        self._update_count(index)
        lr = self._get_lr(index)
        if lr == 0:
            return  # the step and the noise are both 0
        wd = self._get_wd(index)
        grad = grad * self.rescale_grad
        if self.clip_gradient is not None:
            grad = mx.nd.clip(grad, -self.clip_gradient, self.clip_gradient)
        weight[:] += -lr / 2 * (grad + wd * weight)
        weight[:] += mx.nd.random.normal(
            0, math.sqrt(lr), shape=weight.shape, dtype=weight.dtype, ctx=weight.context
        )


# MXNet's classes replaced in place (mx.optimizer.register would warn about the override)
mx.optimizer.Optimizer.opt_registry["adamax"] = Adamax
mx.optimizer.Optimizer.opt_registry["sgld"] = SGLD


class _FlushesTinyRates:
    """Mixin of the MXNet schedules mxtrain builds: a learning rate below the config's
    smallest (``MIN_RATE``) is returned as 0. A schedule that decays towards 0 (poly with a
    high power, a factor schedule without floor, a long linear warmup from 0) passes through
    rates that, times ``lr_mult`` and a bias correction, fall below what MXNet's operators
    take as a float32 ("Out of range value for lr") and would stop training there; such a
    rate moves no float32 weight anyway."""

    def __call__(self, num_update: int) -> float:
        lr = super().__call__(num_update)  # type: ignore[misc]
        return lr if lr >= MIN_RATE else 0.0


class FactorScheduler(_FlushesTinyRates, lr_scheduler.FactorScheduler):
    """``lr_scheduler.FactorScheduler`` whose tiny rates are 0 (see _FlushesTinyRates)."""


class MultiFactorScheduler(_FlushesTinyRates, lr_scheduler.MultiFactorScheduler):
    """``lr_scheduler.MultiFactorScheduler`` whose tiny rates are 0."""


class PolyScheduler(_FlushesTinyRates, lr_scheduler.PolyScheduler):
    """``lr_scheduler.PolyScheduler`` whose tiny rates are 0."""


class CosineScheduler(_FlushesTinyRates, lr_scheduler.CosineScheduler):
    """``lr_scheduler.CosineScheduler`` whose tiny rates are 0."""


class _PlateauRates(lr_scheduler.LRScheduler):
    """The rates of ``lr_scheduler.type: plateau``: the warmup, then ``base_lr *
    factor ** reductions`` (never below ``min_lr``). The training loop counts the
    reductions from the evaluations (:class:`mxtrain.metric_tracker.PlateauWatch`) and sets
    :attr:`reductions`; the count is saved in every checkpoint, so a resumed run continues
    at the rate it had."""

    def __init__(self, factor: float, min_lr: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.factor = factor
        self.min_lr = min_lr
        self.reductions = 0

    def __call__(self, num_update: int) -> float:
        if num_update < self.warmup_steps:
            return float(self.get_warmup_lr(num_update))
        return max(self.base_lr * self.factor**self.reductions, self.min_lr)


class PlateauScheduler(_FlushesTinyRates, _PlateauRates):
    """``lr_scheduler.type: plateau`` whose tiny rates are 0."""


#: EpochSchedule's inner scheduler counts thousandths of an epoch
EPOCH_SCALE = 1000


class EpochSchedule(lr_scheduler.LRScheduler):
    """An MXNet learning-rate schedule counted in epochs instead of updates
    (``lr_scheduler.unit: epochs``).

    The training loop tells it where training stands before each batch
    (:meth:`set_training_position`): the wrapped schedule is evaluated at the epochs trained
    so far, a fraction within an epoch, so ``multifactor`` with ``steps: [4]`` decays exactly
    when the fifth epoch starts whatever the number of batches per epoch (a stream iterator
    with random lengths has a different count every epoch). Only local updates call it: the
    module refuses to run it on a kvstore's servers, which never hear the position.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.epochs = 0.0
        self.warmup_steps = 0

    @property
    def base_lr(self) -> float:
        return float(self.inner.base_lr)

    @base_lr.setter
    def base_lr(self, value: float) -> None:  # the optimizer sets its learning rate here
        self.inner.base_lr = value

    def set_training_position(self, epoch: int, batch: int, num_batches: int | None) -> None:
        """The next update follows ``batch`` batches of 0-based ``epoch`` (of
        ``num_batches``). Like MXNet's update counts, the position includes the batch being
        trained, so ``steps: [4]`` (strictly more than 4 epochs) decays from the first batch
        of the fifth epoch on."""
        fraction = (batch + 1) / num_batches if num_batches else 1.0
        self.epochs = epoch + min(fraction, 1.0)

    def __call__(self, num_update: int) -> float:
        # the inner scheduler was built on thousandths of an epoch (build_lr_scheduler)
        return float(self.inner(self.epochs * EPOCH_SCALE))
