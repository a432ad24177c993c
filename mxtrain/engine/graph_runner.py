"""Inference-only executors of several graphs over one set of parameter arrays (decoding).

Beam search and generation run an encoder once per batch and a decoder step graph many times,
with shapes that change from batch to batch (source length, rows). :class:`GraphRunner` binds
one executor per graph key (which fixes the input shapes) on one device, without gradients,
every executor reading the same parameter arrays (moved to the device once, never copied per
executor), and keeps at most ``max_bound`` of them bound (the least recently used goes first).

oneDNN's graph fusion (MXNet's default on CPU) gives some fused inference operators
(FullyConnected) a copy of the weights they read first: the parameters must not change while a
runner uses them, which decoding never does, and the fused layers are faster.

Executors do not share an intermediate memory pool: a pool shared with another graph would
let one graph's forward overwrite the outputs of another that the caller still reads (the
encoder's outputs while the step graph runs). Decoding graphs are small next to a training
batch, so the separate memory costs little.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Hashable, Mapping
from typing import Any

import mxnet as mx
import numpy as np

__all__ = ["GraphMismatch", "GraphRunner"]

#: executors kept bound by default: an encoder and a step graph for a few source lengths
DEFAULT_MAX_BOUND = 8


class GraphMismatch(ValueError):
    """A graph that its inputs or the parameter arrays do not fit (names, shapes)."""


class GraphRunner:
    """Forward passes of ``symbol_for(key)`` on ``context`` with shared parameters.

    ``arg_params`` / ``aux_params``: name -> NDArray (a checkpoint's); every graph takes the
    ones it names. An argument named in ``zeros`` (a label the loss layer takes, a begin
    state) is bound as zeros of its inferred shape unless :meth:`forward` is given it; any
    other argument that is neither given nor a parameter is a :class:`GraphMismatch` (a
    checkpoint that does not fit the model).
    """

    def __init__(
        self,
        symbol_for: Callable[[Any], Any],
        arg_params: Mapping[str, Any],
        aux_params: Mapping[str, Any],
        context: Any,
        *,
        zeros: Collection[str] = (),
        max_bound: int = DEFAULT_MAX_BOUND,
    ) -> None:
        if max_bound < 1:
            raise ValueError(f"max_bound must be at least 1, got {max_bound}")
        self._symbol_for = symbol_for
        self.context = context
        self._args = {n: a.as_in_context(context) for n, a in arg_params.items()}
        self._auxs = {n: a.as_in_context(context) for n, a in aux_params.items()}
        self._zeros = frozenset(zeros)
        self._execs: OrderedDict[Hashable, Any] = OrderedDict()
        self.max_bound = max_bound
        self.binds = 0  # executors bound so far (rebinding after a release counts again)

    @property
    def bound(self) -> int:
        """Executors bound now."""
        return len(self._execs)

    def forward(self, key: Hashable, inputs: Mapping[str, Any]) -> list[Any]:
        """Run the graph of ``key`` on ``inputs`` (name -> NDArray or NumPy array), copied into
        the executor's input arrays.

        ``key`` must fix the input shapes (rows included): the first forward of a key binds
        its executor with the shapes given then; later ones must give the same shapes, and
        an input left out keeps the value of the last forward of that key (inputs that do not
        change from step to step are copied once). The outputs belong to the executor: its
        next forward overwrites them, so copy (or ``take``) what must outlive it."""
        executor = self._execs.get(key)
        if executor is None:
            shapes = {name: tuple(value.shape) for name, value in inputs.items()}
            executor = self._bind(key, shapes)
            self._execs[key] = executor
            while len(self._execs) > self.max_bound:
                self._execs.popitem(last=False)
        else:
            self._execs.move_to_end(key)
        for name, value in inputs.items():
            target = executor.arg_dict.get(name)
            if target is None or tuple(target.shape) != tuple(value.shape):
                raise GraphMismatch(
                    f"graph {key!r} was bound with {name} "
                    f"{None if target is None else tuple(target.shape)}, "
                    f"not {tuple(value.shape)}"
                )
            if isinstance(value, np.ndarray):
                target[:] = value.astype(target.dtype, copy=False)
            else:
                value.copyto(target)
        executor.forward(is_train=False)
        return list(executor.outputs)

    def argument_shapes(
        self, key: Hashable, shapes: Mapping[str, tuple[int, ...]]
    ) -> dict[str, tuple[int, ...]]:
        """Every argument's shape in ``key``'s graph given the input ``shapes``."""
        return self._graph(key, shapes)[1]

    def _graph(
        self, key: Hashable, shapes: Mapping[str, tuple[int, ...]]
    ) -> tuple[Any, dict[str, tuple[int, ...]]]:
        """``key``'s symbol and its arguments' shapes."""
        with mx.name.NameManager():  # auto-named nodes named as in every other graph
            symbol = self._symbol_for(key)
        names = symbol.list_arguments()
        unknown = sorted(set(shapes) - set(names))
        if unknown:
            raise GraphMismatch(f"graph {key!r} has no inputs {unknown}; its arguments: {names}")
        arg_shapes, _, _ = symbol.infer_shape(**shapes)
        if arg_shapes is None:
            raise GraphMismatch(f"graph {key!r}: shapes cannot be inferred from {dict(shapes)}")
        return symbol, dict(zip(names, map(tuple, arg_shapes), strict=True))

    def _bind(self, key: Hashable, shapes: dict[str, tuple[int, ...]]) -> Any:
        symbol, arg_shapes = self._graph(key, shapes)
        names = list(arg_shapes)
        missing = [n for n in names if n not in shapes and n not in self._args]
        missing = [n for n in missing if n not in self._zeros]
        if missing:
            raise GraphMismatch(
                f"graph {key!r}: the checkpoint has no parameters {missing} and they are not inputs"
            )
        args = {}
        for name, shape in arg_shapes.items():
            param = self._args.get(name)
            if name in shapes or param is None:
                args[name] = mx.nd.zeros(shape, ctx=self.context)
            elif tuple(param.shape) != tuple(shape):
                raise GraphMismatch(
                    f"graph {key!r}: parameter {name} has shape {tuple(param.shape)} in the "
                    f"checkpoint, the graph needs {tuple(shape)}"
                )
            else:
                args[name] = param
        missing = [n for n in symbol.list_auxiliary_states() if n not in self._auxs]
        if missing:
            raise GraphMismatch(f"graph {key!r}: the checkpoint has no auxiliary states {missing}")
        auxs = {n: self._auxs[n] for n in symbol.list_auxiliary_states()}
        self.binds += 1
        return symbol.bind(self.context, args=args, grad_req="null", aux_states=auxs)
