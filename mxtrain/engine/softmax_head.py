"""The softmax cross-entropy head computed by the engine in one pass over the logits.

The gradient of ``-log softmax(z)[label]`` with respect to the logits ``z`` is
``softmax(z) - onehot(label)``. A graph formulation computes the softmax forward and then, in
its backward, reads it (and the loss's own gradient) again to write the logits' gradient:
several passes over the (rows, classes) array, some of them through operators without a
vectorized CPU kernel (MXNet 1.9.1's ``log_softmax`` backward on AVX2, ``SoftmaxOutput``'s
backward). Here the model's training graph ends at the logits, and per batch:

1. ``softmax(logits)`` is written straight into a buffer that becomes the logits' gradient;
2. the loss of each row, ``-log(max(p[label], floor))`` (0 on ignored rows; the floor is
   the model's, as its graph formulation uses it), and, when the
   metrics need them, a copy of the probabilities are taken from it;
3. at backward, 1 is subtracted at each row's label and the ignored rows are set to 0 (both
   touch only those elements: the row indices come from the batch's labels on the host), and
   the executor's backward runs with the buffer as the logits' gradient.

The buffer is best an input of the graph (``SoftmaxHeadSpec.gradient_input``) whose loss
hands it to the logits in backward (models/given_gradient.py: one copy, no forward work):
inputs are views of one array shared by every bucket, where a gradient passed to
``backward(out_grads)`` is copied into an array each executor allocates of its own, batch x
length x classes floats for every bound bucket.

The gradient is what ``SoftmaxOutput`` (normalization ``null``, ``use_ignore``) sends back, to
float rounding; the loss is the ``softmax`` formulation's, operation for operation. Knows no
model: the module is told which output holds the logits and which label input goes with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mxnet as mx
import numpy as np

__all__ = ["SoftmaxGradientHead", "SoftmaxHeadSpec"]


@dataclass(frozen=True)
class SoftmaxHeadSpec:
    """Where the head reads: output ``output`` of the symbol holds (rows, classes) logits,
    label input ``label`` (any shape with ``rows`` values, row-major) their labels; a row's
    loss is ``-log(max(p, probability_floor))`` (finite when p underflows to 0);
    ``ignore_label`` rows get no gradient and a loss of 0; ``probabilities``: the head's
    outputs start with the probabilities (metrics that read them), else with the loss."""

    label: str
    probability_floor: float
    ignore_label: int | None = None
    probabilities: bool = False
    output: int = 0
    #: the graph's input the head writes the logits' gradient into, when the graph takes it
    #: that way (a loss whose backward copies that input, output ``gradient_output``, which
    #: the module does not show): backward then needs no out_grads, which MXNet would copy into an
    #: array every bucket's executor keeps of its own; None: the gradient goes in out_grads
    gradient_input: str | None = None
    gradient_output: str | None = None


class _Pending:
    """One device's work left for backward: the gradient buffer, the label positions to
    subtract 1 at and the rows to zero."""

    def __init__(self, buffer: Any, subtract_at: Any, zero_rows: Any) -> None:
        self.buffer = buffer
        self.subtract_at = subtract_at
        self.zero_rows = zero_rows


class SoftmaxGradientHead:
    """Per-device buffers and the head's work (module docstring); :class:`BatchStep` calls
    :meth:`forward` after each executor's forward and :meth:`gradient` before its backward.

    The buffers are reused from batch to batch (one per device, grown to the largest bucket
    seen): MXNet's engine orders each batch's writes after the previous batch's reads. The
    outputs :meth:`forward` returns are valid until the next forward on that device.
    """

    def __init__(self, spec: SoftmaxHeadSpec, ndev: int) -> None:
        self.spec = spec
        self._flat: list[Any] = [None] * ndev
        self._pending: list[_Pending | None] = [None] * ndev

    def output_names(self, symbol_outputs: Sequence[str]) -> list[str]:
        """The module's output names: the head's outputs in place of the logits."""
        names = list(symbol_outputs)
        head = ["softmax_output", "nll_output"] if self.spec.probabilities else ["nll_output"]
        shown = names[: self.spec.output] + head + names[self.spec.output + 1 :]
        return [n for n in shown if n != self.spec.gradient_output]

    def _buffer(self, k: int, rows: int, classes: int, ctx: Any) -> Any:
        size = rows * classes
        flat = self._flat[k]
        if flat is None or flat.size < size or flat.context != ctx:
            flat = self._flat[k] = mx.nd.empty((size,), ctx=ctx)
        return flat[:size].reshape((rows, classes))

    def forward(
        self,
        k: int,
        outputs: Sequence[Any],
        label: Any,
        host_label: Any,
        train: bool,
        *,
        gradient: Any = None,
        hidden: int | None = None,
    ) -> list[Any]:
        """Device ``k``'s outputs for the metrics from the executor's ``outputs`` and its
        ``label`` input (on the device) and the same labels on the host (numpy);
        ``train`` keeps what :meth:`gradient` needs. ``gradient``: the executor's
        ``gradient_input`` array, which then holds the probabilities and the gradient;
        ``hidden``: the index of its ``gradient_output``, left out of the outputs."""
        spec = self.spec
        logits = outputs[spec.output]
        rows, classes = logits.shape
        probs = self._buffer(k, rows, classes, logits.context) if gradient is None else gradient
        mx.nd.softmax(logits, axis=-1, out=probs)
        label = label.reshape((-1,))
        picked = mx.nd.pick(probs, label, axis=-1)
        nll = -mx.nd.log(mx.nd.maximum(picked, spec.probability_floor))
        if spec.ignore_label is not None:
            nll = nll * (label != spec.ignore_label)
        head = [probs.copy() if train else probs, nll] if spec.probabilities else [nll]
        self._pending[k] = self._plan(probs, host_label) if train else None
        shown = [o for i, o in enumerate(outputs) if i != hidden]
        at = spec.output if hidden is None or hidden > spec.output else spec.output - 1
        return [*shown[:at], *head, *shown[at + 1 :]]

    def _plan(self, probs: Any, host_label: Any) -> _Pending:
        labels = np.asarray(host_label).reshape(-1).astype(np.int64)
        if labels.size != probs.shape[0]:
            raise ValueError(
                f"the softmax head has {probs.shape[0]} rows of logits but {labels.size} labels"
            )
        if self.spec.ignore_label is None:
            kept = np.arange(labels.size)
            ignored = np.empty(0, dtype=np.int64)
        else:
            is_ignored = labels == self.spec.ignore_label
            kept = np.flatnonzero(~is_ignored)
            ignored = np.flatnonzero(is_ignored)
        ctx = probs.context
        subtract_at = (
            mx.nd.array(np.stack([kept, labels[kept]]), ctx=ctx, dtype=np.int64)
            if kept.size
            else None
        )
        zero_rows = mx.nd.array(ignored, ctx=ctx, dtype=np.int64) if ignored.size else None
        return _Pending(probs, subtract_at, zero_rows)

    def gradient(self, k: int) -> Any:
        """Device ``k``'s logits gradient, softmax - onehot(label) with ignored rows 0,
        written in place over the probabilities of its last training forward."""
        pending = self._pending[k]
        if pending is None:
            raise RuntimeError("backward needs a training forward first (forward(is_train=True))")
        self._pending[k] = None
        grad = pending.buffer
        if pending.subtract_at is not None:
            at = pending.subtract_at
            less = mx.nd.gather_nd(grad, at) - 1.0
            mx.nd._internal._scatter_set_nd(grad, less, at, shape=grad.shape, out=grad)
        if pending.zero_rows is not None:
            zeros = mx.nd.zeros((pending.zero_rows.size, grad.shape[1]), ctx=grad.context)
            mx.nd.contrib.index_copy(grad, pending.zero_rows, zeros, out=grad)
        return grad
