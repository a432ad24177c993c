"""A loss whose gradient is one of its inputs: what ``loss: one_pass`` training graphs end in.

The engine's one-pass softmax head (engine/softmax_head.py) writes the logits' gradient into
an input of the training graph; :func:`given_gradient_loss` hands that input to the logits
at backward, one copy and nothing else, and computes nothing forward (its one-element output
is never read). ``make_loss(logits * buffer)`` gets the same gradient (the buffer times
exact ones) but reads the logits and the buffer and writes a (rows, classes) product
forward, then reads two such arrays and writes a third backward: three times the passes over
(rows, classes) arrays of the copy's two (on the default word LM's largest bucket, 1,216 rows
x 10,000 classes, 48 MB each).

The operator is MXNet's Python ``CustomOp``, registered when this module is imported; it
appears only in the graphs the engine trains, never in a saved ``*-symbol.json``.
"""

from __future__ import annotations

from typing import Any

import mxnet as mx

__all__ = ["OP_TYPE", "given_gradient_loss"]

#: the registered name of the operator
OP_TYPE = "mxtrain_given_gradient"


class _GivenGradient(mx.operator.CustomOp):
    def forward(self, is_train: bool, req: Any, in_data: Any, out_data: Any, aux: Any) -> None:
        self.assign(out_data[0], req[0], 0.0)

    def backward(
        self, req: Any, out_grad: Any, in_data: Any, out_data: Any, in_grad: Any, aux: Any
    ) -> None:
        self.assign(in_grad[0], req[0], in_data[1])
        if req[1] != "null":
            self.assign(in_grad[1], req[1], 0.0)


@mx.operator.register(OP_TYPE)
class _GivenGradientProp(mx.operator.CustomOpProp):
    def __init__(self) -> None:
        super().__init__(need_top_grad=False)  # a loss: backward needs no head gradient

    def list_arguments(self) -> list[str]:
        return ["data", "gradient"]

    def list_outputs(self) -> list[str]:
        return ["loss"]

    def infer_shape(self, in_shape: Any) -> tuple[list[Any], list[Any], list[Any]]:
        # the gradient has the data's shape, whichever of the two is known
        shape = in_shape[0] if len(in_shape[0]) else in_shape[1]
        return [shape, shape], [(1,)], []

    def infer_type(self, in_type: Any) -> tuple[list[Any], list[Any], list[Any]]:
        return [in_type[0], in_type[0]], [in_type[0]], []

    def declare_backward_dependency(self, out_grad: Any, in_data: Any, out_data: Any) -> Any:
        return [in_data[1]]  # the logits themselves are not needed again

    def create_operator(self, ctx: Any, shapes: Any, dtypes: Any) -> _GivenGradient:
        return _GivenGradient()


def given_gradient_loss(data: Any, gradient: Any, name: str) -> Any:
    """A loss output named ``name`` whose backward sets ``data``'s gradient to ``gradient``
    (a symbol of the same shape)."""
    return mx.sym.Custom(data, gradient, op_type=OP_TYPE, name=name)
