"""The checks options classes share: config sections, model and iterator options.

Each raises :class:`mxtrain.errors.InvalidValue` naming the key, which the config loader
reports at that key's line.
"""

from __future__ import annotations

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
