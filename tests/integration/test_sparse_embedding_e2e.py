"""model.sparse_embedding end to end: a row_sparse input-embedding gradient that trains exactly
as the dense one under plain SGD, lazy Adam updates that touch only the batch's rows, an exact
mid-epoch resume, and clear errors where it cannot train."""

from __future__ import annotations

from pathlib import Path

import mxnet as mx
import numpy as np
import pytest
from click.testing import CliRunner
from conftest import WORDS, assert_same_ending, newest_checkpoint, small_stream_lm
from float_bounds import assert_close_at_scale, rnn_chain_roundings

from mxtrain.cli.main import cli
from mxtrain.data.base import DataInfo
from mxtrain.engine.bucketing import BucketingModule
from mxtrain.models.language_model_options import LstmLmOptions
from mxtrain.models.language_models import build_lstm_lm


def fit(config: Path, name: str, *overrides: str) -> Path:
    args = ["fit", str(config), "--name", name, "--progress", "plain"]
    for item in overrides:
        args += ["--set", item]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    return config.parent / "runs" / name


def newest_params(run: Path) -> dict[str, np.ndarray]:
    arrays = mx.nd.load(str(newest_checkpoint(run) / "params.nd"))
    return {k: v.asnumpy() for k, v in arrays.items()}


def test_plain_sgd_trains_exactly_as_the_dense_gradient(tmp_path: Path) -> None:
    """Plain SGD (no momentum, no weight decay) changes only the rows with a gradient either
    way, and clipping scales both alike: the same parameters bit for bit."""
    monitor = "fit.monitor={pattern: embed, interval: 5}"  # reads the gradient it may
    sparse = fit(small_stream_lm(tmp_path, "sparse", "sparse_embedding: true"), "sparse", monitor)
    dense = fit(small_stream_lm(tmp_path, "dense", "sparse_embedding: false"), "dense")
    a, b = newest_params(sparse), newest_params(dense)
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    log = (sparse / "train.log").read_text()
    assert "embed_weight: |w|=" in log and "|g|=" in log


def test_with_the_sampled_softmax_one_sgd_step_equals_the_dense_one(tmp_path: Path) -> None:
    """With the sampled softmax the output layer's sampled rows are gathered for a row_sparse
    gradient too; its sums run in another order than take's, so one SGD step agrees within
    the LM's rounding bound (a float_bounds condition factor of its sizes)."""
    model = "sampled_softmax: 8, sparse_embedding"
    one = "fit.max_updates=1"
    sparse = fit(small_stream_lm(tmp_path, "sparse", f"{model}: true"), "sparse", one)
    dense = fit(small_stream_lm(tmp_path, "dense", f"{model}: false"), "dense", one)
    a, b = newest_params(sparse), newest_params(dense)
    assert sorted(a) == sorted(b)
    # bptt 7 steps, batch 6, the corpus's words and the specials as classes
    classes = len(WORDS) + 3  # <pad>, <unk>, <eos>
    roundings = rnn_chain_roundings(7, 6, classes, num_embed=10, num_hidden=10, num_layers=1)
    for name in a:
        assert_close_at_scale(a[name], b[name], roundings=roundings, err_msg=name)


def test_the_gradient_is_row_sparse_and_lazy_adam_updates_only_its_rows() -> None:
    info = DataInfo(vocab_size=30, num_classes=30, pad_id=0)
    options = LstmLmOptions(num_embed=4, num_hidden=4, num_layers=1, sparse_embedding=True)
    module = BucketingModule(build_lstm_lm(options, info), 5, [mx.cpu()])
    module.bind([("data", (2, 5))], [("softmax_label", (2, 5))], for_training=True)
    module.init_params(mx.init.Uniform(0.1))
    module.init_optimizer(optimizer="adam", optimizer_params={"learning_rate": 0.1})
    assert module.store.sparse_grads == {"embed_weight"}
    before = module.get_params()[0]["embed_weight"].asnumpy()
    words = np.array([[1, 2, 3, 4, 5], [5, 6, 7, 0, 0]], dtype=np.float32)
    module.forward(mx.io.DataBatch([mx.nd.array(words)], [mx.nd.array(words)]), is_train=True)
    module.backward()
    grad = module.grad_array("embed_weight")
    assert grad.stype == "row_sparse"
    assert sorted(grad.indices.asnumpy()) == [0, 1, 2, 3, 4, 5, 6, 7]
    module.update()
    after = module.get_params()[0]["embed_weight"].asnumpy()
    changed = np.flatnonzero(np.abs(after - before).sum(axis=1))
    assert set(changed) <= set(range(8)) and len(changed) > 0
    np.testing.assert_array_equal(after[8:], before[8:])


def test_mid_epoch_resume_with_lazy_adam_is_bit_identical(tmp_path: Path) -> None:
    config = small_stream_lm(tmp_path, "adam", "sparse_embedding: true")
    adam = ["optimizer.name=adam", "optimizer.learning_rate=0.01"]
    straight = fit(config, "straight", "fit.max_updates=30", *adam)
    short = fit(config, "short", "fit.max_updates=13", *adam)
    result = CliRunner().invoke(cli, ["resume", str(short), "--set", "fit.max_updates=30"])
    assert result.exit_code == 0, result.output
    assert_same_ending(straight, short)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("context.count=2", "trains on one device"),
        ("fit.grad_accumulation=3", "cannot add gradients over batches"),
        ("optimizer.name=rmsprop", "needs an optimizer that updates rows"),
    ],
)
def test_settings_that_cannot_train_are_refused_at_the_key(
    tmp_path: Path, override: str, expected: str
) -> None:
    """`check` says it before `fit` reads any data, with the key's line."""
    config = small_stream_lm(tmp_path, "bad", "sparse_embedding: true")
    for command in ("check", "fit"):
        result = CliRunner().invoke(cli, [command, str(config), "--set", override])
        assert result.exit_code == 2, result.output
        assert expected in result.output and "sparse_embedding" in result.output
        assert "bad.yaml:2:" in result.output and "Traceback" not in result.output


def test_tied_weights_are_refused_at_the_key(tmp_path: Path) -> None:
    config = small_stream_lm(tmp_path, "tied", "sparse_embedding: true, tie_weights: true")
    result = CliRunner().invoke(cli, ["check", str(config)])
    assert result.exit_code != 0
    assert "tie_weights: false" in result.output and "tied.yaml:" in result.output
