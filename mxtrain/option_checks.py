"""The checks options classes share: config sections, model and iterator options.

Each raises :class:`mxtrain.errors.InvalidValue` naming the key, which the config loader
reports at that key's line.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from mxtrain.errors import InvalidValue

T = TypeVar("T")

#: the largest and the smallest normal magnitude of a 32-bit float: MXNet's operators read
#: their float parameters (learning rates, epsilons, scales) as float32 and refuse a value
#: outside this range ("Out of range value for lr"), 0 aside
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.1754943508222875e-38


def documented(default: T, doc: str) -> T:
    """A dataclass field: ``default``, and ``doc``, what `mxtrain check --explain` prints."""
    return field(default=default, metadata={"doc": doc})


def not_int(value: object) -> bool:
    """True unless ``value`` is an int (bools, which are ints in Python, count as not)."""
    return isinstance(value, bool) or not isinstance(value, int)


def check_positive_int(key: str, value: object) -> None:
    """Refuse anything but an integer of at least 1."""
    if not_int(value) or value < 1:  # type: ignore[operator]
        raise InvalidValue(key, f"must be a positive integer, not {value!r}")


def check_greater_than_zero(key: str, value: float | None) -> None:
    """Refuse a number that is not above 0 (None: not set, accepted)."""
    if value is not None and not value > 0:
        raise InvalidValue(key, f"must be greater than 0, got {value!r}.")


def check_at_least(key: str, value: float | None, low: float) -> None:
    """Refuse a number below ``low`` (None: not set, accepted)."""
    if value is not None and value < low:
        raise InvalidValue(key, f"must be at least {low:g}, got {value!r}.")


#: Most threads one setting may ask for (OpenMP threads, MXNet engine workers, decoding
#: threads): above the hardware threads of the largest machines, where more threads only add
#: switching. MXNet 1.9.1 does not refuse a count it cannot start: omp_threads 1,000,000
#: crashed it with SIGSEGV, engine_threads 1,000,000 aborted and 2**31 - 1 exhausted the
#: memory and hung.
MAX_THREADS = 1024


def check_thread_count(key: str, value: object) -> None:
    """Refuse anything but an integer from 1 to :data:`MAX_THREADS`."""
    check_positive_int(key, value)
    if value > MAX_THREADS:  # type: ignore[operator]
        raise InvalidValue(
            key,
            f"must be at most {MAX_THREADS:,} threads, not {value:,}: more threads than the "
            "largest machines have cores only add switching, and MXNet crashes when it cannot "
            "start them (the limit is mxtrain.option_checks.MAX_THREADS)",
        )


#: Most elements one tensor may hold, and so the longest dimension: MXNet 1.9.1 (built
#: without large-tensor support) indexes tensors with 32-bit integers, and a larger shape
#: crashed fit, score or export long after ``mxtrain check`` had accepted it.
MAX_TENSOR_ELEMENTS = 2**31 - 1
#: Longest sequence (bucket length, bptt, exported bucket) a run may ask for: a bucket is
#: one graph, and an unfused recurrent layer builds a node per step of it, so a length of
#: 2**30 never finished building while its batch still fit a tensor.
MAX_SEQUENCE_LENGTH = 100_000
#: Bytes per value of the float32 arrays MXNet computes with.
FLOAT_BYTES = 4


def physical_memory() -> int | None:
    """Bytes of physical memory of this machine, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def gib(nbytes: float) -> str:
    """``nbytes`` as GiB for messages: ``12.5 GiB``."""
    return f"{nbytes / 2**30:,.1f} GiB"


