"""``initializer.from``: start training from trained weights (warm start, fine-tuning).

The source is a run folder with an optional checkpoint selector (``RUN``, ``RUN:best``,
``RUN:3``, ``RUN:TAG``: the checkpoint ``mxtrain score`` would load), an MXNet parameter file
(``arg:``/``aux:`` names as modules save them, or plain names as Gluon's ``save_parameters``
writes them), or a loader plugin (``file.py:attr`` / ``package.module:attr``, called with no
argument, returning ``{parameter name: array}``). Run folders and parameter files are taken
relative to the current folder (as every other run reference), a plugin file relative to the
config file's folder (as every plugin).

Source names may be renamed by glob (``rename``), left out (``exclude``), and then must match
the model: every parameter the model has must come from the source unless ``allow_missing``
(those keep the initializer's values), every source parameter must be used unless
``allow_extra``, and shapes must agree (each mismatch is named). What was loaded is
returned as a :class:`WarmStartReport`, which run.json keeps.
"""

from __future__ import annotations

import fnmatch
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mxtrain.config.schema import WarmStartSection
from mxtrain.errors import ConfigError, DataError
from mxtrain.registry import Registry
from mxtrain.run.choose import choose_checkpoint
from mxtrain.run.params import ParamsFileError, load_named_arrays
from mxtrain.user_files import require_usable_path

if TYPE_CHECKING:  # annotations only: MXNet must load after the run's thread settings
    from mxtrain.engine.bucketing import BucketingModule

log = logging.getLogger("mxtrain")

KEY = "initializer.from"


@dataclass
class WarmStartReport:
    """Where a run's starting weights came from (run.json ``initialized_from``)."""

    source: str  # as configured
    resolved: str  # the parameter file read (absolute), or the loader reference
    checkpoint: str | None  # the checkpoint tag of a run folder source
    loaded: list[str] = field(default_factory=list)  # model names set from the source
    renamed: dict[str, str] = field(default_factory=dict)  # source name -> model name
    initialized: list[str] = field(default_factory=list)  # left to the initializer
    ignored: list[str] = field(default_factory=list)  # source names not used

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


# ----------------------------------------------------------------------------- sources


def _is_loader(source: str) -> bool:
    head, sep, attr = source.rpartition(":")
    if not sep or not attr.isidentifier() or Path(head).is_dir():
        return False
    return head.endswith(".py") or all(part.isidentifier() for part in head.split("."))


def _read_file(path: Path, where: str) -> dict[str, Any]:
    try:
        arrays = load_named_arrays(path)
    except ParamsFileError as exc:
        raise DataError(
            f"{where}: {KEY}: the parameter file {path} {exc.problem}.",
            hint="Give an MXNet .params file (mx.nd.save of named arrays, a module checkpoint "
            "or Gluon's save_parameters).",
        ) from None
    if not arrays:
        raise DataError(f"{where}: {KEY}: the parameter file {path} holds no parameters.")
    out: dict[str, Any] = {}  # names without a module file's arg:/aux: prefixes
    for key, value in arrays.items():
        kind, sep, name = key.partition(":")
        out[name if sep and kind in ("arg", "aux") else key] = value
    return out


def _read_loader(source: str, base_dir: Path, where: str) -> dict[str, Any]:
    # deferred: MXNet loads after the run's thread settings (a fresh run sets them first)
    import mxnet as mx
    import numpy as np

    entry = Registry("weights loader").get(source, base_dir=base_dir, where=where)
    loader = entry.load()
    with entry.calling("it was called for the weights", f"{where}: {KEY}"):
        arrays = loader()
    if not isinstance(arrays, Mapping) or not arrays:
        raise ConfigError(
            f"{where}: {KEY}: the loader {source!r} returned {type(arrays).__name__}, not a "
            "non-empty mapping of parameter names to arrays.",
            hint="Return {name: numpy array or NDArray}, e.g. {'embed_weight': vectors}.",
        )
    out = {}
    for name, value in arrays.items():
        out[str(name)] = (
            value
            if isinstance(value, mx.nd.NDArray)
            else mx.nd.array(np.asarray(value, dtype=np.float32))
        )
    return out


def read_source(
    spec: WarmStartSection, base_dir: Path, where: str
) -> tuple[dict[str, Any], str, str | None]:
    """(arrays by source name, what was read, checkpoint tag) of ``initializer.from``."""
    source = spec.source
    if _is_loader(source):
        return _read_loader(source, base_dir, where), source, None
    path = Path(source).expanduser()
    require_usable_path(path, f"{KEY} source", error=DataError)
    tag = None
    if not path.is_file():
        if source.endswith(".params") and not path.exists():
            raise DataError(
                f"{where}: {KEY}: the parameter file {path.absolute()} does not exist "
                "(relative paths are taken from the current folder).",
                hint="Fix the path, or run mxtrain from the folder it is relative to.",
            )
        chosen = choose_checkpoint(source)
        if chosen.loaded is not None:
            arrays = {**chosen.loaded.arg_params, **chosen.loaded.aux_params}
            return arrays, str(chosen.params_file), chosen.tag
        path, tag = chosen.params_file, chosen.tag  # unverified: read as any parameter file
    return _read_file(path.absolute(), where), str(path.absolute()), tag


