"""Bucket keys, batch splits and input descriptions: the shape arithmetic of the engine.

Plain functions over keys, counts and ``mx.io.DataDesc`` lists; no executors are touched here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import mxnet as mx
import numpy as np

__all__ = [
    "batch_axis",
    "fewest_rows",
    "input_elements",
    "key_fits",
    "largest_key",
    "shape_signature",
    "split_batch",
    "to_descs",
]

ShapeList = Sequence[Any]  # (name, shape) pairs or mx.io.DataDesc


def _key_parts(key: Any) -> tuple[Any, ...] | None:
    """Key as a tuple of comparable numbers, or None when keys of this kind have no order."""
    if isinstance(key, bool):
        return None
    if isinstance(key, int | float | np.integer | np.floating):
        return (key,)
    if isinstance(key, tuple | list) and all(
        isinstance(k, int | float | np.integer | np.floating) and not isinstance(k, bool)
        for k in key
    ):
        return tuple(key)
    return None


def key_fits(key: Any, bound: Any) -> bool:
    """True when bucket ``key`` is no larger than ``bound`` (elementwise for tuples).

    Keys without an order (strings, mixed tuples, tuples of different lengths) are treated as
    fitting: the module then falls back to comparing input sizes.
    """
    a, b = _key_parts(key), _key_parts(bound)
    if a is None or b is None or len(a) != len(b):
        return True
    return all(x <= y for x, y in zip(a, b, strict=True))


def largest_key(keys: Iterable[Any]) -> Any:
    """The key to use as default bucket: the max for ints, the elementwise max for tuples.

    For tuple keys the result may not be one of ``keys`` (``(5, 9)`` and ``(8, 4)`` give
    ``(8, 9)``); it is the smallest key every bucket fits into, which is what the default bucket
    must be for memory sharing.
    """
    keys = list(keys)
    if not keys:
        raise ValueError("largest_key() needs at least one bucket key")
    parts = [_key_parts(k) for k in keys]
    if any(p is None for p in parts) or len({len(p) for p in parts if p is not None}) != 1:
        raise ValueError(f"bucket keys have no common order: {keys!r}")
    if not isinstance(keys[0], tuple | list):
        return max(keys)
    best = tuple(max(col) for col in zip(*[p for p in parts if p is not None], strict=True))
    return type(keys[0])(best) if isinstance(keys[0], tuple) else best


def split_batch(batch_size: int, work_load_list: Sequence[float]) -> list[slice]:
    """Split ``batch_size`` samples across devices in proportion to ``work_load_list``.

    Same split as MXNet's data-parallel executors: each share is rounded, the last device takes
    what rounding left over, and an empty share is an error.
    """
    total = float(sum(work_load_list))
    counts = [round(w * batch_size / total) for w in work_load_list]
    if sum(counts) < batch_size:
        counts[-1] += batch_size - sum(counts)
    slices = []
    end = 0
    for n in counts:
        begin = min(end, batch_size)
        end = min(begin + n, batch_size)
        if begin >= end:
            raise ValueError(
                f"cannot split a batch of {batch_size} over work loads {list(work_load_list)}: "
                "some devices would get no samples"
            )
        slices.append(slice(begin, end))
    return slices


def fewest_rows(devices: int, work_load: Sequence[float] | None) -> int:
    """The smallest batch every device gets a row of (MXNet's split by work load)."""
    loads = list(work_load) if work_load else [1.0] * devices
    for rows in range(devices, 64 * devices + 1):
        try:
            split_batch(rows, loads)
            return rows
        except ValueError:
            continue
    return 64 * devices


def to_descs(shapes: ShapeList | None) -> list[Any] | None:
    """``shapes`` as ``mx.io.DataDesc`` (None stays None)."""
    if shapes is None:
        return None
    return [s if isinstance(s, mx.io.DataDesc) else mx.io.DataDesc(*s) for s in shapes]


def shape_signature(descs: Sequence[Any] | None) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """``((name, shape), ...)``: what two input descriptions must share to bind alike."""
    if not descs:
        return ()
    return tuple((d[0], tuple(d[1])) for d in descs)


def batch_axis(layout: str | None) -> int:
    """The batch axis of a layout (``NTC`` -> 0), negative when it has none."""
    return mx.io.DataDesc.get_batch_axis(layout)


def input_elements(descs: Sequence[Any] | None) -> int:
    """Values in all inputs described (``(name, shape)`` pairs or ``DataDesc``)."""
    return sum(int(np.prod(d[1] if isinstance(d, tuple) else d.shape)) for d in descs or ())
