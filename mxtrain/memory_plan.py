"""Training memory before the first batch: what the machine has, and what the buckets of a
bound module will keep (``fit.bucket_memory``).

Executors of different buckets share one memory pool, but every bound bucket keeps memory
of its own: MXNet 1.9.1's fused RNN operator (oneDNN on CPU) allocates, at a bucket's first
batch, its weights in the kernel's layout and a workspace for the whole sequence that the
backward pass reads. That is what grows with the number of buckets bound, and what this
module estimates from the graph alone (no memory is allocated; MXNet is imported by the
caller's symbol, not here).

The coefficients were measured on MXNet 1.9.1's pip wheel (oneDNN RNN, float32, training),
bucket by bucket with glibc's mmap threshold fixed so that resident memory follows every
allocation: LSTM, GRU and vanilla RNN cells, 1 to 3 layers, 128 to 512 units, inputs of
32 to 1,024 features, one and two directions. The estimates came within about 10% of every
measurement; builds without oneDNN (or GPUs) allocate differently and are not estimated.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mxtrain.option_checks import FLOAT_BYTES

#: gates of each fused RNN mode
RNN_GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}

#: floats a one-directional fused RNN layer keeps per time step and batch row, per unit
#: and per (gates + 1); the node keeps one layer's worth more (its input and output states)
UNI_PER_LAYER = 1.85
#: two directions: the first layer, and each further one (its input is both directions'
#: output), per unit and per (gates + 1), as measured (a two-direction stack keeps the
#: concatenated outputs of every layer and their gradients besides the workspace)
BI_FIRST_LAYER = 6.6
BI_FURTHER_LAYER = 8.8
#: a one-directional stack whose input width differs from its units runs its first layer
#: apart, keeping their joint output and its gradient: per unit and per (gates + 1)
SPLIT_STACK = 2.0
#: floats per time step and row for each input feature beyond the number of units
WIDE_INPUT = 3.0
#: the kernel's copies of the weights (forward and backward layouts, their gradient), in
#: units of the weights themselves
WEIGHT_COPIES = 6.9


@dataclass(frozen=True)
class FusedRnn:
    """One fused RNN operator of a graph at one bucket's shapes."""

    name: str
    mode: str
    layers: int
    directions: int
    units: int
    steps: int
    rows: int
    inputs: int
    weights: int

    def workspace_bytes(self) -> int:
        """The workspace it keeps in a bound bucket once it ran (training): grows with the
        bucket's steps and rows."""
        scale = RNN_GATES.get(self.mode, 4) + 1
        if self.directions == 1:
            per_position = UNI_PER_LAYER * scale * self.units * (self.layers + 1)
        else:
            per_position = (
                scale * self.units * (BI_FIRST_LAYER + BI_FURTHER_LAYER * (self.layers - 1))
            )
        per_position += self.directions * WIDE_INPUT * max(0, self.inputs - self.units)
        if self.directions == 1 and self.layers > 1 and self.inputs != self.units:
            # the first layer runs apart from the others (MXNet stacks layers of one size)
            per_position += SPLIT_STACK * scale * self.units
        return int(per_position * self.steps * self.rows * FLOAT_BYTES)

    def weight_copy_bytes(self) -> int:
        """The weights in the kernel's layouts it keeps in every bound bucket."""
        return int(WEIGHT_COPIES * self.weights * FLOAT_BYTES)


def fused_rnns(symbol: Any, shapes: Mapping[str, Sequence[int]]) -> list[FusedRnn]:
    """The fused RNN operators of ``symbol`` bound to input ``shapes``; those whose input
    shape cannot be inferred are left out."""
    graph = json.loads(symbol.tojson())
    if not any(node["op"] == "RNN" for node in graph["nodes"]):
        return []
    internals = symbol.get_internals()
    arguments = _argument_shapes(symbol, shapes)
    found = []
    for node in graph["nodes"]:
        if node["op"] != "RNN":
            continue
        attrs = node.get("attrs", {})
        try:
            children = internals[f"{node['name']}_output"].get_children()
            data_shape = _inferred(children[0], shapes)
            weight_shape = arguments.get(children[1].name) or _inferred(children[1], shapes)
        except Exception:  # a graph MXNet cannot take apart this way: not estimated
            continue
        if data_shape is None or len(data_shape) != 3 or not weight_shape:
            continue
        steps, rows, inputs = (int(d) for d in data_shape)
        found.append(
            FusedRnn(
                name=node["name"],
                mode=attrs.get("mode", "lstm"),
                layers=int(attrs.get("num_layers", 1)),
                directions=2 if attrs.get("bidirectional", "False") == "True" else 1,
                units=int(attrs["state_size"]),
                steps=steps,
                rows=rows,
                inputs=inputs,
                weights=math.prod(weight_shape),
            )
        )
    return found


