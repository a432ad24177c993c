"""How numbers, times and sizes read on the terminal: one formatter per kind of value.

Two durations on purpose: :func:`format_clock` (``0:01:05``) for progress ETAs and epoch
tables, where columns line up; :func:`format_duration` (``3m05s``) for run listings.
"""

from __future__ import annotations

import math
import time


def format_clock(seconds: float | None) -> str:
    """``0:01:05`` (or ``-:--:--`` when unknown)."""
    if seconds is None or not math.isfinite(seconds):
        return "-:--:--"
    whole = round(seconds)
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def format_duration(seconds: float | None) -> str:
    """``42s``, ``3m05s``, ``2h07m``, ``3d04h``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def format_time(timestamp: float | None) -> str:
    """Local ``YYYY-MM-DD HH:MM``; ``-`` when unknown."""
    if timestamp is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(timestamp))


def format_size(size: int) -> str:
    """``512 B``, ``12.3 KB``, ``4.5 MB``, ``1.2 GB`` (powers of 1024)."""
    value = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_value(value: float | None) -> str:
    """A metric value with 4 significant digits (``-`` when missing)."""
    if value is None:
        return "-"
    return f"{value:.4g}"
