"""Gradient accumulation: K small batches then one update == one update on the big batch."""

from __future__ import annotations

import json
from pathlib import Path

import mxnet as mx
import numpy as np
from click.testing import CliRunner
from float_bounds import assert_close_at_scale, rnn_chain_roundings

from mxtrain.cli.main import cli
from mxtrain.data.base import DataInfo
from mxtrain.engine.bucketing import BucketingModule
from mxtrain.models.language_model_options import LstmLmOptions
from mxtrain.models.language_models import build_lstm_lm

VOCAB = 30


def make_module(batch: int, grad_req: str, arg_params=None) -> BucketingModule:
    sym_gen = build_lstm_lm(
        LstmLmOptions(num_embed=6, num_hidden=8, num_layers=1), DataInfo(VOCAB, VOCAB, 0)
    )
    module = BucketingModule(sym_gen, 7, [mx.cpu()])
    module.bind([("data", (batch, 7))], [("softmax_label", (batch, 7))], grad_req=grad_req)
    module.init_params(mx.init.Xavier(), arg_params=arg_params)
    module.init_optimizer(
        optimizer="sgd",
        optimizer_params={"learning_rate": 0.5, "momentum": 0.9, "rescale_grad": 1 / 8},
    )
    return module


def batch_of(data: np.ndarray) -> mx.io.DataBatch:
    shape = data.shape
    return mx.io.DataBatch(
        [mx.nd.array(data)],
        [mx.nd.array(np.roll(data, -1, axis=1))],
        bucket_key=7,
        provide_data=[mx.io.DataDesc("data", shape)],
        provide_label=[mx.io.DataDesc("softmax_label", shape)],
    )


def test_two_accumulated_batches_equal_one_double_batch() -> None:
    rng = np.random.default_rng(3)
    steps = [rng.integers(1, VOCAB, (8, 7)) for _ in range(3)]
    big = make_module(8, "write")
    start, _ = big.get_params()
    small = make_module(4, "add", arg_params=start)
    for data in steps:
        big.forward_backward(batch_of(data))
        big.update()
        small.zero_grads()
        small.forward_backward(batch_of(data[:4]))
        small.forward_backward(batch_of(data[4:]))
        small.update()
    a, _ = big.get_params()
    b, _ = small.get_params()
    # two half batches sum the gradient in another order than one batch: each update's
    # roundings along the network's chain, at the parameters' scale (see float_bounds)
    chain = rnn_chain_roundings(7, 8, VOCAB, num_embed=6, num_hidden=8, num_layers=1)
    for key in a:
        assert_close_at_scale(b[key].asnumpy(), a[key].asnumpy(), roundings=len(steps) * chain)
    changed = [k for k in a if not np.allclose(a[k].asnumpy(), start[k].asnumpy())]
    assert changed, "the updates must have moved the parameters"


def test_accumulation_counts_updates_and_resumes_exactly(tiny_config: Path) -> None:
    def run(*args: str) -> None:
        result = CliRunner().invoke(cli, list(args))
        assert result.exit_code == 0, result.output

    acc = ["--set", "fit.grad_accumulation=3", "--set", "fit.num_epoch=3"]
    run("fit", str(tiny_config), *acc, "--name", "straight")
    run("fit", str(tiny_config), *acc, "--name", "split", "--set", "fit.max_updates=7")
    runs = tiny_config.parent / "runs"
    split_ckpts = sorted((runs / "split" / "checkpoints").glob("e*"))
    position = json.loads((split_ckpts[-1] / "state.json").read_text())["state"]["position"]
    assert position["updates"] == 7 and position["batch"] % 3 == 0
    run("resume", str(runs / "split"), "--set", "fit.max_updates=null")
    a = mx.nd.load(str(runs / "straight" / "model-0003.params"))
    b = mx.nd.load(str(runs / "split" / "model-0003.params"))
    for key in a:
        np.testing.assert_array_equal(a[key].asnumpy(), b[key].asnumpy(), err_msg=key)
    straight = sorted((runs / "straight" / "checkpoints").glob("e*"))[-1]
    done = json.loads((straight / "state.json").read_text())["state"]["position"]
    epochs = [
        json.loads(line)
        for line in (runs / "straight" / "metrics.jsonl").read_text().splitlines()
        if '"event": "epoch"' in line
    ]
    per_epoch = epochs[0]["batch"]
    assert done["updates"] == 3 * -(-per_epoch // 3)  # ceil: the last group may be short


def test_eval_interval_must_fall_between_updates(tiny_config: Path) -> None:
    result = CliRunner().invoke(
        cli,
        [
            "check",
            str(tiny_config),
            "--set",
            "fit.grad_accumulation=3",
            "--set",
            "fit.eval_interval=4",
        ],
    )
    assert result.exit_code == 2 and "multiple of grad_accumulation" in result.output