def check_tensor(key: str, what: str, shape: Sequence[int]) -> None:
    """Refuse the value of ``key`` when it makes the tensor ``what`` of ``shape`` too large
    for MXNet (a dimension or the element count above :data:`MAX_TENSOR_ELEMENTS`) or for
    this machine (more float32 bytes than its physical memory)."""
    elements = math.prod(shape)
    dims = " x ".join(f"{d:,}" for d in shape) + (f" = {elements:,}" if len(shape) > 1 else "")
    if elements > MAX_TENSOR_ELEMENTS:
        raise InvalidValue(
            key,
            f"is too large: {what} would be {dims} values, more than the "
            f"{MAX_TENSOR_ELEMENTS:,} (2**31 - 1) one MXNet 1.9.1 tensor can hold; "
            "use a smaller value",
        )
    memory = physical_memory()
    if memory is not None and elements * FLOAT_BYTES > memory:
        raise InvalidValue(
            key,
            f"is too large: {what} would be {dims} float32 values, "
            f"{gib(elements * FLOAT_BYTES)}, more than this machine's {gib(memory)} of "
            "memory; use a smaller value",
        )


def check_sharding(num_parts: object, part_index: object) -> None:
    """``num_parts`` a positive integer and ``part_index`` one of its parts (0-based)."""
    check_positive_int("num_parts", num_parts)
    if not_int(part_index) or not 0 <= part_index < num_parts:  # type: ignore[operator]
        raise InvalidValue(
            "part_index",
            f"must be in 0..{num_parts - 1} (num_parts is {num_parts}), "  # type: ignore[operator]
            f"not {part_index!r}",
        )


def check_choice(key: str, value: object, choices: tuple[str, ...]) -> None:
    """Refuse anything but one of ``choices``."""
    if value not in choices:
        raise InvalidValue(key, f"must be one of {', '.join(choices)}, not {value!r}")


def check_bool(key: str, value: object) -> None:
    """Refuse anything but true or false (YAML's ``yes``/``1`` are not booleans here)."""
    if not isinstance(value, bool):
        raise InvalidValue(key, f"must be true or false, not {value!r}")


def show_number(value: float) -> str:
    """``value`` for a message: as written, or in exponent notation when it is long."""
    if isinstance(value, int) and abs(value) > 10**20:  # beyond what a float formats
        sign = "-" if value < 0 else ""
        return f"{sign}about 1e+{math.floor(math.log10(abs(value)) + 1e-9)}"
    text = repr(value)
    return f"{value:.6g}" if len(text) > 20 else text


def check_float32(key: str, value: float | None) -> None:
    """Refuse a number MXNet's operators cannot take as a float32 parameter: not finite, or a
    magnitude beyond float32's range (None: not set, accepted)."""
    if value is None:
        return
    if not math.isfinite(value) or abs(value) > FLOAT32_MAX:
        raise InvalidValue(
            key, f"must be a finite number of magnitude at most 3.4e38, got {value!r}."
        )
    if value and abs(value) < FLOAT32_TINY:
        raise InvalidValue(
            key,
            f"must be 0 or of magnitude at least 1.2e-38 (MXNet passes it as a 32-bit float), "
            f"got {value!r}.",
        )


@dataclass(frozen=True)
class Bounds:
    """The numbers an option accepts: ``low`` and ``high`` (None: unbounded on that side),
    each included unless ``low_open`` / ``high_open``."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: float) -> bool:
        if isinstance(value, float) and not math.isfinite(value):  # ints compare exactly
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def describe(self) -> str:
        """``in [0, 1)``, ``greater than 0``, ``at least 0``, ``at most 1e+06``."""
        if self.low is not None and self.high is not None:
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            return f"in {left}{self.low:g}, {self.high:g}{right}"
        if self.low is not None:
            return f"{'greater than' if self.low_open else 'at least'} {self.low:g}"
        if self.high is not None:
            return f"{'less than' if self.high_open else 'at most'} {self.high:g}"
        return "a finite number"


def check_bounds(key: str, value: float | None, bounds: Bounds) -> None:
    """Refuse a number outside ``bounds`` (None: not set, accepted)."""
    if value is not None and value not in bounds:
        raise InvalidValue(key, f"must be {bounds.describe()}, got {show_number(value)}.")


class CheckedOptions:
    """Base of the options dataclasses: construction runs ``validate``, so an options object
    that exists is a valid one (each class's ``validate`` raises :class:`InvalidValue` naming
    the first impossible value, in the order its keys are documented)."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        raise NotImplementedError
