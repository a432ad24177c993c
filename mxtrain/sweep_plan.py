"""What a sweep runs: its axes (``--grid KEY=V1,V2``), its points and their run names.

A point is one ordinary run of the config with one value of each axis as a ``--set``
override. Grid mode runs every combination; ``--random N --seed S`` runs N of them drawn
without replacement by a generator seeded with S, so the same arguments give the same points.
Nothing here imports MXNet or click.
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from mxtrain.config.names import MAX_RUN_NAME_BYTES
from mxtrain.errors import ConfigError

#: most points one sweep may have (a grid grows fast; a typo in a list should not start 10^6 runs)
MAX_POINTS = 10_000

_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


@dataclass(frozen=True)
class Axis:
    """One swept key and its values, as YAML text (``--set KEY=VALUE`` reads each)."""

    key: str
    values: tuple[str, ...]


Point = tuple[tuple[str, str], ...]  # (key, value text) per axis, in axis order


def parse_axis(text: str) -> Axis:
    """``KEY=V1,V2,...``; commas inside brackets, braces or quotes do not split
    (``context.ids=[0,1],[2,3]`` has two values)."""
    key, sep, rest = text.partition("=")
    key = key.strip()
    where = f"--grid {text}"
    if not sep or not _KEY.fullmatch(key):
        raise ConfigError(
            f"{where}: expected KEY=V1,V2,... with a dotted config key.",
            hint="For example --grid optimizer.learning_rate=0.1,0.01 --grid model.dropout=0,0.3.",
        )
    values = tuple(v.strip() for v in _split_top_level(rest))
    if not values or any(not v for v in values):
        raise ConfigError(f"{where}: a value is empty; give values separated by commas.")
    if len(set(values)) != len(values):
        raise ConfigError(f"{where}: a value is listed twice; each point would run twice.")
    return Axis(key, values)


def _split_top_level(text: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    depth, quote = 0, ""
    for char in text:
        if quote:
            quote = "" if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append("".join(current))
            current = []
            continue
        current.append(char)
    parts.append("".join(current))
    return parts


def plan_points(axes: Sequence[Axis], *, sample: int | None = None, seed: int = 0) -> list[Point]:
    """Every combination of the axes' values (the first axis slowest), or ``sample`` of
    them drawn without replacement, kept in grid order."""
    keys = [a.key for a in axes]
    if len(set(keys)) != len(keys):
        twice = next(k for k in keys if keys.count(k) > 1)
        raise ConfigError(f"--grid {twice} is given twice; list all its values in one --grid.")
    total = 1
    for axis in axes:
        total *= len(axis.values)
    if total > MAX_POINTS and sample is None:
        raise ConfigError(
            f"the grid has {total:,} points, more than {MAX_POINTS:,}.",
            hint="Sample some with --random N, or give fewer values.",
        )
    if sample is None:
        chosen = list(range(total))
    else:
        if sample > total:
            raise ConfigError(
                f"--random {sample}: the grid has only {total} points.",
                hint=f"Ask for at most {total}, or leave --random out to run them all.",
            )
        chosen = sorted(random.Random(seed).sample(range(total), sample))
    combos = list(itertools.islice(itertools.product(*[a.values for a in axes]), max(chosen) + 1))
    return [tuple(zip(keys, combos[i], strict=True)) for i in chosen]


def point_name(index: int, point: Point) -> str:
    """``007_learning_rate=0.01,dropout=0.3``: the point's number, then each axis's last key
    part and value, made a valid run folder name (slashes and control characters replaced,
    cut to the name limit)."""
    label = ",".join(f"{key.rsplit('.', 1)[-1]}={value}" for key, value in point)
    label = re.sub(r"[/\\\x00-\x1f\x7f\s]+", "_", label)
    name = f"{index:03d}_{label}"
    while len(name.encode("utf-8")) > MAX_RUN_NAME_BYTES:
        name = name[:-1]
    return name


@dataclass(frozen=True)
class SearchParam:
    """One key of a search (``--search KEY=SPEC``): ``float:LOW:HIGH[:log]``,
    ``int:LOW:HIGH[:log]`` or ``choice:V1,V2,...`` (values as YAML text)."""

    key: str
    kind: str  # float, int or choice
    low: float = 0.0
    high: float = 0.0
    log: bool = False
    choices: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.kind == "choice":
            return f"choice:{','.join(self.choices)}"
        return f"{self.kind}:{self.low:g}:{self.high:g}" + (":log" if self.log else "")


def parse_search(text: str) -> SearchParam:
    """``KEY=float:LOW:HIGH[:log]``, ``KEY=int:LOW:HIGH[:log]`` or ``KEY=choice:V1,V2``."""
    key, sep, spec = text.partition("=")
    key, spec = key.strip(), spec.strip()
    where = f"--search {text}"
    hint = (
        "For example --search optimizer.learning_rate=float:1e-4:1e-1:log, "
        "--search model.num_hidden=int:64:512 or --search model.attention=choice:dot,mlp."
    )
    if not sep or not _KEY.fullmatch(key):
        raise ConfigError(f"{where}: expected KEY=SPEC with a dotted config key.", hint=hint)
    kind, _, rest = spec.partition(":")
    if kind == "choice":
        choices = tuple(v.strip() for v in _split_top_level(rest))
        if len(choices) < 2 or any(not c for c in choices) or len(set(choices)) != len(choices):
            raise ConfigError(f"{where}: give two or more distinct values.", hint=hint)
        return SearchParam(key, "choice", choices=choices)
    parts = rest.split(":")
    if kind not in ("float", "int") or len(parts) not in (2, 3) or parts[2:] not in ([], ["log"]):
        raise ConfigError(
            f"{where}: expected float:LOW:HIGH[:log], int:... or choice:...", hint=hint
        )
    try:
        low, high = (int(p) if kind == "int" else float(p) for p in parts[:2])
    except ValueError:
        raise ConfigError(f"{where}: LOW and HIGH must be {kind} numbers.", hint=hint) from None
    log = parts[2:] == ["log"]
    if not low < high or (log and low <= 0):
        raise ConfigError(
            f"{where}: needs LOW < HIGH" + (", both above 0 on a log scale." if log else "."),
            hint=hint,
        )
    return SearchParam(key, kind, float(low), float(high), log)


def format_value(value: object) -> str:
    """A sampled value as --set text (floats to 6 significant digits)."""
    return f"{value:.6g}" if isinstance(value, float) else str(value)
