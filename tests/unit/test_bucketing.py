"""Our BucketingModule against MXNet's: same numbers, shared memory, frozen parameters."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import ctypes
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mxnet as mx
import numpy as np
import pytest

from mxtrain.engine.bucketing import BucketingModule
from mxtrain.engine.shapes import key_fits, largest_key, split_batch
from mxtrain.run.checkpoint import write_params_file
from mxtrain.run.params import read_params

VOCAB = 50
HIDDEN = 16
BATCH = 4
BUCKETS = (5, 8, 12)


def lstm_sym_gen(seq_len: int) -> tuple[Any, tuple[str, ...], tuple[str, ...]]:
    """Tiny 2-layer LSTM language model, unrolled to ``seq_len``."""
    data = mx.sym.Variable("data")
    label = mx.sym.Variable("softmax_label")
    embed = mx.sym.Embedding(data, input_dim=VOCAB, output_dim=HIDDEN, name="embed")
    stack = mx.rnn.SequentialRNNCell()
    for i in range(2):
        stack.add(mx.rnn.LSTMCell(num_hidden=HIDDEN, prefix=f"lstm_l{i}_"))
    outputs, _ = stack.unroll(seq_len, inputs=embed, merge_outputs=True)
    pred = mx.sym.Reshape(outputs, shape=(-1, HIDDEN))
    pred = mx.sym.FullyConnected(pred, num_hidden=VOCAB, name="pred")
    label = mx.sym.Reshape(label, shape=(-1,))
    out = mx.sym.SoftmaxOutput(pred, label, name="softmax")
    return out, ("data",), ("softmax_label",)


def make_batch(rng: np.random.RandomState, key: int, batch: int = BATCH, pad: int = 0) -> Any:
    data = mx.nd.array(rng.randint(0, VOCAB, (batch, key)))
    label = mx.nd.array(rng.randint(0, VOCAB, (batch, key)))
    return mx.io.DataBatch(
        [data],
        [label],
        pad=pad,
        bucket_key=key,
        provide_data=[mx.io.DataDesc("data", (batch, key))],
        provide_label=[mx.io.DataDesc("softmax_label", (batch, key))],
    )


def make_batches(n: int, seed: int = 0) -> list[Any]:
    rng = np.random.RandomState(seed)
    batches = [make_batch(rng, int(rng.choice(BUCKETS))) for _ in range(n)]
    # a padded last batch and a short batch (other batch size: executors get reshaped)
    batches.append(make_batch(rng, 8, pad=2))
    batches.append(make_batch(rng, 5, batch=2))
    batches.append(make_batch(rng, 12, batch=2))
    batches.append(make_batch(rng, 12))
    return batches


def shapes(key: int, batch: int = BATCH) -> tuple[list[Any], list[Any]]:
    return [("data", (batch, key))], [("softmax_label", (batch, key))]


def initial_params(seed: int = 7, sym_gen: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
    mx.random.seed(seed)
    mod = mx.mod.Module(*(sym_gen or lstm_sym_gen)(12))
    mod.bind(*shapes(12))
    mod.init_params(mx.init.Xavier(magnitude=2.5))
    arg, aux = mod.get_params()
    return {k: v.copy() for k, v in arg.items()}, {k: v.copy() for k, v in aux.items()}


def assert_params_close(a: dict[str, Any], b: dict[str, Any], **tol: float) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_allclose(a[name].asnumpy(), b[name].asnumpy(), err_msg=name, **tol)


TOL = {"rtol": 1e-5, "atol": 1e-6}


def train(
    mod: Any,
    batches: Sequence[Any],
    params: tuple[dict, dict],
    kvstore: str,
    optimizer: str,
    opt_params: dict,
    default_key: int = 12,
    metric: Any = None,
) -> None:
    mod.bind(*shapes(default_key))
    mod.set_params(*params)
    mod.init_optimizer(kvstore=kvstore, optimizer=optimizer, optimizer_params=opt_params)
    for batch in batches:
        mod.forward(batch, is_train=True)
        mod.backward()
        mod.update()
        if metric is not None:
            mod.update_metric(metric, batch.label)


OPTIMIZERS = {
    "sgd": {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-3},
    "adam": {"learning_rate": 0.01, "wd": 1e-4},
}

ONE = [mx.cpu(0)]
TWO = [mx.cpu(0), mx.cpu(1)]


@pytest.mark.parametrize(
    ("contexts", "kvstore", "optimizer", "work_load", "update_on_kv"),
    [
        (ONE, "local", "sgd", None, "1"),
        (ONE, "local", "adam", None, "1"),
        (TWO, "local", "sgd", None, "1"),
        (TWO, "device", "sgd", None, "1"),
        (TWO, "local", "adam", [1, 2], "1"),
        (TWO, "device", "adam", None, "1"),
        (TWO, "local", "sgd", None, "0"),  # gradients aggregated, updated on each device
    ],
    ids=["1dev-sgd", "1dev-adam", "2dev-local-sgd", "2dev-device-sgd", "2dev-local-adam-w12",
         "2dev-device-adam", "2dev-local-sgd-no-kv-update"],
)  # fmt: skip
def test_training_matches_stock(
    contexts: list[Any],
    kvstore: str,
    optimizer: str,
    work_load: list[float] | None,
    update_on_kv: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MXNET_UPDATE_ON_KVSTORE", update_on_kv)
    params = initial_params()
    batches = make_batches(30)
    opt_params = OPTIMIZERS[optimizer]

    stock = mx.mod.BucketingModule(
        lstm_sym_gen, default_bucket_key=12, context=contexts, work_load_list=work_load
    )
    stock_metric = mx.metric.Perplexity(None)
    train(stock, batches, params, kvstore, optimizer, opt_params, metric=stock_metric)

    ours = BucketingModule(lstm_sym_gen, 12, contexts, work_load_list=work_load)
    our_metric = mx.metric.Perplexity(None)
    train(ours, batches, params, kvstore, optimizer, opt_params, metric=our_metric)

    assert ours.update_on_kvstore == (len(contexts) > 1 and update_on_kv == "1")
    assert (ours.kvstore is None) == (len(contexts) == 1)
    assert sorted(ours.bucket_keys) == sorted(BUCKETS)
    stock_arg, stock_aux = stock.get_params()
    our_arg, our_aux = ours.get_params()
    assert_params_close(our_arg, stock_arg, **TOL)
    assert_params_close(our_aux, stock_aux, **TOL)
    # training moved the parameters (the comparison is not between two untouched copies)
    assert not np.allclose(our_arg["pred_weight"].asnumpy(), params[0]["pred_weight"].asnumpy())
    np.testing.assert_allclose(our_metric.get()[1], stock_metric.get()[1], rtol=1e-5)

    # eval-mode forward of every bucket gives the same outputs
    for batch in [*make_batches(3, seed=1)[:3], make_batch(np.random.RandomState(2), 5)]:
        stock.forward(batch, is_train=False)
        ours.forward(batch, is_train=False)
        (ref,) = stock.get_outputs()
        (out,) = ours.get_outputs()
        assert out.shape == (batch.data[0].shape[0] * batch.bucket_key, VOCAB)
        np.testing.assert_allclose(out.asnumpy(), ref.asnumpy(), **TOL)
        assert ours.output_shapes == stock.output_shapes
        assert ours.curr_bucket_key == batch.bucket_key


@pytest.mark.parametrize("initializer", [None, mx.init.Xavier(factor_type="in", magnitude=2)])
def test_initial_params_match_stock(initializer: Any) -> None:
    kwargs = {} if initializer is None else {"initializer": initializer}
    mx.random.seed(123)
    stock = mx.mod.BucketingModule(lstm_sym_gen, default_bucket_key=12, context=TWO)
    stock.bind(*shapes(12))
    stock.init_params(**kwargs)
    mx.random.seed(123)
    ours = BucketingModule(lstm_sym_gen, 12, TWO)
    ours.bind(*shapes(12))
    ours.init_params(**kwargs)
    for ref, got in zip(stock.get_params(), ours.get_params(), strict=True):
        assert sorted(ref) == sorted(got)
        for name in ref:
            np.testing.assert_array_equal(got[name].asnumpy(), ref[name].asnumpy(), name)
    # and the values reached both devices
    for name, arrays in ours.store.params.items():
        np.testing.assert_array_equal(arrays[0].asnumpy(), arrays[1].asnumpy(), name)


def test_fixed_params_are_frozen() -> None:
    mod = BucketingModule(
        lstm_sym_gen,
        12,
        mx.cpu(),
        fixed_param_patterns=["lstm_l0_*", "embed_*"],
        fixed_param_exclude=["*_bias"],
    )
    frozen = {"lstm_l0_i2h_weight", "lstm_l0_h2h_weight", "embed_weight"}
    assert set(mod.fixed_param_names) == frozen
    before = initial_params()
    train(mod, make_batches(6), before, "local", "sgd", OPTIMIZERS["sgd"])
    after, _ = mod.get_params()
    for name in mod.param_names:
        same = np.array_equal(after[name].asnumpy(), before[0][name].asnumpy())
        assert same == (name in frozen), name
    # no gradient memory for frozen parameters, in any bucket, except a fully connected
    # layer's weight whose trained bias needs it (see the next test); none is stored
    gating = {"lstm_l0_i2h_weight", "lstm_l0_h2h_weight"}
    for key in mod.bucket_keys:
        grad_dict = mod.pool.buckets[key].execs[0].grad_dict
        assert all((grad_dict.get(n) is None) == (n not in gating) for n in frozen)
    assert all(mod.grad_array(n) is None for n in frozen)


@pytest.mark.parametrize("default_key", [12, 8], ids=["shared-memory", "own-memory-bucket"])
def test_a_fixed_weight_does_not_freeze_its_layers_bias(default_key: int) -> None:
    """MXNet 1.9.1's oneDNN FullyConnected skips the bias gradient when the weight has none:
    fixing an LSTM's input weights must still train their biases. The reference trains every
    parameter with the fixed weights' learning rate 0 (plain SGD: the weights stay put)."""
    fixed = ["lstm_l0_i2h_weight", "lstm_l0_h2h_weight"]
    batches = make_batches(6)
    params = initial_params()
    opt = {"learning_rate": 0.1}
    ours = BucketingModule(lstm_sym_gen, default_key, mx.cpu(), fixed_param_patterns=fixed)
    train(ours, batches, params, "local", "sgd", opt, default_key=default_key)
    stock = mx.mod.BucketingModule(
        lambda key: lstm_sym_gen(key), default_bucket_key=default_key, context=mx.cpu()
    )
    stock.bind(*shapes(default_key))
    stock.set_params(*params)
    stock.init_optimizer(kvstore="local", optimizer="sgd", optimizer_params=opt)
    stock._curr_module._optimizer.set_lr_mult(dict.fromkeys(fixed, 0.0))
    for batch in batches:
        stock.forward(batch, is_train=True)
        stock.backward()
        stock.update()
    got, want = ours.get_params()[0], stock.get_params()[0]
    assert_params_close(got, want, **TOL)
    for name in ("lstm_l0_i2h_bias", "lstm_l0_h2h_bias"):
        assert not np.array_equal(got[name].asnumpy(), params[0][name].asnumpy()), name
    for name in fixed:
        np.testing.assert_array_equal(got[name].asnumpy(), params[0][name].asnumpy(), name)