def _argument_shapes(
    symbol: Any, shapes: Mapping[str, Sequence[int]]
) -> dict[str, tuple[int, ...]]:
    """Every argument's shape that ``symbol`` infers from the input ``shapes``."""
    names = symbol.list_arguments()
    known = {k: tuple(v) for k, v in shapes.items() if k in names}
    try:
        arg_shapes, _, _ = symbol.infer_shape_partial(**known)
    except Exception:  # shapes MXNet cannot infer: nothing to estimate from
        return {}
    return {
        name: tuple(int(d) for d in shape)
        for name, shape in zip(names, arg_shapes or [], strict=False)
        if shape and 0 not in shape
    }


def _inferred(part: Any, shapes: Mapping[str, Sequence[int]]) -> tuple[int, ...] | None:
    """The shape of ``part``'s (first) output given the input ``shapes`` it reads."""
    arguments = set(part.list_arguments())
    known = {k: tuple(v) for k, v in shapes.items() if k in arguments}
    _, out_shapes, _ = part.infer_shape_partial(**known)
    if not out_shapes or not out_shapes[0] or 0 in out_shapes[0]:
        return None
    return tuple(int(d) for d in out_shapes[0])


def bucket_kept_bytes(symbol: Any, shapes: Mapping[str, Sequence[int]]) -> tuple[int, int]:
    """Memory one bound bucket of ``symbol`` at ``shapes`` keeps of its own (estimate):
    ``(workspace, weight copies)``, the first growing with the bucket's positions."""
    rnns = fused_rnns(symbol, shapes)
    return sum(r.workspace_bytes() for r in rnns), sum(r.weight_copy_bytes() for r in rnns)


def resident_memory() -> int | None:
    """This process's resident memory in bytes (Linux), else None."""
    try:
        with open("/proc/self/statm", encoding="ascii") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def available_memory() -> int | None:
    """Bytes this process may still take: the system's MemAvailable (else free physical
    pages), less where a cgroup limit (containers, batch schedulers) leaves less; None if
    the OS does not say."""
    available = _mem_available()
    limit = _cgroup_room()
    if limit is not None:
        available = limit if available is None else min(available, limit)
    return available


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, AttributeError):
        return None


#: (limit, usage) files of cgroup v2 and v1
_CGROUP_FILES = (
    ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
    (
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
        "/sys/fs/cgroup/memory/memory.usage_in_bytes",
    ),
)
#: cgroup v1 writes "no limit" as a number near 2**63
_NO_LIMIT = 2**60


def _cgroup_room() -> int | None:
    """Bytes left under this process's cgroup memory limit, or None without one."""
    for limit_file, usage_file in _CGROUP_FILES:
        try:
            with open(limit_file, encoding="ascii") as handle:
                text = handle.read().strip()
            if text == "max" or int(text) >= _NO_LIMIT:
                return None
            with open(usage_file, encoding="ascii") as handle:
                usage = int(handle.read().strip())
            return max(0, int(text) - usage)
        except (OSError, ValueError):
            continue
    return None


def key_positions(key: Any) -> int:
    """A bucket key's length in positions per batch row: the key, or the sum of a tuple
    key's lengths ((source, target): both sides' inputs)."""
    if isinstance(key, tuple | list):
        return sum(key_positions(k) for k in key)
    return int(key) if isinstance(key, int | float) else 1


@dataclass(frozen=True)
class MemoryPlan:
    """What training will hold at its peak, before the first batch, in bytes.

    ``resident``: the process now (data, parameters); ``shared``: the default bucket's
    executors' memory pool, and the gradients and optimizer state, allocated but not yet
    written; ``kept_largest``: the workspace the largest bucket keeps of its own, and
    ``kept_each`` what every bound bucket keeps whatever its size; ``all_buckets``: every
    bucket's positions together, in largest buckets (the most a bound may hold), and
    ``buckets`` their number; ``available``: what the machine has left now.
    """

    resident: int
    shared: int
    kept_largest: int
    kept_each: int
    all_buckets: float
    buckets: int
    available: int | None

    def buckets_bound(self, factor: float | None) -> float:
        """Largest buckets' worth of positions bound at once under ``factor`` (None: all)."""
        return self.all_buckets if factor is None else min(factor, self.all_buckets)

    def peak(self, factor: float | None) -> int:
        """The estimated peak under ``fit.bucket_memory = factor``."""
        return self.resident + self.growth(factor)

    def growth(self, factor: float | None) -> int:
        """What training adds to the process from now on under ``factor``."""
        kept = self.kept_largest * self.buckets_bound(factor) + self.kept_each * self.buckets
        return self.shared + int(kept)

    def largest_factor_within(self, share: float, ceiling: float) -> float | None:
        """The largest factor (at most ``ceiling``, at least 1) whose growth from now stays
        within ``share`` of the available memory; None when even 1 does not (or the
        available memory is unknown)."""
        if self.available is None:
            return None
        room = share * self.available - self.shared - self.kept_each * self.buckets
        if self.kept_largest <= 0:
            return ceiling if room >= 0 else None
        factor = min(ceiling, room / self.kept_largest)
        return factor if factor >= 1 else None
