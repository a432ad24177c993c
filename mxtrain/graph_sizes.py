"""Whether a model's graph fits MXNet's 32-bit shapes and this machine, before it is bound.

The config checks bound what the config alone says (a batch of the largest explicit bucket);
sizes that come from the data (the vocabulary, ``buckets: auto``) or from the command line
(``export --bucket``) are only known once the graph is built. Binding a graph with a tensor
of 2**31 values or more crashed MXNet 1.9.1 (or failed in the middle of allocating), and a
parameter larger than the memory was only found by the kernel's OOM killer. This module
infers every tensor's shape first (no memory is allocated) and says which one is too large.
MXNet is imported by the caller's symbol, not here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mxtrain.option_checks import FLOAT_BYTES, MAX_TENSOR_ELEMENTS, gib, physical_memory


@dataclass(frozen=True)
class SizeProblem:
    """A tensor too large: ``what`` says for what (MXNet's limit or the memory)."""

    tensor: str
    shape: tuple[int, ...]
    what: str

    def describe(self) -> str:
        dims = " x ".join(f"{d:,}" for d in self.shape)
        if len(self.shape) > 1:
            dims += f" = {math.prod(self.shape):,}"
        return f"{self.tensor} would be {dims} values, {self.what}"


def _too_many(shape: Sequence[int]) -> bool:
    return math.prod(shape) > MAX_TENSOR_ELEMENTS


TENSOR_LIMIT = f"more than the {MAX_TENSOR_ELEMENTS:,} (2**31 - 1) one MXNet 1.9.1 tensor can hold"


def input_problem(shapes: Mapping[str, Sequence[int]]) -> SizeProblem | None:
    """An input array (data, label) too large for MXNet, or None."""
    for name, shape in shapes.items():
        if _too_many(shape):
            return SizeProblem(f"the input {name}", tuple(shape), TENSOR_LIMIT)
    return None


def graph_problem(
    symbol: Any, shapes: Mapping[str, Sequence[int]], *, activations_in_memory: bool
) -> SizeProblem | None:
    """The first tensor of ``symbol`` bound to input ``shapes`` that MXNet cannot hold, or a
    parameter larger than the physical memory, or (``activations_in_memory``: training on
    CPUs) parameters and layer outputs together larger than it (a lower bound of what
    training keeps); None when all fit or the shapes cannot be inferred (binding explains)."""
    problem = input_problem(shapes)
    if problem is not None:
        return problem
    internals = symbol.get_internals()
    try:
        _, out_shapes, _ = internals.infer_shape_partial(**{k: tuple(v) for k, v in shapes.items()})
    except Exception:  # shapes MXNet cannot infer: binding reports them
        return None
    arguments = set(symbol.list_arguments())
    memory = physical_memory()
    total = 0
    for name, shape in zip(internals.list_outputs(), out_shapes or [], strict=False):
        if not shape:
            continue
        tensor = f"the tensor {name}"
        if _too_many(shape):
            return SizeProblem(tensor, tuple(shape), TENSOR_LIMIT)
        nbytes = math.prod(shape) * FLOAT_BYTES
        if memory is not None and name in arguments and name not in shapes and nbytes > memory:
            return SizeProblem(
                tensor, tuple(shape), f"{gib(nbytes)}, more than this machine's {gib(memory)}"
            )
        if name not in shapes:
            total += nbytes
    if activations_in_memory and memory is not None and total > memory:
        return SizeProblem(
            "the parameters and layer outputs together",
            (total // FLOAT_BYTES,),
            f"at least {gib(total)}, more than this machine's {gib(memory)} of memory",
        )
    return None


def keys_of(shape: Sequence[int], sizes: Mapping[str, Any]) -> list[str]:
    """The config keys among ``sizes`` (dotted key -> value, or list of values) whose value is
    one of ``shape``'s dimensions above 1: the ones that would make the tensor smaller."""
    dims = {d for d in shape if d > 1}
    found = []
    for key, value in sizes.items():
        values = value if isinstance(value, list | tuple) else [value]
        if any(isinstance(v, int) and not isinstance(v, bool) and v in dims for v in values):
            found.append(key)
    return found
