"""optimizer.clip_global_norm and epoch-counted lr schedules in the module."""

from __future__ import annotations

import math

import mxnet as mx
import numpy as np
import pytest
from batch_helpers import ArrayBatch, initialised_module
from float_bounds import assert_close_at_scale, chunked_sum_of_squares_bound, gamma

from mxtrain.build import build_lr_scheduler
from mxtrain.config.schema import LrSchedulerSection
from mxtrain.engine.bucketing import BucketingModule
from mxtrain.optimizers import EpochSchedule

ROWS, FEATURES = 8, 5


def _sym_gen(_key: int):  # type: ignore[no-untyped-def]
    data = mx.sym.Variable("data")
    label = mx.sym.Variable("label")
    out = mx.sym.FullyConnected(data, num_hidden=3, name="fc")
    loss = mx.sym.MakeLoss(mx.sym.sum(mx.sym.square(out - label), axis=1), name="loss")
    return loss, ("data",), ("label",)


def _trained(devices: int, clip: float | None, kvstore: str | None = "local") -> dict:
    module, start = initialised_module(_sym_gen, devices, ROWS, FEATURES, 3)
    module.init_optimizer(
        kvstore=kvstore,
        optimizer="sgd",
        optimizer_params={"learning_rate": 0.5},
        update_on_kvstore=False if devices > 1 else None,
        clip_global_norm=clip,
    )
    rng = np.random.default_rng(1)
    batch = ArrayBatch(rng.normal(size=(ROWS, FEATURES)) * 10, rng.normal(size=(ROWS, 3)))
    module.forward_backward(batch)
    grads = {n: module.grad_array(n).asnumpy() for n in module.param_names}
    module.update()
    after = {k: v.asnumpy() for k, v in module.get_params()[0].items()}
    return {"start": start, "grads": grads, "after": after, "norm": module.take_grad_norm()}


def test_update_is_scaled_to_the_bound() -> None:
    result = _trained(1, clip=0.25)
    rescale = 1.0 / ROWS
    raw = np.sqrt(sum(float((g**2).sum()) for g in result["grads"].values())) * rescale
    assert raw > 0.25  # the bound bites
    # the same float32 gradients: n squares summed in float32 are within gamma(n) (any order),
    # sqrt halves that, sqrt's rounding adds u and the rescale (1/8) is exact
    values = sum(g.size for g in result["grads"].values())
    assert result["norm"] == pytest.approx(raw, rel=gamma(values))
    step = {k: result["start"][k] - result["after"][k] for k in result["start"]}
    applied = np.sqrt(sum(float((s**2).sum()) for s in step.values())) / 0.5
    # off by the clipping's own 1e-6 guard (0.25 / (norm + 1e-6): < 4e-6 relative here) and by
    # start - after losing u * |weight| (|weight| <= ~1) against steps of ~0.03: ~1e-5 at most
    assert applied == pytest.approx(0.25, rel=1e-4)


def test_devices_clip_alike() -> None:
    one, two = _trained(1, clip=0.25), _trained(2, clip=0.25)
    # two devices sum half-batch gradients: other roundings over the rows, features and the
    # norm's squares, no amplification (a stated condition factor, see float_bounds)
    roundings = ROWS + FEATURES + sum(g.size for g in one["grads"].values())
    for name in one["after"]:
        assert_close_at_scale(two["after"][name], one["after"][name], roundings=roundings)
    assert one["norm"] == pytest.approx(two["norm"], rel=2 * gamma(roundings))


def test_a_large_bound_changes_nothing() -> None:
    clipped, plain = _trained(1, clip=1e9), _trained(1, clip=None)
    for name in plain["after"]:
        np.testing.assert_array_equal(clipped["after"][name], plain["after"][name])
    assert plain["norm"] is None


def test_updates_on_the_kvstore_are_refused() -> None:
    module = BucketingModule(_sym_gen, 1, [mx.cpu(0), mx.cpu(1)])
    module.bind([("data", (ROWS, FEATURES))], [("label", (ROWS, 3))])
    module.init_params(mx.init.Uniform(1.0))
    with pytest.raises(ValueError, match="updates on the workers"):
        module.init_optimizer(kvstore="local", update_on_kvstore=True, clip_global_norm=1.0)


