"""Optimizer state out of and back into our BucketingModule: a resumed run is bit-identical."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import json
from pathlib import Path
from typing import Any

import mxnet as mx
import numpy as np
import pytest

from mxtrain.engine.bucketing import BucketingModule

VOCAB = 30
HIDDEN = 8
BATCH = 4
BUCKETS = (4, 6, 9)
TWO = [mx.cpu(0), mx.cpu(1)]


def sym_gen(seq_len: int) -> tuple[Any, tuple[str, ...], tuple[str, ...]]:
    """Tiny 1-layer LSTM LM with dropout 0.3 (so resuming must replay the random masks)."""
    data = mx.sym.Variable("data")
    label = mx.sym.Variable("softmax_label")
    embed = mx.sym.Embedding(data, input_dim=VOCAB, output_dim=HIDDEN, name="embed")
    embed = mx.sym.Dropout(embed, p=0.3)
    cell = mx.rnn.LSTMCell(num_hidden=HIDDEN, prefix="lstm_")
    outputs, _ = cell.unroll(seq_len, inputs=embed, merge_outputs=True)
    pred = mx.sym.Reshape(mx.sym.Dropout(outputs, p=0.3), shape=(-1, HIDDEN))
    pred = mx.sym.FullyConnected(pred, num_hidden=VOCAB, name="pred")
    out = mx.sym.SoftmaxOutput(pred, mx.sym.Reshape(label, shape=(-1,)), name="softmax")
    return out, ("data",), ("softmax_label",)


def batches(n: int) -> list[Any]:
    rng = np.random.RandomState(3)
    out = []
    for _ in range(n):
        key = int(rng.choice(BUCKETS))
        out.append(
            mx.io.DataBatch(
                [mx.nd.array(rng.randint(0, VOCAB, (BATCH, key)))],
                [mx.nd.array(rng.randint(0, VOCAB, (BATCH, key)))],
                bucket_key=key,
                provide_data=[mx.io.DataDesc("data", (BATCH, key))],
                provide_label=[mx.io.DataDesc("softmax_label", (BATCH, key))],
            )
        )
    return out


def initial_params() -> tuple[dict[str, Any], dict[str, Any]]:
    mx.random.seed(7)
    mod = BucketingModule(sym_gen, max(BUCKETS))
    mod.bind([("data", (BATCH, 9))], [("softmax_label", (BATCH, 9))])
    mod.init_params(mx.init.Xavier(magnitude=2.5))
    return mod.get_params()


CASES = {
    "sgd-momentum": dict(
        contexts=[mx.cpu()],
        kvstore="local",
        update_on_kvstore=None,
        optimizer="sgd",
        params={"learning_rate": 0.5, "momentum": 0.9, "wd": 1e-4},
        scheduler=lambda: mx.lr_scheduler.FactorScheduler(step=3, factor=0.8, base_lr=0.5),
    ),
    "adam": dict(
        contexts=[mx.cpu()],
        kvstore="local",
        update_on_kvstore=None,
        optimizer="adam",
        params={"learning_rate": 0.02},
        scheduler=lambda: mx.lr_scheduler.MultiFactorScheduler(
            step=[4, 9, 13], factor=0.5, base_lr=0.02
        ),
    ),
    "two-devices-kvstore-device": dict(
        contexts=TWO,
        kvstore="device",
        update_on_kvstore=None,  # MXNet's default: the kvstore runs the optimizer
        optimizer="adam",
        params={"learning_rate": 0.02},
        scheduler=lambda: mx.lr_scheduler.FactorScheduler(step=4, factor=0.7, base_lr=0.02),
    ),
    "three-devices-local-updater": dict(
        contexts=[mx.cpu(0), mx.cpu(1), mx.cpu(2)],  # params must not be averaged on save
        kvstore="local",
        update_on_kvstore=False,
        optimizer="adam",
        params={"learning_rate": 0.02},
        scheduler=lambda: mx.lr_scheduler.FactorScheduler(step=4, factor=0.7, base_lr=0.02),
    ),
    "two-devices-local-updater": dict(
        contexts=TWO,
        kvstore="local",
        update_on_kvstore=False,  # one state per (parameter, device): keys index*2+k
        optimizer="sgd",
        params={"learning_rate": 0.5, "momentum": 0.9},
        scheduler=lambda: mx.lr_scheduler.FactorScheduler(step=3, factor=0.8, base_lr=0.5),
    ),
}


def new_module(case: dict[str, Any], params: tuple[dict, dict]) -> BucketingModule:
    mod = BucketingModule(sym_gen, max(BUCKETS), case["contexts"])
    mod.bind([("data", (BATCH, 9))], [("softmax_label", (BATCH, 9))])
    mod.set_params(*params)
    mod.init_optimizer(
        case["kvstore"],
        case["optimizer"],
        {**case["params"], "lr_scheduler": case["scheduler"]()},
        update_on_kvstore=case["update_on_kvstore"],
    )
    return mod


def train(mod: BucketingModule, data: list[Any], first_step: int) -> None:
    for step, batch in enumerate(data, start=first_step):
        mx.random.seed(1000 + step)  # MXNet's RNG state cannot be saved: reseed per batch
        mod.forward_backward(batch)
        mod.update()


def save_states(mod: BucketingModule, folder: Path) -> None:
    arrays, meta = mod.get_optimizer_states()
    arg, aux = mod.get_params()
    mx.nd.save(str(folder / "optimizer.nd"), arrays)
    (folder / "optimizer.json").write_text(json.dumps(meta))
    mx.nd.save(str(folder / "params.nd"), {**arg, **{f"aux:{k}": v for k, v in aux.items()}})


def load_states(folder: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    arrays = mx.nd.load(str(folder / "optimizer.nd"))
    params = mx.nd.load(str(folder / "params.nd"))
    meta = json.loads((folder / "optimizer.json").read_text())
    return dict(arrays or {}), params, meta


def assert_identical(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        assert np.array_equal(a[name].asnumpy(), b[name].asnumpy()), name


@pytest.mark.parametrize("name", list(CASES))
def test_resumed_run_is_bit_identical(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    params = initial_params()
    data = batches(20)

    straight = new_module(case, params)
    train(straight, data[:10], 0)
    lr_at_10 = straight.optimizer.learning_rate
    train(straight, data[10:], 10)

    first = new_module(case, params)
    train(first, data[:10], 0)
    save_states(first, tmp_path)
    del first

    arrays, saved, meta = load_states(tmp_path)
    resumed = new_module(case, params)
    resumed.set_params({k: v for k, v in saved.items() if not k.startswith("aux:")}, {})
    assert resumed.optimizer.learning_rate == case["params"]["learning_rate"]  # fresh schedule
    resumed.set_optimizer_states(arrays, meta)
    assert resumed.optimizer.num_update == 10
    assert resumed.optimizer.learning_rate == lr_at_10
    train(resumed, data[10:], 10)

    assert_identical(resumed.get_params()[0], straight.get_params()[0])
    assert resumed.optimizer.num_update == straight.optimizer.num_update == 20
    assert resumed.optimizer.learning_rate == straight.optimizer.learning_rate
    assert resumed.optimizer.learning_rate < case["params"]["learning_rate"]  # it did decay
    # the restored state keeps what drives Adam's bias correction: per-key update counts
    counts = straight.optimizer._all_index_update_counts
    restored = resumed.optimizer._all_index_update_counts
    for dev, per_key in counts.items():
        for key, n in per_key.items():
            assert restored[dev][key] == n


def test_meta_is_plain_json_and_describes_the_layout() -> None:
    case = CASES["two-devices-local-updater"]
    mod = new_module(case, initial_params())
    train(mod, batches(3), 0)
    arrays, meta = mod.get_optimizer_states()
    assert json.loads(json.dumps(meta)) == meta  # no tuples, no objects: JSON as it is
    assert meta["optimizer"] == "SGD"
    assert meta["key_scheme"] == "index*num_device+device" and meta["num_device"] == 2
    assert meta["num_update"] == 3
    entries = {e["key"]: e for e in meta["entries"]}
    names = mod.param_names
    assert sorted(entries) == list(range(2 * len(names)))
    first = entries[2 * names.index("pred_weight") + 1]
    assert first["param"] == "pred_weight" and first["device"] == 1 and first["count"] == 3
    assert first["count_device"] == 1
    assert first["shape"] == [VOCAB, HIDDEN]
    # momentum: one array per (parameter, device), copied to the CPU
    assert all(a.context == mx.cpu() for a in arrays.values())
    assert len(arrays) == 2 * len(names)
    array_name = first["state"]["array"]
    np.testing.assert_array_equal(
        arrays[array_name].asnumpy(),
        mod.updater.states[first["key"]].asnumpy(),
    )
    # a copy: training on does not change what was taken
    before = arrays[array_name].asnumpy()
    train(mod, batches(1), 3)
    np.testing.assert_array_equal(arrays[array_name].asnumpy(), before)


def test_adam_state_structure_and_nadam_schedule() -> None:
    case = {**CASES["adam"], "optimizer": "nadam", "params": {"learning_rate": 0.01}}
    mod = new_module(case, initial_params())
    train(mod, batches(3), 0)
    arrays, meta = mod.get_optimizer_states()
    assert meta["optimizer"] == "Nadam"
    state = meta["entries"][0]["state"]
    assert list(state) == ["tuple"] and len(state["tuple"]) == 2  # (mean, variance)
    assert meta["attributes"]["m_schedule"] == mod.optimizer.m_schedule != 1.0

    other = new_module(case, initial_params())
    other.set_optimizer_states(arrays, json.loads(json.dumps(meta)))
    assert other.optimizer.m_schedule == mod.optimizer.m_schedule
    key = meta["entries"][0]["key"]
    got, want = other.updater.states[key], mod.updater.states[key]
    assert isinstance(got, tuple) and len(got) == 2
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g.asnumpy(), w.asnumpy())


def test_multi_precision_states_keep_the_float32_copy() -> None:
    mod = BucketingModule(sym_gen, 9)
    mod.bind([("data", (BATCH, 9))], [("softmax_label", (BATCH, 9))])
    mod.init_params(mx.init.Xavier())
    mod.init_optimizer(
        None, "sgd", {"learning_rate": 0.1, "momentum": 0.9, "multi_precision": True}
    )
    # a float16 weight as the updater would see it (the LSTM itself runs in float32)
    weight = mx.nd.ones((3, 2), dtype="float16")
    mod.updater(0, mx.nd.ones((3, 2), dtype="float16"), weight)
    arrays, meta = mod.get_optimizer_states()
    spec = meta["entries"][0]["state"]
    assert list(spec) == ["tuple"]  # (momentum, float32 weight copy)
    dtypes = sorted(np.dtype(a.dtype).name for a in arrays.values())
    assert dtypes == ["float32", "float32"]


def test_changed_device_count_copies_states_to_every_device(tmp_path: Path) -> None:
    two = CASES["two-devices-local-updater"]
    mod = new_module(two, initial_params())
    train(mod, batches(5), 0)
    save_states(mod, tmp_path)
    arrays, _, meta = load_states(tmp_path)
    names = mod.param_names

    # one device, no kvstore: key i
    one = new_module({**two, "contexts": [mx.cpu()]}, initial_params())
    one.set_optimizer_states(arrays, meta)
    assert one.optimizer.num_update == 5
    assert one.optimizer.learning_rate == mod.optimizer.learning_rate
    assert sorted(one.updater.states) == list(range(len(names)))
    i = names.index("lstm_i2h_weight")
    np.testing.assert_array_equal(
        one.updater.states[i].asnumpy(),
        mod.updater.states[2 * i].asnumpy(),
    )
    assert one.optimizer._all_index_update_counts[0][i] == 5

    # the kvstore runs the optimizer: keys are parameter names
    onkv = new_module({**two, "kvstore": "device", "update_on_kvstore": True}, initial_params())
    onkv.set_optimizer_states(arrays, meta)
    assert sorted(onkv.updater.states) == sorted(names)
    np.testing.assert_array_equal(
        onkv.updater.states["lstm_i2h_weight"].asnumpy(),
        mod.updater.states[2 * i].asnumpy(),
    )
    arg = {k: v for k, v in mx.nd.load(str(tmp_path / "params.nd")).items() if ":" not in k}
    onkv.set_params(arg, {})
    mod_next = batches(6)[5:]
    train(onkv, mod_next, 5)
    train(mod, mod_next, 5)
    # same arithmetic on the summed gradient, whichever side runs the optimizer
    for k, v in mod.get_params()[0].items():
        np.testing.assert_allclose(onkv.get_params()[0][k].asnumpy(), v.asnumpy(), rtol=1e-6)


def test_mismatches_are_named() -> None:
    case = CASES["sgd-momentum"]
    mod = new_module(case, initial_params())
    train(mod, batches(2), 0)
    arrays, meta = mod.get_optimizer_states()

    adam = new_module(CASES["adam"], initial_params())
    with pytest.raises(ValueError, match=r"saved for 'SGD'.*'Adam'"):
        adam.set_optimizer_states(arrays, meta)

    plain = new_module({**case, "params": {"learning_rate": 0.5}}, initial_params())
    with pytest.raises(ValueError, match=r"state of \w+ .*is array.*keeps None"):
        plain.set_optimizer_states(arrays, meta)  # momentum switched off

    target = new_module(case, initial_params())
    renamed = json.loads(json.dumps(meta))
    renamed["entries"][0]["param"] = "decoder_weight"
    with pytest.raises(ValueError, match="decoder_weight"):
        target.set_optimizer_states(arrays, renamed)

    reshaped = json.loads(json.dumps(meta))
    reshaped["entries"][0]["shape"] = [1, 2, 3]
    with pytest.raises(ValueError, match=r"another shape: \w+ \(1, 2, 3\)"):
        target.set_optimizer_states(arrays, reshaped)

    missing = dict(arrays)
    gone = sorted(missing)[0]
    del missing[gone]
    with pytest.raises(ValueError, match=f"{gone}.*missing"):
        target.set_optimizer_states(missing, meta)
    with pytest.raises(ValueError, match=r"not described.*stray"):
        target.set_optimizer_states({**arrays, "stray": mx.nd.zeros(1)}, meta)
    wrong_shape = {**arrays, gone: mx.nd.zeros((2, 2))}
    with pytest.raises(ValueError, match=r"is array\(2, 2\)"):
        target.set_optimizer_states(wrong_shape, meta)
    with pytest.raises(ValueError, match="format"):
        target.set_optimizer_states(arrays, {**meta, "format": 99})

    # nothing was changed by the failed attempts: a good restore still works afterwards
    target.set_optimizer_states(arrays, meta)
    assert target.optimizer.num_update == 2

    fresh = BucketingModule(sym_gen, 9)
    fresh.bind([("data", (BATCH, 9))], [("softmax_label", (BATCH, 9))])
    fresh.init_params()
    with pytest.raises(RuntimeError, match="init_optimizer"):
        fresh.get_optimizer_states()
