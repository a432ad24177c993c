"""Sampled softmax (model.sampled_softmax): the loss against a NumPy reference, its gradients
against finite differences, the candidate sampler's distribution, and the training graph's
parameters matching the full graph's (what evaluation, score and predict load)."""

from __future__ import annotations

import mxnet as mx
import numpy as np
import pytest

from mxtrain.data.base import DataInfo
from mxtrain.errors import InvalidValue
from mxtrain.models.language_model_options import LstmLmOptions
from mxtrain.models.language_models import build_lstm_lm
from mxtrain.models.rnn_common import (
    ACCIDENTAL_HIT_PENALTY,
    log_uniform_candidates,
    sampled_softmax_nll,
)

N, H, V, K = 6, 4, 50, 10
INFO = DataInfo(vocab_size=V, num_classes=V, pad_id=0)


TRIES = 37.0


def _probability(ids: np.ndarray) -> np.ndarray:
    """One draw's chance of each id: round(exp(u log V)) - 1, u uniform in [0, 1)."""
    return np.log(np.minimum(ids + 1.5, V) / np.maximum(ids + 0.5, 1.0)) / np.log(V)


def _log_expected(ids: np.ndarray) -> np.ndarray:
    """log P(drawn at least once in TRIES draws)."""
    return np.log(1.0 - (1.0 - _probability(ids)) ** TRIES)


def _reference(h, w, b, label, candidates) -> np.ndarray:
    """The sampled softmax's loss per row in float64, written out from its definition."""
    lab, cand = label.astype(int), candidates.astype(int)
    true = (h * w[lab]).sum(1) + b[lab] - _log_expected(label)
    sampled = h @ w[cand].T + b[cand] - _log_expected(candidates)
    sampled = sampled - ACCIDENTAL_HIT_PENALTY * (label[:, None] == candidates[None, :])
    logits = np.concatenate([true[:, None], sampled], axis=1)
    logits = logits - logits.max(axis=1, keepdims=True)
    return -(logits[:, 0] - np.log(np.exp(logits).sum(axis=1)))