# ----------------------------------------------------------------------------- matching


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """``pattern`` as a regex whose groups are what its ``*``s match, in order."""
    parts = []
    for piece in re.split(r"(\*)", pattern):
        if piece == "*":
            parts.append("(.*)")
        elif piece:
            parts.append(fnmatch.translate(piece).removeprefix("(?s:").removesuffix(")\\Z"))
    return re.compile("(?s:" + "".join(parts) + r")\Z")


def _renamed(name: str, pattern: str, target: str) -> str:
    groups = iter(_glob_regex(pattern).match(name).groups())  # type: ignore[union-attr]
    return re.sub(r"\*", lambda _m: next(groups), target)


def match_parameters(
    arrays: Mapping[str, Any],
    model_shapes: Mapping[str, tuple[int, ...]],
    spec: WarmStartSection,
    where: str,
) -> tuple[dict[str, Any], WarmStartReport]:
    """The source arrays the model takes, by model name; raises ConfigError naming every
    problem (a rename or exclude glob matching nothing, two names for one parameter, missing
    or extra parameters without allow_missing/allow_extra, shape mismatches)."""
    problems: list[str] = []
    for key, globs in (("exclude", spec.exclude), ("rename", list(spec.rename))):
        for pattern in globs:
            if not fnmatch.filter(arrays, pattern):
                problems.append(f"{key} pattern {pattern!r} matches no parameter of the source")
    report = WarmStartReport(spec.source, "", None)
    by_model_name: dict[str, str] = {}
    for name in arrays:
        if any(fnmatch.fnmatchcase(name, p) for p in spec.exclude):
            report.ignored.append(name)
            continue
        hits = [p for p in spec.rename if fnmatch.fnmatchcase(name, p)]
        if len(hits) > 1:
            problems.append(f"{name!r} matches the rename patterns {hits[0]!r} and {hits[1]!r}")
            continue
        target = _renamed(name, hits[0], spec.rename[hits[0]]) if hits else name
        if target in by_model_name:
            problems.append(f"{by_model_name[target]!r} and {name!r} would both set {target!r}")
            continue
        by_model_name[target] = name
        if target != name:
            report.renamed[name] = target
    chosen: dict[str, Any] = {}
    for target, name in sorted(by_model_name.items()):
        if target not in model_shapes:
            report.ignored.append(name)
            continue
        have, want = tuple(arrays[name].shape), tuple(model_shapes[target])
        if have != want:
            shown = name if name == target else f"{name} (as {target})"
            problems.append(f"{shown} is {have} in the source but the model needs {want}")
            continue
        chosen[target] = arrays[name]
    report.loaded = sorted(chosen)
    report.initialized = sorted(set(model_shapes) - set(chosen))
    extra = sorted(
        n for n in report.ignored if not any(fnmatch.fnmatchcase(n, p) for p in spec.exclude)
    )
    if extra and not spec.allow_extra:
        problems.append("the source has parameters the model lacks: " + ", ".join(extra))
    missing = [n for n in report.initialized if n not in by_model_name]  # not mismatched
    if missing and not spec.allow_missing:
        problems.append("the model's parameters " + ", ".join(missing) + " are not in the source")
    if not chosen and not problems:
        problems.append("no parameter of the source matches the model")
    if problems:
        raise ConfigError(
            f"{where}: {KEY}: the weights of {spec.source} do not fit the model: "
            + "; ".join(problems)
            + ". The model's parameters: "
            + ", ".join(f"{n} {tuple(s)}" for n, s in model_shapes.items())
            + ".",
            hint="Use rename to map renamed layers, exclude for layers to train anew (with "
            "allow_missing), allow_extra to ignore the source's other layers.",
        )
    report.ignored.sort()
    return chosen, report


def warm_start(
    module: BucketingModule, spec: WarmStartSection, base_dir: Path, where: str
) -> WarmStartReport:
    """Overwrite ``module``'s initialized parameters with those ``spec`` (``initializer.from``,
    at ``where`` in the config) names; plugin files are taken relative to ``base_dir``."""
    arrays, resolved, tag = read_source(spec, base_dir, where)
    args, auxs = module.get_params()
    shapes = {n: tuple(a.shape) for n, a in [*args.items(), *auxs.items()]}
    chosen, report = match_parameters(arrays, shapes, spec, where)
    report.resolved, report.checkpoint = resolved, tag
    module.set_params(
        {n: v for n, v in chosen.items() if n in args},
        {n: v for n, v in chosen.items() if n in auxs},
        allow_missing=True,
    )
    log.info(
        "weights from %s%s: %d parameters loaded%s%s%s",
        resolved,
        f" (checkpoint {tag})" if tag else "",
        len(report.loaded),
        "; renamed: " + ", ".join(f"{a} -> {b}" for a, b in report.renamed.items())
        if report.renamed
        else "",
        "; initialized: " + ", ".join(report.initialized) if report.initialized else "",
        "; ignored from the source: " + ", ".join(report.ignored) if report.ignored else "",
    )
    return report