def _schedule(steps: tuple[float, ...] = (4, 5)) -> tuple[EpochSchedule, mx.optimizer.Optimizer]:
    spec = LrSchedulerSection(type="multifactor", steps=steps, factor=0.5, unit="epochs")
    schedule = build_lr_scheduler(spec, 2.0)
    assert isinstance(schedule, EpochSchedule)
    return schedule, mx.optimizer.create("sgd", learning_rate=2.0, lr_scheduler=schedule)


def test_epoch_schedule_follows_the_position() -> None:
    schedule, opt = _schedule()
    assert schedule.base_lr == 2.0  # the optimizer's learning rate is the schedule's base
    lrs = []
    for epoch in range(7):
        schedule.set_training_position(epoch, 3, 10)
        lrs.append(opt.learning_rate)
    assert lrs == [2.0, 2.0, 2.0, 2.0, 1.0, 0.5, 0.5]


@pytest.mark.parametrize(
    ("epoch", "batch", "lr"), [(3, 9, 2.0), (4, 0, 1.0), (3, 0, 2.0), (5, 0, 0.5)]
)
def test_epoch_schedule_decays_at_the_epoch_boundary(epoch: int, batch: int, lr: float) -> None:
    schedule, opt = _schedule()  # fresh, as after a resume
    schedule.set_training_position(epoch, batch, 10)
    assert opt.learning_rate == lr


@pytest.mark.parametrize(
    ("epoch", "batch", "lr"),
    [(0, 6, 2.0), (0, 7, 1.0), (0, 9, 1.0), (1, 9, 1.0), (2, 0, 0.5), (5, 5, 0.5)],
)
def test_epoch_steps_may_be_fractions(epoch: int, batch: int, lr: float) -> None:
    """steps: [0.75, 2]: the first decay three quarters into the first epoch (the batch
    that completes 0.8 of it trains at the lower lr), the second when the third starts."""
    schedule, opt = _schedule((0.75, 2))
    schedule.set_training_position(epoch, batch, 10)
    assert opt.learning_rate == lr


#: sizes around the chunk boundaries of sum_of_squares (one value, under one chunk, exactly
#: one, three, two and a tail of 17) and the default LM's 10,001 x 400 embedding gradient
SQUARES_SIZES = [1, 1000, 262144, 262144 * 3, 262144 * 2 + 17, 10001 * 400]


def _sum_of_squares_of(values: np.ndarray) -> float:
    from mxtrain.engine.step import sum_of_squares

    return float(sum_of_squares(mx.nd.array(values).reshape((values.size, 1))).asscalar())


@pytest.mark.parametrize("size", SQUARES_SIZES)
def test_sum_of_squares_counts_every_chunk_and_the_tail_once(size: int) -> None:
    """Values in {-2, -1, 1, 2}: every square is 1 or 4 and every partial sum an integer
    below 2**24, so float32 adds them exactly in any order on any CPU; a chunk or the tail
    left out or counted twice changes the total (no chunk sums to zero)."""
    values = np.random.default_rng(size).choice(np.array([-2, -1, 1, 2], "float32"), size)
    assert 4 * size < 2**24  # the largest possible total is still an exact float32 integer
    assert _sum_of_squares_of(values) == int((values.astype("int64") ** 2).sum())


@pytest.mark.parametrize("size", SQUARES_SIZES)
def test_sum_of_squares_is_within_the_rounding_bound(size: int) -> None:
    """On random normal values the float32 result is within the worst-case rounding bound of
    its summation structure; the observed error (~1e-7 to ~1e-6) differs per CPU and BLAS
    kernel, so it is not the tolerance."""
    from mxtrain.engine.step import SQUARES_CHUNK

    values = np.random.default_rng(size).normal(size=(size,)).astype("float32")
    # float32 squares are exact in float64 (48 significant bits) and fsum rounds their sum
    # once, 2**-53 relative: nothing next to the bound
    exact = math.fsum(np.square(values.astype("float64")).tolist())
    bound = chunked_sum_of_squares_bound(size, SQUARES_CHUNK)
    assert abs(_sum_of_squares_of(values) - exact) <= bound * exact