def _inputs(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    label = rng.integers(0, V, N).astype("f4")
    candidates = rng.integers(0, V, K).astype("f4")
    candidates[0] = label[0]  # an accidental hit: masked out of row 0's softmax
    return {
        "h": rng.normal(size=(N, H)).astype("f4"),
        "w": rng.normal(size=(V, H)).astype("f4"),
        "b": rng.normal(size=V).astype("f4"),
        "label": label,
        "candidates": candidates,
    }


@pytest.mark.parametrize("sparse", [False, True])
def test_loss_and_gradients_match_the_definition(sparse: bool) -> None:
    """Also with the weight's rows gathered for a row_sparse gradient (sparse_embedding):
    the same loss, and the same gradient once made dense."""
    values = _inputs()
    names = ("h", "w", "b", "label", "candidates")
    symbols = {n: mx.sym.Variable(n) for n in names}
    nll = sampled_softmax_nll(
        symbols["h"],
        symbols["w"],
        symbols["b"],
        symbols["label"],
        symbols["candidates"],
        mx.sym.full((1,), TRIES),
        num_sampled=K,
        num_classes=V,
        sparse_rows=H if sparse else None,
    )
    loss = mx.sym.MakeLoss(nll)
    args = {n: mx.nd.array(values[n]) for n in names}
    shapes = {n: values[n].shape for n in names}
    req = {n: ("write" if n in ("h", "w", "b") else "null") for n in names}
    executor = loss.simple_bind(mx.cpu(), grad_req=req, **shapes)
    for name, value in args.items():
        executor.arg_dict[name][:] = value
    out = executor.forward(is_train=True)[0].asnumpy()
    executor.backward()
    assert executor.grad_dict["w"].stype == ("row_sparse" if sparse else "default")
    grads = {n: executor.grad_dict[n].tostype("default") for n in ("h", "w", "b")}
    reference = _reference(*(values[n].astype("f8") for n in names))
    np.testing.assert_allclose(out, reference, rtol=1e-5, atol=1e-5)

    def numeric(name: str) -> np.ndarray:
        step, grad = 1e-3, np.zeros(values[name].shape)
        for index in np.ndindex(values[name].shape):
            moved = {n: values[n].astype("f8") for n in names}
            moved[name][index] += step
            up = _reference(*(moved[n] for n in names)).sum()
            moved[name][index] -= 2 * step
            down = _reference(*(moved[n] for n in names)).sum()
            grad[index] = (up - down) / (2 * step)
        return grad

    for name in ("h", "w", "b"):
        np.testing.assert_allclose(grads[name].asnumpy(), numeric(name), atol=1e-4, err_msg=name)
    # words neither drawn nor a label get no gradient; the masked hit's candidate row is
    # pushed only as row 0's label
    untouched = sorted(
        set(range(V)) - set(values["label"].astype(int)) - set(values["candidates"].astype(int))
    )
    assert not grads["w"].asnumpy()[untouched].any()


def test_candidates_are_distinct_log_uniform_draws_repeated_by_the_seed() -> None:
    candidates, tries = log_uniform_candidates(K, V)
    executor = mx.sym.Group([candidates, tries]).bind(mx.cpu(), {})
    rounds, included, expected = 3000, np.zeros(V), np.zeros(V)
    mx.random.seed(7)
    for _ in range(rounds):
        ids, count = (o.asnumpy() for o in executor.forward())
        assert len(np.unique(ids)) == K and ids.min() >= 0 and ids.max() <= V - 1
        assert count[0] >= K and (ids == np.floor(ids)).all()
        included[ids.astype(int)] += 1
        expected += 1.0 - (1.0 - _probability(np.arange(V))) ** count[0]
    # each word is drawn about as often as the correction assumes (4 standard errors)
    share, predicted = included / rounds, expected / rounds
    error = 4 * np.sqrt(predicted * (1 - predicted) / rounds) + 0.01
    np.testing.assert_array_less(np.abs(share - predicted), error)
    assert share[1] > share[V // 2] > share[V - 1]  # frequent (low) ids more often
    mx.random.seed(7)
    first = executor.forward()[0].asnumpy()
    mx.random.seed(7)
    np.testing.assert_array_equal(executor.forward()[0].asnumpy(), first)


@pytest.mark.parametrize("tie_weights", [False, True])
def test_training_graph_has_the_full_graphs_parameters_and_no_vocabulary_wide_output(
    tie_weights: bool,
) -> None:
    options = LstmLmOptions(
        num_embed=8, num_hidden=8, num_layers=1, sampled_softmax=K, tie_weights=tie_weights
    )
    full_gen = build_lstm_lm(options, INFO)
    full, _, _ = full_gen(5)
    train, data_names, label_names = full_gen.training_variant()(5)
    assert (data_names, label_names) == (("data",), ("softmax_label",))
    assert train.list_outputs() == ["nll_output"]
    shapes = {"data": (3, 5), "softmax_label": (3, 5)}
    full_args, _, _ = full.infer_shape(**shapes)
    train_args, train_outs, _ = train.infer_shape(**shapes)
    assert dict(zip(full.list_arguments(), full_args, strict=True)) == dict(
        zip(train.list_arguments(), train_args, strict=True)
    )
    assert train_outs == [(15,)]
    internals = train.get_internals()
    _, inner, _ = internals.infer_shape(**shapes)
    assert (15, V) not in inner and (15, K + 1) in inner
    # without sampled_softmax there is no separate training graph
    assert not hasattr(
        build_lstm_lm(LstmLmOptions(num_embed=8, num_hidden=8), INFO), "training_variant"
    )


def test_sampled_count_must_be_a_fraction_of_the_vocabulary() -> None:
    with pytest.raises(InvalidValue, match="smaller than the vocabulary"):
        build_lstm_lm(LstmLmOptions(sampled_softmax=V), INFO)
    for bad in (-1, 2.5, True):
        with pytest.raises(InvalidValue, match="sampled_softmax"):
            LstmLmOptions(sampled_softmax=bad)  # type: ignore[arg-type]