@pytest.mark.parametrize(
    ("patterns", "exclude", "bad"),
    [(["lstm_l0_*", "decoder_*"], [], "decoder_*"), (["lstm_*"], ["*_gamma"], "*_gamma")],
)
def test_fixed_pattern_matching_nothing_is_an_error(
    patterns: list[str], exclude: list[str], bad: str
) -> None:
    with pytest.raises(ValueError) as err:
        BucketingModule(
            lstm_sym_gen,
            12,
            mx.cpu(),
            fixed_param_patterns=patterns,
            fixed_param_exclude=exclude,
        )
    message = str(err.value)
    assert repr(bad) in message
    assert "pred_weight" in message and "lstm_l1_h2h_bias" in message


def test_bucket_larger_than_default_gets_own_memory_and_trains(
    caplog: pytest.LogCaptureFixture,
) -> None:
    params = initial_params()
    rng = np.random.RandomState(3)
    batches = [make_batch(rng, k) for k in (8, 12, 5, 12, 8, 12)]
    stock = mx.mod.BucketingModule(lstm_sym_gen, default_bucket_key=8, context=TWO)
    train(stock, batches, params, "local", "sgd", OPTIMIZERS["sgd"], default_key=8)

    ours = BucketingModule(lstm_sym_gen, 8, TWO, logger=logging.getLogger("test.bucketing"))
    with caplog.at_level(logging.WARNING, logger="test.bucketing"):
        train(ours, batches, params, "local", "sgd", OPTIMIZERS["sgd"], default_key=8)
    warnings = [r for r in caplog.records if "larger than the default" in r.getMessage()]
    assert len(warnings) == 1  # once, although bucket 12 was used three times
    assert not ours.pool.buckets[12].shares_memory and ours.pool.buckets[5].shares_memory
    assert_params_close(ours.get_params()[0], stock.get_params()[0], **TOL)

    # the big bucket uses the very same parameter memory, but not the default's input buffers
    big, default = ours.pool.buckets[12], ours.pool.buckets[8]
    for i in range(2):
        for name in ours.param_names:
            assert _ptr(big.execs[i].arg_dict[name]) == _ptr(default.execs[i].arg_dict[name])
        assert _ptr(big.execs[i].arg_dict["data"]) != _ptr(default.execs[i].arg_dict["data"])


