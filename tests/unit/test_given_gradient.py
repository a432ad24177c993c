"""models/given_gradient.py: the loss whose backward hands its second input to the first."""

from __future__ import annotations

import mxnet as mx
import numpy as np

from mxtrain.models.given_gradient import OP_TYPE, given_gradient_loss


def _bind(grad_req: str) -> mx.executor.Executor:
    data, gradient = mx.sym.Variable("data"), mx.sym.Variable("gradient")
    loss = given_gradient_loss(data * 3.0, gradient, name="given")
    return loss.simple_bind(mx.cpu(), data=(4, 7), grad_req={"data": grad_req, "gradient": "null"})


def test_backward_hands_the_gradient_input_to_the_data_exactly() -> None:
    ex = _bind("write")
    rng = np.random.default_rng(0)
    ex.arg_dict["data"][:] = rng.standard_normal((4, 7))
    given = rng.standard_normal((4, 7)).astype(np.float32)
    ex.arg_dict["gradient"][:] = given
    ex.forward(is_train=True)
    assert ex.outputs[0].shape == (1,)
    ex.backward()
    # data * 3 has the gradient 3 x the given one: exact in float32 for these values' range
    np.testing.assert_array_equal(ex.grad_dict["data"].asnumpy(), 3 * given)


def test_accumulates_where_the_gradient_is_added() -> None:
    ex = _bind("add")
    ex.arg_dict["gradient"][:] = 1.0
    ex.grad_dict["data"][:] = 0.0
    for _ in range(2):
        ex.forward(is_train=True)
        ex.backward()
    np.testing.assert_array_equal(ex.grad_dict["data"].asnumpy(), np.full((4, 7), 6.0))


def test_the_shapes_follow_either_input_and_the_graph_names_the_operator() -> None:
    data, gradient = mx.sym.Variable("data"), mx.sym.Variable("gradient")
    loss = given_gradient_loss(data, gradient, name="given")
    assert loss.list_outputs() == ["given_loss"]
    args, outs, _ = loss.infer_shape(gradient=(5, 2))
    assert args == [(5, 2), (5, 2)] and outs == [(1,)]
    assert f'"op_type": "{OP_TYPE}"' in loss.tojson()
