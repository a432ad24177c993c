"""The checks options classes share: config sections, model and iterator options.

Each raises :class:`mxtrain.errors.InvalidValue` naming the key, which the config loader
reports at that key's line.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

from mxtrain.errors import InvalidValue


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


class CheckedOptions:
    """Base of the options dataclasses: construction runs ``validate``, so an options object
    that exists is a valid one (each class's ``validate`` raises :class:`InvalidValue` naming
    the first impossible value, in the order its keys are documented)."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        raise NotImplementedError