def test_a_larger_batch_of_a_shorter_bucket_is_explained(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Bucket 5 fits the default bucket 12's length; a batch of 16 rows needs more values than
    the default's 4 rows: the warning says so instead of asking for a larger default key."""
    ours = BucketingModule(lstm_sym_gen, 12, ONE, logger=logging.getLogger("test.bucketing"))
    ours.bind(*shapes(12))
    ours.set_params(*initial_params())
    with caplog.at_level(logging.WARNING, logger="test.bucketing"):
        ours.forward(make_batch(np.random.RandomState(0), 5, batch=16), is_train=False)
    messages = [r.getMessage() for r in caplog.records]
    (warning,) = [m for m in messages if "than the default bucket" in m]
    assert warning.startswith("bucket 5 needs more input memory than the default bucket 12")
    assert "160 values against the default bucket's 96" in warning, warning
    assert "data 16x5, softmax_label 16x5 against data 4x12, softmax_label 4x12" in warning
    assert "a larger batch" in warning and "largest_key" not in warning


def _ptr(arr: Any) -> int | None:
    """Address of an NDArray's memory (NDArray handles differ even when memory is shared)."""
    arr.wait_to_read()
    ptr = ctypes.c_void_p()
    mx.base.check_call(mx.base._LIB.MXNDArrayGetData(arr.handle, ctypes.byref(ptr)))
    return ptr.value


def test_smaller_buckets_share_memory_with_default() -> None:
    mod = BucketingModule(lstm_sym_gen, 12, TWO)
    mod.bind(*shapes(12))
    mod.init_params()
    for key in (5, 8):
        mod.pool.switch(key, *shapes(key))
    mod.prepare(make_batch(np.random.RandomState(0), 7))  # bound ahead, not made current
    assert mod.curr_bucket_key == 8
    assert mod.bucket_keys == [12, 5, 8, 7]
    default = mod.pool.buckets[12]
    for key in (5, 8, 7):
        bucket = mod.pool.buckets[key]
        assert bucket.shares_memory
        for i in range(2):
            small, big = bucket.execs[i], default.execs[i]
            for name in mod.param_names:
                assert _ptr(small.arg_dict[name]) == _ptr(big.arg_dict[name]), name
                assert _ptr(small.grad_dict[name]) == _ptr(big.grad_dict[name]), name
            # inputs are views of the default bucket's input buffers
            assert _ptr(small.arg_dict["data"]) == _ptr(big.arg_dict["data"])
            # a write through the default bucket is seen by the small one
            big.arg_dict["pred_bias"][:] = float(key + i)
            assert small.arg_dict["pred_bias"].asnumpy()[0] == float(key + i)


def test_save_params_is_stock_format(tmp_path: Any) -> None:
    params = initial_params()
    mod = BucketingModule(lstm_sym_gen, 12, mx.cpu())
    train(mod, make_batches(3), params, "local", "sgd", OPTIMIZERS["sgd"])
    prefix = str(tmp_path / "lm")
    write_params_file(Path(f"{prefix}-0001.params"), *mod.get_params())
    saved = mx.nd.load(f"{prefix}-0001.params")
    assert sorted(saved) == sorted(f"arg:{n}" for n in mod.param_names)
    assert not list(tmp_path.glob("*.tmp-*"))

    lstm_sym_gen(12)[0].save(f"{prefix}-symbol.json")
    stock = mx.mod.Module.load(prefix, 1, data_names=("data",), label_names=("softmax_label",))
    stock.bind(*shapes(12), for_training=False)
    assert_params_close(stock.get_params()[0], mod.get_params()[0], rtol=0, atol=0)

    other = BucketingModule(lstm_sym_gen, 12, TWO)
    other.bind(*shapes(12), for_training=False)
    other.set_params(*read_params(f"{prefix}-0001.params"))
    assert_params_close(other.get_params()[0], mod.get_params()[0], rtol=0, atol=0)

    mx.nd.save(str(tmp_path / "bad.params"), {"weird:x": mx.nd.zeros(1)})
    with pytest.raises(ValueError, match="weird:x"):
        other.set_params(*read_params(tmp_path / "bad.params"))
    with pytest.raises(ValueError, match="not in the network"):
        other.set_params({**params[0], "extra_weight": mx.nd.zeros(1)}, {})
    without_bias = {k: v for k, v in params[0].items() if k != "pred_bias"}
    with pytest.raises(RuntimeError, match="pred_bias"):
        other.set_params(without_bias, {})
    # allow_missing keeps the current (trained) value of what is missing
    other.set_params(without_bias, {}, allow_missing=True)
    arg = other.get_params()[0]
    np.testing.assert_array_equal(arg["pred_bias"].asnumpy(), saved["arg:pred_bias"].asnumpy())
    np.testing.assert_array_equal(arg["pred_weight"].asnumpy(), params[0]["pred_weight"].asnumpy())


def test_set_params_after_init_optimizer_reaches_kvstore() -> None:
    """With update_on_kvstore the kvstore holds the weights: set_params must refresh them."""
    params = initial_params()
    mod = BucketingModule(lstm_sym_gen, 12, TWO)
    train(mod, make_batches(2), params, "local", "sgd", {"learning_rate": 0.1})
    assert mod.update_on_kvstore
    mod.set_params(*params)
    batch = make_batches(1)[0]
    mod.forward_backward(batch)
    mod.update()

    ref = BucketingModule(lstm_sym_gen, 12, TWO)
    train(ref, [batch], params, "local", "sgd", {"learning_rate": 0.1})
    assert_params_close(mod.get_params()[0], ref.get_params()[0], **TOL)


def mlp_sym_gen(key: int) -> tuple[Any, tuple[str, ...], tuple[str, ...]]:
    """(batch, key, 3) -> per-step dense + BatchNorm -> mean over steps -> dense regression."""
    data = mx.sym.Variable("data")
    hidden = mx.sym.FullyConnected(data, num_hidden=6, flatten=False, name="fc1")
    hidden = mx.sym.BatchNorm(hidden, axis=-1, name="bn")
    pooled = mx.sym.mean(mx.sym.tanh(hidden), axis=1)
    out = mx.sym.FullyConnected(pooled, num_hidden=3, name="fc2")
    return mx.sym.LinearRegressionOutput(out, name="lro"), ("data",), ("lro_label",)


def flat_sym_gen(key: int) -> tuple[Any, tuple[str, ...], tuple[str, ...]]:
    """fc1's weight shape depends on the bucket: buckets cannot share it."""
    out = mx.sym.FullyConnected(mx.sym.Variable("data"), num_hidden=3, name="fc1")
    return mx.sym.LinearRegressionOutput(out, name="lro"), ("data",), ("lro_label",)


class CollectShapes:
    """Our metrics' protocol: update(labels, preds) with lists of NDArrays."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def update(self, labels: list[Any], preds: list[Any]) -> None:
        self.calls.append((labels[0].shape[0], preds[0].shape[0]))


def test_input_grads_aux_states_and_custom_metric_match_stock() -> None:
    rng = np.random.RandomState(5)
    batches = [
        mx.io.DataBatch(
            [mx.nd.array(rng.randn(6, key, 3))],
            [mx.nd.array(rng.randn(6, 3))],
            bucket_key=key,
            provide_data=[("data", (6, key, 3))],
            provide_label=[("lro_label", (6, 3))],
        )
        for key in (4, 2, 4, 3, 2)
    ]

    def run(mod: Any) -> tuple[Any, list[Any]]:
        mx.random.seed(11)
        mod.bind([("data", (6, 4, 3))], [("lro_label", (6, 3))], inputs_need_grad=True)
        mod.init_params(mx.init.Xavier())
        mod.init_optimizer("local", "sgd", {"learning_rate": 0.05, "momentum": 0.5})
        grads = []
        for b in batches:
            mod.forward_backward(b)
            grads.append(mod.get_input_grads()[0].asnumpy())
            mod.update()
        return mod.get_params(), grads

    stock = mx.mod.BucketingModule(mlp_sym_gen, 4, context=TWO, work_load_list=[2, 1])
    ours = BucketingModule(mlp_sym_gen, 4, TWO, work_load_list=[2, 1])
    (ref_arg, ref_aux), ref_grads = run(stock)
    (arg, aux), grads = run(ours)
    assert_params_close(arg, ref_arg, **TOL)
    assert_params_close(aux, ref_aux, **TOL)  # BatchNorm statistics, averaged over devices
    for got, ref in zip(grads, ref_grads, strict=True):
        assert got.shape == ref.shape
        np.testing.assert_allclose(got, ref, **TOL)

    metric = CollectShapes()
    ours.update_metric(metric, batches[-1].label)
    assert metric.calls == [(4, 4), (2, 2)]  # one call per device, work load 2:1

    # explicit output gradients are split over devices like the batch
    ours.forward(batches[0], is_train=True)
    ours.backward([mx.nd.ones((6, 3))])

    # a parameter whose shape depends on the bucket cannot be shared: clear error
    bad = BucketingModule(flat_sym_gen, 4, mx.cpu())
    bad.bind([("data", (6, 4))], [("lro_label", (6, 3))])
    bad.init_params()
    with pytest.raises(ValueError, match="fc1_weight"):
        bad.pool.switch(2, [("data", (6, 2))], [("lro_label", (6, 3))])


def test_inference_binding_and_errors() -> None:
    mod = BucketingModule(lstm_sym_gen, 12, mx.cpu())
    with pytest.raises(RuntimeError, match="bind"):
        mod.init_params()
    mod.bind(*shapes(12), for_training=False)
    assert mod.label_shapes == [("softmax_label", (BATCH, 12))]
    assert all(g is None for g in mod.pool.buckets[12].execs[0].grad_arrays)
    with pytest.raises(RuntimeError, match="init_params"):
        mod.forward(make_batch(np.random.RandomState(0), 5))
    mod.set_params(*initial_params())
    batch = make_batch(np.random.RandomState(0), 5)
    mod.forward(batch)
    assert mod.get_outputs()[0].shape == (BATCH * 5, VOCAB)
    with pytest.raises(RuntimeError, match="inference"):
        mod.backward()
    with pytest.raises(RuntimeError, match="inference"):
        mod.init_optimizer()
    with pytest.raises(ValueError, match="data names"):
        BucketingModule(lstm_sym_gen, 12).bind([("tokens", (BATCH, 12))])


def test_force_rebind_keeps_params_and_reshaped_default_still_shares() -> None:
    params = initial_params()
    mod = BucketingModule(lstm_sym_gen, 12, TWO)
    train(mod, make_batches(4), params, "local", "sgd", OPTIMIZERS["sgd"])
    trained = mod.get_params()[0]
    mod.bind(*shapes(12), for_training=False, force_rebind=True)
    assert mod.bucket_keys == [12]
    assert_params_close(mod.get_params()[0], trained, rtol=0, atol=0)

    # a short batch of the default key reshapes it; later buckets still share the first binding
    rng = np.random.RandomState(4)
    mod.forward(make_batch(rng, 12, batch=2))
    assert mod.data_shapes == [("data", (2, 12))]
    assert mod.get_outputs()[0].shape == (2 * 12, VOCAB)
    mod.forward(make_batch(rng, 8))
    assert mod.pool.buckets[8].shares_memory
    mod.forward(make_batch(rng, 12))
    assert mod.data_shapes == [("data", (BATCH, 12))]
    # back to the first executors, not a new reshape
    assert mod.pool.buckets[12] is mod.pool.default
    # no provide_label: label shapes follow the data's batch size
    short = make_batch(rng, 8, batch=3)
    short.provide_label = None
    mod.forward(short)
    assert mod.label_shapes == [("softmax_label", (3, 8))]


def test_key_helpers() -> None:
    assert largest_key([5, 12, 8]) == 12
    assert largest_key([(5, 9), (8, 4), (2, 2)]) == (8, 9)
    assert key_fits(5, 12) and not key_fits(13, 12)
    assert key_fits((5, 9), (8, 9)) and not key_fits((9, 1), (8, 9))
    assert key_fits("a", "b")  # no order: decided by input sizes
    with pytest.raises(ValueError):
        largest_key([(1, 2), 3])
    with pytest.raises(ValueError):
        largest_key([])
    assert split_batch(4, [1, 1]) == [slice(0, 2), slice(2, 4)]
    assert split_batch(5, [1, 1, 1]) == [slice(0, 2), slice(2, 4), slice(4, 5)]
    assert split_batch(4, [1, 3]) == [slice(0, 1), slice(1, 4)]
    with pytest.raises(ValueError):
        split_batch(1, [1, 1])


def test_kvstore_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MXNET_UPDATE_ON_KVSTORE", raising=False)
    params = initial_params()

    def module(contexts: list[Any]) -> BucketingModule:
        mod = BucketingModule(lstm_sym_gen, 12, contexts)
        mod.bind(*shapes(12))
        mod.set_params(*params)
        return mod

    one = module(ONE)
    one.init_optimizer("local", "sgd", {"learning_rate": 0.1})
    assert one.kvstore is None and not one.update_on_kvstore and one.updater is not None
    assert one.optimizer.rescale_grad == pytest.approx(1 / BATCH)
    assert one.optimizer.idx2name == dict(enumerate(one.param_names))

    one = module(ONE)
    one.init_optimizer("local", "sgd", update_on_kvstore=True)
    assert one.kvstore is not None and one.update_on_kvstore
    assert one.updater is one.kvstore._updater

    two = module(TWO)
    kv = mx.kv.create("device")
    two.init_optimizer(kv, "adam", {"learning_rate": 0.1})
    assert two.kvstore is kv and two.update_on_kvstore

    two = module(TWO)
    with pytest.warns(UserWarning, match="rescale_grad"):
        two.init_optimizer("local", mx.optimizer.SGD(learning_rate=0.1), update_on_kvstore=False)
    assert two.kvstore.type == "local" and not two.update_on_kvstore
    assert two.optimizer.idx2name[2 * 3 + 1] == two.param_names[3]  # index * num_device + k

    with pytest.raises(ValueError, match="needs a kvstore"):
        module(TWO).init_optimizer(None, update_on_kvstore=True)
    with pytest.raises(TypeError):
        module(TWO).init_optimizer(42)
    with pytest.raises(TypeError):
        module(TWO).init_optimizer("local", optimizer=object())


# -- bucket_memory: a bound on what stays bound ---------------------------------------------


def _fused_lm_sym_gen(seq_len: int) -> tuple[Any, tuple[str, ...], tuple[str, ...]]:
    """The fused-RNN LM shape whose per-bucket operator state motivated bucket_memory."""
    data = mx.sym.Variable("data")
    label = mx.sym.Variable("softmax_label")
    embed = mx.sym.Embedding(data, input_dim=VOCAB, output_dim=HIDDEN, name="embed")
    rnn = mx.sym.RNN(
        mx.sym.swapaxes(embed, dim1=0, dim2=1),
        mx.sym.Variable("lstm_parameters", init=mx.init.Uniform(0.1)),
        mx.sym.zeros((1, 0, HIDDEN)),
        mx.sym.zeros((1, 0, HIDDEN)),
        state_size=HIDDEN,
        num_layers=1,
        mode="lstm",
        name="lstm",
    )
    pred = mx.sym.Reshape(mx.sym.swapaxes(rnn, dim1=0, dim2=1), shape=(-1, HIDDEN))
    pred = mx.sym.FullyConnected(pred, num_hidden=VOCAB, name="pred")
    out = mx.sym.SoftmaxOutput(pred, mx.sym.Reshape(label, shape=(-1,)), name="softmax")
    return out, ("data",), ("softmax_label",)


@pytest.mark.parametrize("sym_gen", [lstm_sym_gen, _fused_lm_sym_gen], ids=["unfused", "fused"])
def test_bucket_memory_bounds_bound_buckets_and_keeps_the_numbers(sym_gen: Any) -> None:
    """Unbinding and rebinding buckets changes no number: same parameters and outputs."""
    batches = make_batches(24)
    reference = BucketingModule(sym_gen, 12, ONE)
    train(reference, batches, initial_params(sym_gen=sym_gen), "local", "adam", OPTIMIZERS["adam"])

    bounded = BucketingModule(sym_gen, 12, ONE, bucket_memory=1.5)
    budget = int(1.5 * BATCH * 12)
    bounded.bind(*shapes(12))
    bounded.set_params(*initial_params(sym_gen=sym_gen))
    bounded.init_optimizer(kvstore="local", optimizer="adam", optimizer_params=OPTIMIZERS["adam"])
    for batch in batches:
        bounded.prepare(batch)
        assert bounded.bound_positions <= budget
        bounded.forward_backward(batch)
        bounded.update()
        assert bounded.bound_positions <= budget
    # the buckets came back after being unbound (24 batches over three buckets)
    assert bounded.rebinds > 0
    assert_params_close(bounded.get_params()[0], reference.get_params()[0], rtol=0, atol=0)

    for batch in make_batches(3, seed=1)[:3]:
        reference.forward(batch, is_train=False)
        bounded.forward(batch, is_train=False)
        np.testing.assert_array_equal(
            bounded.get_outputs()[0].asnumpy(), reference.get_outputs()[0].asnumpy()
        )


def test_bucket_memory_keeps_the_current_bucket_and_defers_binding_ahead(
    caplog: pytest.LogCaptureFixture,
) -> None:
    mod = BucketingModule(lstm_sym_gen, 12, ONE, bucket_memory=1.0)
    mod.bind(*shapes(12))
    mod.init_params(mx.init.Xavier())
    rng = np.random.RandomState(0)
    big, small = make_batch(rng, 12), make_batch(rng, 5)
    assert mod.bound_positions == 0  # the first executors hold the store and never run
    mod.forward(big, is_train=False)
    assert mod.bucket_keys == [12]
    # binding ahead would need 12 + 5 positions of 12: it waits for forward
    mod.prepare(small)
    assert mod.bucket_keys == [12] and mod.curr_bucket_key == 12
    with caplog.at_level(logging.INFO, logger="mxtrain.engine.bucketing"):
        mod.forward(small, is_train=False)
    assert mod.bucket_keys == [5]
    assert "unbinding bucket 12, the least used" in caplog.text
    mod.forward(big, is_train=False)
    assert mod.bucket_keys == [12] and mod.rebinds == 1


def test_bucket_memory_unbinds_the_least_used_bucket_first() -> None:
    """Of the buckets bound, the one asked for least often goes, even if it ran last."""
    mod = BucketingModule(lstm_sym_gen, 12, ONE, bucket_memory=2.0)
    mod.bind(*shapes(12))
    mod.init_params(mx.init.Xavier())
    rng = np.random.RandomState(0)
    for length in (8, 8, 8, 8, 5, 12):  # 8 and 5 fit (13 of 24 steps); 12 needs room
        mod.forward(make_batch(rng, length), is_train=False)
    # least recently used would have unbound 8 (used before 5); 5 was used once
    assert sorted(mod.bucket_keys) == [8, 12]
    mod.forward(make_batch(rng, 8), is_train=False)
    assert mod.rebinds == 0


def test_bucket_memory_counts_a_smaller_reshape_in_its_origins_memory() -> None:
    """A short batch reshapes its bucket's executors in place: it holds no positions beyond
    the bucket's own, so it unbinds nothing (counted as origin + reshape, it would unbind 8)."""
    mod = BucketingModule(lstm_sym_gen, 12, ONE, bucket_memory=2.0)  # 96 positions
    mod.bind(*shapes(12))
    mod.init_params(mx.init.Xavier())
    rng = np.random.RandomState(0)
    for batch in (make_batch(rng, 12), make_batch(rng, 8), make_batch(rng, 12, batch=2)):
        mod.forward(batch, is_train=False)
    assert sorted(mod.bucket_keys) == [8, 12]
    assert mod.bound_positions == BATCH * 12 + BATCH * 8
    mod.forward(make_batch(rng, 8), is_train=False)
    assert mod.rebinds == 0


def test_bucket_memory_auto_is_a_loose_bound_that_leaves_the_allocator_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mxtrain.engine import bucket_pool, bucketing

    switched: list[bool] = []
    monkeypatch.setattr(bucket_pool, "return_freed_memory", lambda: switched.append(True))
    mod = BucketingModule(lstm_sym_gen, 12, ONE, bucket_memory="auto")
    mod.bind(*shapes(12))
    mod.init_params(mx.init.Xavier())
    rng = np.random.RandomState(0)
    for length in (12, 5, 8, 9, 11, 10, 2):  # 57 steps of 5 x 12 = 60: all stay bound
        mod.forward(make_batch(rng, length), is_train=False)
    assert sorted(mod.bucket_keys) == [2, 5, 8, 9, 10, 11, 12] and mod.rebinds == 0
    mod.forward(make_batch(rng, 7), is_train=False)
    assert mod.bound_positions <= int(bucketing.AUTO_BUCKET_MEMORY * BATCH * 12)
    assert 7 in mod.bucket_keys
    # the default bound never switches the allocator (a cost per batch), only trims heaps
    assert switched == []
    strict = BucketingModule(lstm_sym_gen, 12, ONE, bucket_memory=1.0)
    strict.bind(*shapes(12))
    strict.init_params(mx.init.Xavier())
    for length in (12, 5, 8):
        strict.forward(make_batch(rng, length), is_train=False)
    assert switched  # a bound the user set: freed memory leaves the process at once


def test_bucket_memory_is_logged_only_where_there_are_buckets_to_bound(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An MLP's or an image model's data has one bucket key: the bound means nothing there,
    so the line stays out of the log; it appears once a second key binds."""
    rng = np.random.RandomState(0)

    def flat_batch(rows: int) -> Any:
        return mx.io.DataBatch(
            [mx.nd.array(rng.uniform(size=(rows, 5)))],
            [mx.nd.array(rng.uniform(size=(rows, 3)))],
            bucket_key=5,
            provide_data=[mx.io.DataDesc("data", (rows, 5))],
            provide_label=[mx.io.DataDesc("lro_label", (rows, 3))],
        )

    with caplog.at_level(logging.INFO, logger="mxtrain.engine.bucketing"):
        mlp = BucketingModule(flat_sym_gen, 5, ONE, bucket_memory="auto")
        mlp.bind([("data", (BATCH, 5))], [("lro_label", (BATCH, 3))])
        mlp.init_params(mx.init.Xavier())
        mlp.init_optimizer("local", "sgd", {"learning_rate": 0.1})
        for rows in (BATCH, BATCH, 2):  # a short last batch reshapes the one bucket
            mlp.forward_backward(flat_batch(rows))
            mlp.update()
    assert "bucket_memory" not in caplog.text

    with caplog.at_level(logging.INFO, logger="mxtrain.engine.bucketing"):
        lm = BucketingModule(lstm_sym_gen, 12, ONE, bucket_memory="auto")
        lm.bind(*shapes(12))
        lm.init_params(mx.init.Xavier())
        for length in (12, 12, 5, 8):
            lm.forward(make_batch(rng, length), is_train=False)
    lines = [r.getMessage() for r in caplog.records if "bucket_memory" in r.getMessage()]
    assert len(lines) == 1
    assert lines[0].startswith("bucket_memory 5: bound buckets hold at most")


def test_bucket_memory_must_fit_the_default_bucket() -> None:
    with pytest.raises(ValueError, match="bucket_memory must be at least 1"):
        BucketingModule(lstm_sym_gen, 12, ONE, bucket_memory=0.5)
    with pytest.raises(ValueError, match="bucket_memory must be at least 1"):
        BucketingModule(lstm_sym_gen, 12, ONE, bucket_memory="lots")


def test_unbound_executors_are_freed_without_the_cyclic_gc() -> None:
    """A bucket that referred to itself stayed alive (with its memory) until a GC pass."""
    import gc
    import weakref

    gc.disable()
    try:
        mod = BucketingModule(lstm_sym_gen, 12, ONE, bucket_memory=1.0)
        mod.bind(*shapes(12))
        mod.init_params(mx.init.Xavier())
        rng = np.random.RandomState(0)
        mod.forward(make_batch(rng, 8), is_train=False)
        gone = weakref.ref(mod.pool.buckets[8])
        mod.forward(make_batch(rng, 12), is_train=False)
        assert gone() is None
    finally:
        gc.enable()
