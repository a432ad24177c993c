"""YAML experiment files -> :class:`~mxtrain.config.schema.Config`, and back.

The file is composed (not loaded) so every key keeps its line; values are typed by the schema
dataclasses, unknown keys are refused with a suggestion, duplicate keys are refused, and every
error is one :class:`~mxtrain.errors.ConfigError` paragraph that starts with ``file:line`` (or
with the ``--set`` override that caused it).

Scalars follow YAML 1.2's core schema rather than PyYAML's YAML 1.1 one: only ``true``/``false``
are booleans (``yes``, ``no``, ``on``, ``off`` stay strings), ``1e-3`` is a number, ``010`` is
ten and dates stay strings. Only plain scalars, lists and mappings are built: no tags, no
Python objects. This module is the only place in mxtrain that reads or writes YAML; it imports
neither MXNet nor click.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, NoReturn, TypeVar, get_args, get_origin, get_type_hints

import yaml
from yaml.nodes import Node

import mxtrain
from mxtrain.config.includes import read_config_text, read_tree
from mxtrain.config.schema import (
    COMPRESSION_HINT,
    DECODING_METRIC_HINT,
    INITIALIZERS,
    LR_COMMON_KEYS,
    LR_HORIZON_TYPES,
    LR_REQUIRED_KEYS,
    LR_SCHEDULER_KEYS,
    OPTIMIZERS,
    REQUIRED,
    SECTIONS,
    SEQ2SEQ_HINT,
    SHARDING_HINT,
    SPARSE_OPTIMIZERS,
    CallbackSection,
    CheckpointSection,
    ComponentSection,
    Config,
    ContextSection,
    DataSection,
    ExperimentSection,
    FitSection,
    InitializerOverride,
    InitializerSection,
    IteratorSection,
    KVStoreSection,
    LoggingSection,
    LrSchedulerSection,
    ModelSection,
    OptimizerSection,
    ParamSpec,
    TrackingSection,
    WarmStartSection,
    decoding_model_problem,
    evaluation_metric_names,
    gradient_compression_problem,
    pairing_problem,
    sharding_problem,
    training_metric_problem,
    updates_on_servers,
    worker_update_keys,
)
from mxtrain.config.yaml_tree import (
    _SEQ,
    KeyPath,
    Locations,
    TreeBuilder,
    _dotted,
    _install_resolvers,
    _show,
    _show_plain,
    compose_yaml,
)
from mxtrain.errors import ConfigError, InvalidValue
from mxtrain.registry import CALLBACKS, ITERATORS, METRICS, MODELS, Registry
from mxtrain.text_metrics import is_decoding_metric

SectionT = TypeVar("SectionT", bound=ComponentSection)
ExplainRow = tuple[str, Any, Any, str]  # (dotted key, value, default, doc)


class _Dumper(yaml.SafeDumper):
    """SafeDumper that quotes every string the loader would not read back as a string."""


_install_resolvers(_Dumper)


def _represent_list(dumper: yaml.SafeDumper, data: list[Any]) -> Node:
    """Lists of scalars on one line (``ids: [0, 1]``), anything nested in block style."""
    flow = all(not isinstance(v, (list, tuple, dict)) for v in data)
    return dumper.represent_sequence(_SEQ, data, flow_style=flow)


_Dumper.add_representer(list, _represent_list)

# --------------------------------------------------------------------------------------------
# Small helpers for messages
# --------------------------------------------------------------------------------------------


def _suggest(word: str, choices: Sequence[str]) -> str | None:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return close[0] if close else None


def _sentence(text: str) -> str:
    text = text.strip()
    return text if text.endswith((".", "?", "!")) else text + "."


def _is_union(tp: Any) -> bool:
    return get_origin(tp) in (typing.Union, types.UnionType)


def _describe(tp: Any, plural: bool = False) -> str:
    """How a type reads in an error message: ``an integer``, ``one of 'cpu', 'gpu'``."""
    if tp is Any:
        return "any values" if plural else "any value"
    if _is_union(tp):
        args = [a for a in get_args(tp) if a is not type(None)]
        text = " or ".join(_describe(a, plural) for a in args)
        return text + " or null" if type(None) in get_args(tp) else text
    origin = get_origin(tp)
    if origin is Literal:
        opts = ", ".join(_show_plain(a) for a in get_args(tp))
        return opts if len(get_args(tp)) == 1 else f"one of {opts}"
    if origin in (list, tuple, Sequence) or tp in (list, tuple):
        args = [a for a in get_args(tp) if a is not Ellipsis]
        return f"a list of {_describe(args[0], True)}" if args else "a list"
    if origin in (dict, Mapping) or tp in (dict, Mapping) or dataclasses.is_dataclass(tp):
        return "mappings" if plural else "a mapping"
    names = {
        bool: ("true or false", "true or false values"),
        int: ("an integer", "integers"),
        float: ("a number", "numbers"),
        str: ("a string", "strings"),
        Path: ("a path", "paths"),
        type(None): ("null", "nulls"),
    }
    if tp in names:
        return names[tp][1 if plural else 0]
    return getattr(tp, "__name__", str(tp))


_INT_RANGE_HINT = "Integers must lie between -2**63 and 2**63 - 1; no size or count needs more."


class _Mismatch(Exception):
    """A value of the wrong type; becomes a ConfigError once its location is known."""

    def __init__(self, path: KeyPath, expected: str, value: Any, hint: str = "") -> None:
        super().__init__(expected)
        self.path = path
        self.expected = expected
        self.value = value
        self.hint = hint


# --------------------------------------------------------------------------------------------
# Overrides
# --------------------------------------------------------------------------------------------


def _printable(text: str) -> str:
    """``text`` with control characters and lone surrogates escaped, safe to print anywhere."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _apply_override(tree: dict[str, Any], text: str, locs: Locations) -> None:
    label = f"--set {_printable(text)}"
    key, sep, value_text = text.partition("=")
    key = key.strip()
    parts = key.split(".")
    if not sep or not key or any(not p.strip() for p in parts):
        raise ConfigError(
            f"{label}: expected KEY=VALUE with a dotted key.",
            hint="For example --set fit.num_epoch=2 or --set context.ids=[0,1].",
        )
    parts = [p.strip() for p in parts]
    vlocs = Locations(label)
    node = compose_yaml(value_text, label, is_file=False) if value_text.strip() else None
    builder = TreeBuilder(label, vlocs, lambda _line: label)
    value = builder.build(node, ()) if node is not None else None
    target: dict[str, Any] = tree
    for i, part in enumerate(parts[:-1]):
        path = tuple(parts[: i + 1])
        child = target.get(part)
        if child is None:
            child = {}
            target[part] = child
            locs.set(path, label)
        elif not isinstance(child, dict):
            raise ConfigError(
                f"{label}: {_dotted(path)!r} is {_show(child)}, not a section, so it has no "
                f"key {parts[i + 1]!r}.",
                hint=f"Set the whole value instead: --set {_dotted(path)}=...",
            )
        target = child
    full: KeyPath = tuple(parts)
    target[parts[-1]] = value
    locs.drop_under(full)
    locs.set(full, label)


# --------------------------------------------------------------------------------------------
# Typing plain values into dataclasses
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Registries:
    """Where component names are looked up (tests pass their own)."""

    models: Registry = MODELS
    iterators: Registry = ITERATORS
    metrics: Registry = METRICS
    callbacks: Registry = CALLBACKS


@dataclass(frozen=True)
class _FieldSpec:
    name: str
    type: Any
    default: Any  # REQUIRED when there is none
    doc: str


def _field_default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return REQUIRED


def _field_specs(cls: type, what: str) -> list[_FieldSpec]:
    try:
        hints = get_type_hints(cls)
    except Exception as exc:
        raise ConfigError(
            f"{what}: cannot read the type annotations of {cls.__qualname__} "
            f"({type(exc).__name__}: {exc})."
        ) from None
    return [
        _FieldSpec(f.name, hints.get(f.name, Any), _field_default(f), f.metadata.get("doc", ""))
        for f in dataclasses.fields(cls)
        if f.init
    ]


FINITE_HINT = "NaN and infinities are not accepted; a key without a limit takes null."


class _Builder:
    def __init__(
        self, locs: Locations, base_dir: Path, registries: Registries, default_name: str
    ) -> None:
        self.locs = locs
        self.base_dir = base_dir
        self.registries = registries
        self.default_name = default_name

    # -- errors ---------------------------------------------------------------------------

    def where(self, path: KeyPath) -> str:
        return self.locs.where(path)

    def fail(self, path: KeyPath, message: str, hint: str | None = None) -> NoReturn:
        raise ConfigError(f"{self.where(path)}: {_sentence(message)}", hint=hint)

    def unknown_key(
        self,
        path: KeyPath,
        key: str,
        valid: Sequence[str],
        extra: str | None = None,
        synonyms: Mapping[str, str] | None = None,
    ) -> NoReturn:
        close = (synonyms or {}).get(key) or _suggest(key, valid)
        parts = []
        if close:
            parts.append(f"Did you mean {close!r}?")
        if extra:
            parts.append(extra)
        section = f"in {_dotted(path)!r}" if path else "at the top level"
        parts.append(f"Valid keys {section}: {', '.join(valid)}.")
        self.fail((*path, key), f"unknown key {_dotted((*path, key))!r}.", hint=" ".join(parts))

    def mismatch(self, exc: _Mismatch) -> NoReturn:
        hint = exc.hint or None
        self.fail(
            exc.path, f"{_dotted(exc.path)} must be {exc.expected}, got {_show(exc.value)}", hint
        )

    def mapping(self, raw: Any, path: KeyPath, *, null_ok: bool = True) -> dict[str, Any]:
        if raw is None and null_ok:
            return {}
        if not isinstance(raw, dict):
            self.fail(
                path,
                f"{_dotted(path)} must be a mapping of keys to values, got {_show(raw)}",
                hint="Indent its keys below it, or write {key: value, ...}.",
            )
        return raw

    # -- values ---------------------------------------------------------------------------

    def value(self, tp: Any, raw: Any, path: KeyPath) -> Any:
        """``raw`` typed as ``tp``; raises _Mismatch with the failing path."""
        if tp is Any or tp is object:
            return raw
        if _is_union(tp):
            return self._union(tp, raw, path)
        origin = get_origin(tp)
        if origin is Literal:
            for option in get_args(tp):
                if type(raw) is type(option) and raw == option:
                    return option
            hint = ""
            if isinstance(raw, str):
                close = _suggest(raw, [a for a in get_args(tp) if isinstance(a, str)])
                hint = f"Did you mean {close!r}?" if close else ""
            raise _Mismatch(path, _describe(tp), raw, hint)
        if tp is bool:
            if isinstance(raw, bool):
                return raw
            hint = ""
            if isinstance(raw, str) and raw.lower() in ("yes", "no", "on", "off", "y", "n"):
                hint = "Write true or false (unquoted)."
            raise _Mismatch(path, "true or false", raw, hint)
        if tp is int:
            if isinstance(raw, bool) or not isinstance(raw, (int, float)):
                raise _Mismatch(path, "an integer", raw)
            if isinstance(raw, float) and not raw.is_integer():  # 1.5, .inf, .nan
                raise _Mismatch(path, "an integer", raw, "Write a whole number such as 32.")
            if not -(2**63) <= raw < 2**63:  # nothing larger fits the 64-bit sizes numpy uses
                raise _Mismatch(path, "an integer that fits 64 bits", raw, _INT_RANGE_HINT)
            return int(raw)
        if tp is float:
            # NaN and infinities reach no consumer that means something by them (a limit
            # has null for "none"); huge integers would overflow float()
            if isinstance(raw, (int, float)) and not isinstance(raw, bool):
                try:
                    number = float(raw)
                except OverflowError:
                    number = math.inf
                if math.isfinite(number):
                    return number
                raise _Mismatch(path, "a finite number", raw, FINITE_HINT)
            raise _Mismatch(path, "a number", raw)
        if tp is str:
            if isinstance(raw, str):
                return raw
            hint = "Put it in quotes if it is meant as text." if raw is not None else ""
            raise _Mismatch(path, "a string", raw, hint)
        if tp is Path:
            if isinstance(raw, str) and raw:
                return Path(raw)
            raise _Mismatch(path, "a path", raw)
        if tp is type(None):
            if raw is None:
                return None
            raise _Mismatch(path, "null", raw)
        if origin in (list, tuple, Sequence) or tp in (list, tuple):
            return self._sequence(tp, raw, path)
        if origin in (dict, Mapping) or tp in (dict, Mapping):
            if not isinstance(raw, dict):
                raise _Mismatch(path, "a mapping", raw)
            args = get_args(tp)
            vtype = args[1] if len(args) == 2 else Any
            items = {str(k): self.value(vtype, v, (*path, str(k))) for k, v in raw.items()}
            return items if origin is dict or tp is dict else MappingProxyType(items)
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            if not isinstance(raw, dict):
                raise _Mismatch(path, "a mapping", raw)
            return self.dataclass(tp, raw, path)
        return raw  # an annotation we do not check (the class's own __post_init__ may)

    def _union(self, tp: Any, raw: Any, path: KeyPath) -> Any:
        args = get_args(tp)
        if raw is None:
            if type(None) in args:
                return None
            raise _Mismatch(path, _describe(tp), raw)
        deepest: _Mismatch | None = None
        hint = ""
        for arg in args:
            if arg is type(None):
                continue
            try:
                return self.value(arg, raw, path)
            except _Mismatch as exc:
                if len(exc.path) > len(path) and deepest is None:
                    deepest = exc
                hint = hint or exc.hint
        if deepest is not None:
            raise deepest
        raise _Mismatch(path, _describe(tp), raw, hint)

    def _sequence(self, tp: Any, raw: Any, path: KeyPath) -> Any:
        if not isinstance(raw, list):
            raise _Mismatch(path, _describe(tp), raw)
        origin = get_origin(tp) or tp
        args = get_args(tp)
        if origin is tuple and args and (len(args) != 2 or args[1] is not Ellipsis):
            if len(raw) != len(args):
                raise _Mismatch(path, f"a list of {len(args)} values", raw)
            return tuple(
                self.value(a, v, (*path, i)) for i, (a, v) in enumerate(zip(args, raw, strict=True))
            )
        elem = args[0] if args else Any
        items = [self.value(elem, v, (*path, i)) for i, v in enumerate(raw)]
        return items if origin is list else tuple(items)

    # -- dataclasses ----------------------------------------------------------------------

    def check_keys(
        self,
        raw: Mapping[str, Any],
        path: KeyPath,
        valid: Sequence[str],
        extra_hint: Callable[[str], str | None] | None = None,
        synonyms: Mapping[str, str] | None = None,
    ) -> None:
        valid_set = set(valid)  # one lookup per key, whatever the number of keys
        for key in raw:
            if key not in valid_set:
                extra = extra_hint(key) if extra_hint else None
                self.unknown_key(path, key, valid, extra, synonyms)

    def convert(self, specs: Sequence[_FieldSpec], raw: Mapping[str, Any], path: KeyPath) -> dict:
        """Typed values of the keys present in ``raw``; complains about missing required ones."""
        out: dict[str, Any] = {}
        for spec in specs:
            if spec.name in raw:
                try:
                    out[spec.name] = self.value(spec.type, raw[spec.name], (*path, spec.name))
                except _Mismatch as exc:
                    self.mismatch(exc)
            elif spec.default is REQUIRED:
                doc = f" ({spec.doc})" if spec.doc else ""
                self.fail(
                    path,
                    f"{_dotted(path) or 'the config'} is missing the required key "
                    f"{spec.name!r}{doc}",
                    hint=f"Add {spec.name}: ... to {_dotted(path) or 'the file'}.",
                )
        return out

    def instantiate(self, cls: type, kwargs: dict[str, Any], path: KeyPath) -> Any:
        """``cls(**kwargs)``, its refusal turned into a ConfigError at the right line: an
        :class:`InvalidValue` at its key's line, any other ValueError (a plugin's) at the
        section's."""
        try:
            return cls(**kwargs)
        except InvalidValue as exc:
            key_path = (*path, *exc.key.split("."))
            self.fail(key_path, f"{_dotted(key_path)} {exc.problem}")
        except ValueError as exc:
            message = str(exc).strip() or type(exc).__name__
            self.fail(path, f"{_dotted(path)}: {message}")

    def dataclass(self, cls: type, raw: Mapping[str, Any], path: KeyPath, **preset: Any) -> Any:
        specs = _field_specs(cls, self.where(path))
        self.check_keys(raw, path, [s.name for s in specs if s.name not in preset])
        return self.instantiate(cls, {**self.convert(specs, raw, path), **preset}, path)

    # -- sections -------------------------------------------------------------------------

    def config(self, tree: dict[str, Any], source: str) -> Config:
        self.check_keys(tree, (), list(SECTIONS))

        def simple(cls: type, name: str) -> Callable[[Any], Any]:
            return lambda raw: self.dataclass(cls, self.mapping(raw, (name,)), (name,))

        builders: dict[str, Callable[[Any], Any]] = {
            "experiment": lambda raw: self.dataclass(
                ExperimentSection,
                {"name": self.default_name, **self.mapping(raw, ("experiment",))},
                ("experiment",),
            ),
            "model": lambda raw: self.component(
                raw, ("model",), self.registries.models, ModelSection, required=False
            ),
            "data": self.data,
            "context": simple(ContextSection, "context"),
            "kvstore": simple(KVStoreSection, "kvstore"),
            "optimizer": lambda raw: self.optimizer(self.mapping(raw, ("optimizer",))),
            "initializer": lambda raw: self.initializer(self.mapping(raw, ("initializer",))),
            "fit": lambda raw: self.fit(self.mapping(raw, ("fit",))),
            "checkpoint": simple(CheckpointSection, "checkpoint"),
            "logging": simple(LoggingSection, "logging"),
            "tracking": simple(TrackingSection, "tracking"),
        }
        # sections in file order, so the first error reported is the first one in the file
        order = [name for name in tree if name in builders]
        order += [name for name in builders if name not in tree]
        sections = {name: builders[name](tree.get(name)) for name in order}
        config = Config(
            **sections,
            source=source,
            base_dir=self.base_dir,
            locate=self.locs.where,
            origin=self.locs.exact,
        )
        config = self.schedule_horizon(config)
        self.cross_check(config)
        return config

    def schedule_horizon(self, config: Config) -> Config:
        """A poly/cosine ``max_update: null`` becomes the run's length (``fit.num_epoch``
        epochs); an epoch-counted horizon other than the run's length is noted."""
        sched = config.optimizer.lr_scheduler
        if sched is None or sched.type not in LR_HORIZON_TYPES:
            return config
        path = ("optimizer", "lr_scheduler", "max_update")
        epochs = config.fit.num_epoch
        if sched.max_update is None:
            if sched.unit != "epochs":
                self.fail(
                    path,
                    "optimizer.lr_scheduler.max_update: null follows the run's length, which "
                    "is known in epochs only; this schedule counts updates",
                    hint="Add unit: epochs to the lr_scheduler (warmup_steps then counts epochs "
                    "too), or give max_update as an update count.",
                )
            try:
                sched = dataclasses.replace(sched, max_update=epochs)
            except InvalidValue as exc:
                self.fail(path, f"optimizer.lr_scheduler.{exc.key} {exc.problem}")
            optimizer = dataclasses.replace(config.optimizer, lr_scheduler=sched)
            return dataclasses.replace(config, optimizer=optimizer)
        if sched.unit == "epochs" and sched.max_update != epochs:
            ends = "before" if sched.max_update < epochs else "after"
            note = (
                f"{self.locs.where(path)}: the {sched.type} schedule reaches final_lr at epoch "
                f"{sched.max_update}, {ends} the run's last (fit.num_epoch: {epochs}); "
                "max_update: null follows the run's length"
            )
            return dataclasses.replace(config, notes=(*config.notes, note))
        return config

    def component(
        self,
        raw: Any,
        path: KeyPath,
        registry: Registry,
        cls: type[SectionT],
        *,
        required: bool,
    ) -> SectionT:
        if raw is None and required:
            self.fail(
                path,
                f"{_dotted(path)} is required: it says which data to train on",
                hint=f"Add for example {path[-1]}: {{{cls.selector}: "
                f"{_field_default(_dc_field(cls, 'name'))}, source: train.txt}}.",
            )
        section = self.mapping(raw, path)
        selector = cls.selector
        name_default = _field_default(_dc_field(cls, "name"))
        sel_path = (*path, selector)
        try:
            name = self.value(str, section.get(selector, name_default), sel_path)
        except _Mismatch as exc:
            self.mismatch(exc)
        where = f"{self.where(sel_path)}: {_dotted(sel_path)}"
        try:
            entry = registry.get(name, base_dir=self.base_dir, where=where)
            options_cls = entry.options_class()
        except ConfigError as exc:
            if exc.message.startswith(where):
                raise
            raise ConfigError(f"{where}: {exc.message}", hint=exc.hint) from None
        rest = {k: v for k, v in section.items() if k != selector}
        if options_cls is not None and dataclasses.is_dataclass(options_cls):
            # a plugin's options class is its code too: its failure is named as the plugin's
            with entry.calling("its options were checked", where):
                specs = _field_specs(options_cls, where)
                synonyms = getattr(options_cls, "key_synonyms", None)
                self.check_keys(rest, path, [selector, *(s.name for s in specs)], synonyms=synonyms)
                options = self.instantiate(options_cls, self.convert(specs, rest, path), path)
        else:
            try:
                accepted = entry.accepted_keywords()
            except ConfigError as exc:
                raise ConfigError(f"{where}: {exc.message}", hint=exc.hint) from None
            if accepted is not None:
                self.check_keys(rest, path, [selector, *accepted])
            options = MappingProxyType(dict(rest))
        return cls(name=name, options=options)

    def data(self, raw: Any) -> DataSection:
        path: KeyPath = ("data",)
        if raw is None:
            self.fail(
                path,
                "the config has no data section; data.train is required",
                hint="Add for example data: {train: {iterator: bucket_sentence, "
                "source: train.txt}}.",
            )
        section = self.mapping(raw, path)
        self.check_keys(section, path, ["train", "eval"])
        its = self.registries.iterators
        train = self.component(
            section.get("train"), ("data", "train"), its, IteratorSection, required=True
        )
        eval_raw = section.get("eval")
        if eval_raw is None:
            return DataSection(train=train, eval=None)
        if not _names_eval_sets(eval_raw):
            return DataSection(
                train=train, eval=self.eval_section(train, eval_raw, ("data", "eval"))
            )
        sets = []
        for name, raw in eval_raw.items():
            if not _SET_NAME.fullmatch(name):
                self.fail(
                    ("data", "eval", name),
                    f"data.eval.{name}: an eval set's name is a word (letters, digits, _), since "
                    "its metrics are named set.metric",
                    hint="Rename it, e.g. valid or test.",
                )
            sets.append((name, self.eval_section(train, raw, ("data", "eval", name))))
        return DataSection(train=train, eval=sets[0][1], eval_sets=tuple(sets))

    def eval_section(self, train: IteratorSection, raw: Any, path: KeyPath) -> IteratorSection:
        """One evaluation iterator, reading its data like ``train`` unless it says otherwise."""
        its = self.registries.iterators
        evaluate = self.component(raw, path, its, IteratorSection, required=False)
        return _inherit_train_reading(train, evaluate, self.mapping(raw, path))

    def table_name(
        self, raw: dict[str, Any], path: KeyPath, default: str, table: Mapping[str, Any]
    ) -> str:
        """The section's ``name``, which must be a key of ``table`` (optimizers, initializers)."""
        try:
            name = self.value(str, raw.get("name", default), (*path, "name"))
        except _Mismatch as exc:
            self.mismatch(exc)
        if name not in table:
            kind = path[-1]
            close = _suggest(name.lower(), list(table))
            self.fail(
                (*path, "name"),
                f"unknown {kind} {name!r} in {kind}.name",
                hint=(f"Did you mean {close!r}? " if close else "")
                + f"MXNet {kind}s: {', '.join(table)}.",
            )
        return typing.cast(str, name)

    def optimizer(self, raw: dict[str, Any]) -> OptimizerSection:
        path: KeyPath = ("optimizer",)
        name = self.table_name(raw, path, "sgd", OPTIMIZERS)
        spec = OPTIMIZERS[name]
        own = [s for s in _field_specs(OptimizerSection, "optimizer") if s.name != "params"]
        own = [
            dataclasses.replace(s, default=spec.learning_rate) if s.name == "learning_rate" else s
            for s in own
        ]
        params = _param_field_specs(spec.params)
        valid = [s.name for s in own] + [s.name for s in params]

        def other_optimizers(key: str) -> str | None:
            users = [n for n, o in OPTIMIZERS.items() if key in o.params and o.refusal is None]
            if users:
                return f"{key!r} is a parameter of {', '.join(users)}, not of {name}."
            return None

        self.check_keys(raw, path, valid, other_optimizers)
        own_raw = {k: v for k, v in raw.items() if k != "lr_scheduler"}
        kwargs = self.convert([s for s in own if s.name != "lr_scheduler"], own_raw, path)
        kwargs.setdefault("learning_rate", spec.learning_rate)
        if raw.get("lr_scheduler") is not None:
            kwargs["lr_scheduler"] = self.lr_scheduler(raw["lr_scheduler"])
        values = self.convert(params, raw, path)
        return typing.cast(
            OptimizerSection,
            self.instantiate(OptimizerSection, {**kwargs, "params": values}, path),
        )

    def lr_scheduler(self, raw: Any) -> LrSchedulerSection:
        path: KeyPath = ("optimizer", "lr_scheduler")
        section = self.mapping(raw, path, null_ok=False)
        specs = _field_specs(LrSchedulerSection, "optimizer.lr_scheduler")
        self.check_keys(section, path, [s.name for s in specs])
        kwargs = self.convert(specs, section, path)
        kind = kwargs["type"]
        applicable = {"type", *LR_SCHEDULER_KEYS[kind], *LR_COMMON_KEYS}
        for key in section:
            if key not in applicable:
                users = [t for t, keys in LR_SCHEDULER_KEYS.items() if key in keys]
                close = _suggest(key, sorted(applicable))
                hint = f"Did you mean {close!r}? " if close else ""
                self.fail(
                    (*path, key),
                    f"optimizer.lr_scheduler.{key} does not apply to type {kind!r} "
                    f"(it is used by {', '.join(users)})",
                    hint=f"{hint}Keys for {kind!r}: "
                    f"{', '.join(k for k in (s.name for s in specs) if k in applicable)}; "
                    f"{kind!r} requires {LR_REQUIRED_KEYS[kind]}.",
                )
        return typing.cast(LrSchedulerSection, self.instantiate(LrSchedulerSection, kwargs, path))

    def initializer_parts(
        self, raw: dict[str, Any], path: KeyPath, default: str, extra: Sequence[str]
    ) -> tuple[str, dict[str, Any]]:
        """(name, parameters) of an initializer mapping; ``extra`` keys are the caller's."""
        name = self.table_name(raw, path, default, INITIALIZERS)
        params = _param_field_specs(INITIALIZERS[name].params)

        def others(key: str) -> str | None:
            users = [n for n, s in INITIALIZERS.items() if key in s.params]
            if users:
                return f"{key!r} is a parameter of {', '.join(users)}, not of {name}."
            return None

        self.check_keys(raw, path, ["name", *extra, *(s.name for s in params)], others)
        return name, self.convert(params, {k: v for k, v in raw.items() if k not in extra}, path)

    def warm_start(self, raw: Any) -> WarmStartSection | None:
        """``initializer.from``: null, a source string, or a mapping."""
        path: KeyPath = ("initializer", "from")
        if raw is None:
            return None
        if isinstance(raw, str):
            raw = {"source": raw}
        section = self.mapping(raw, path, null_ok=False)
        return typing.cast(WarmStartSection, self.dataclass(WarmStartSection, section, path))

    def initializer(self, raw: dict[str, Any]) -> InitializerSection:
        path: KeyPath = ("initializer",)
        name, values = self.initializer_parts(raw, path, "xavier", ["overrides", "from"])
        warm_start = self.warm_start(raw.get("from"))
        overrides = []
        items = raw.get("overrides") or []
        if not isinstance(items, list):
            self.fail(
                (*path, "overrides"),
                "initializer.overrides must be a list of {pattern, name, ...} mappings",
                hint="Example: overrides: [{pattern: '*_bias', name: zero}]",
            )
        for i, item in enumerate(items):
            item_path: KeyPath = (*path, "overrides", str(i))
            item = self.mapping(item, item_path, null_ok=False)
            if not isinstance(item.get("pattern"), str) or not item["pattern"]:
                self.fail(
                    item_path,
                    f"initializer.overrides[{i}] needs a 'pattern' (a glob over parameter names)",
                    hint="Example: {pattern: '*_bias', name: zero}",
                )
            sub_name, sub_values = self.initializer_parts(item, item_path, "zero", ["pattern"])
            overrides.append(
                self.instantiate(
                    InitializerOverride,
                    {"pattern": item["pattern"], "name": sub_name, "params": sub_values},
                    item_path,
                )
            )
        return typing.cast(
            InitializerSection,
            self.instantiate(
                InitializerSection,
                {
                    "name": name,
                    "params": values,
                    "overrides": tuple(overrides),
                    "warm_start": warm_start,
                },
                path,
            ),
        )

    def callbacks(self, raw: Any) -> tuple[CallbackSection, ...]:
        """``fit.callbacks``: a list of plugin references or ``{name: ref, ...options}``."""
        path: KeyPath = ("fit", "callbacks")
        if raw is None:
            return ()
        if not isinstance(raw, list):
            self.fail(
                path,
                "fit.callbacks must be a list of callback plugins",
                hint="Example: callbacks: [hooks.py:Notify, {name: hooks.py:StopAt, "
                "accuracy: 0.95}]",
            )
        items = []
        for i, item in enumerate(raw):
            if not isinstance(item, (str, dict)):
                self.fail(
                    (*path, i),
                    f"fit.callbacks[{i}] must be a plugin reference or a mapping with a name, "
                    f"not {_show(item)}",
                    hint="Example: hooks.py:Notify, or {name: hooks.py:StopAt, accuracy: 0.95}.",
                )
            section = {"name": item} if isinstance(item, str) else item
            items.append(
                self.component(
                    section, (*path, i), self.registries.callbacks, CallbackSection, required=True
                )
            )
        return tuple(items)

    def fit(self, raw: dict[str, Any]) -> FitSection:
        path: KeyPath = ("fit",)
        callbacks = self.callbacks(raw.get("callbacks"))
        plain = {k: v for k, v in raw.items() if k != "callbacks"}
        fit = typing.cast(FitSection, self.dataclass(FitSection, plain, path, callbacks=callbacks))
        for key in ("metrics", "eval_metrics"):
            for i, name in enumerate(getattr(fit, key) or ()):
                item = (*path, key, i) if key in raw else path
                where = f"{self.where(item)}: fit.{key}[{i}]"
                problem = training_metric_problem(name) if key == "metrics" else None
                if problem is not None:
                    raise ConfigError(f"{where}: {problem}", hint=DECODING_METRIC_HINT)
                if is_decoding_metric(name):  # not a registered metric: checked in cross_check
                    continue
                try:
                    self.registries.metrics.get(name, base_dir=self.base_dir, where=where)
                except ConfigError as exc:
                    if exc.message.startswith(where):
                        raise
                    raise ConfigError(f"{where}: {exc.message}", hint=exc.hint) from None
        return fit

    def _check_sparse_embedding(self, config: Config) -> None:
        """``model.sparse_embedding: true`` where its row_sparse gradients cannot train:
        several devices or processes (the module's kvstore calls sum dense gradients),
        accumulated gradients (MXNet cannot add row_sparse ones), optimizers without sparse
        updates."""
        if not getattr(config.model.options, "sparse_embedding", False):
            return
        context, kv_type = config.context, config.kvstore.type
        devices = len(context.ids) if context.ids else (context.count or 1)
        accumulation = config.fit.grad_accumulation
        if devices > 1:
            problem = f"trains on one device; context names {devices}"
            hint = "Set context.count (or ids) to one device, or sparse_embedding: false."
        elif kv_type.startswith("dist") or kv_type == "horovod":
            problem = f"trains in one process; kvstore.type is {kv_type}"
            hint = "Use sparse_embedding: false for distributed training."
        elif accumulation > 1:
            problem = (
                f"cannot add gradients over batches (fit.grad_accumulation is {accumulation}): "
                "MXNet refuses to accumulate row_sparse ones"
            )
            hint = "Set fit.grad_accumulation: 1, or sparse_embedding: false."
        elif config.optimizer.name not in SPARSE_OPTIMIZERS:
            problem = (
                "needs an optimizer that updates rows of a row_sparse gradient "
                f"({', '.join(SPARSE_OPTIMIZERS)}), not {config.optimizer.name}"
            )
            hint = "Choose one of those optimizers, or sparse_embedding: false."
        else:
            return
        self.fail(("model", "sparse_embedding"), f"sparse_embedding: true {problem}", hint)

    def cross_check(self, config: Config) -> None:
        """Rules that involve more than one section (or key); fit relies on them too."""
        problem = gradient_compression_problem(config.kvstore.type)
        if config.kvstore.gradient_compression is not None and problem is not None:
            self.fail(("kvstore", "gradient_compression"), problem, hint=COMPRESSION_HINT)
        train, evaluate = config.data.train, config.data.eval
        problem = sharding_problem(config.kvstore.type, train.name, train.options)
        if problem is not None:
            self.fail(
                ("data", "train", "iterator"), f"data.train.iterator: {problem}", hint=SHARDING_HINT
            )
        problem = pairing_problem(config.model.name, train.name)
        if problem is not None:
            self.fail(
                ("data", "train", "iterator"),
                problem,
                hint="`mxtrain init --template seq2seq` writes a sequence-to-sequence config.",
            )
        if evaluate is not None and evaluate.name == train.name:
            # e.g. bucket_sentence level/lowercase: eval text must be tokenized like train's
            for key in getattr(type(train.options), "must_match_train", ()):
                mine, theirs = getattr(evaluate.options, key), getattr(train.options, key)
                if mine != theirs:
                    self.fail(
                        ("data", "eval", key),
                        f"data.eval.{key} is {_show_plain(mine)} but data.train.{key} is "
                        f"{_show_plain(theirs)}; the eval data must be read like the training "
                        "data (it shares its vocabulary)",
                        hint=f"Set data.eval.{key}: {_show_plain(theirs)}, as in data.train.",
                    )
        if config.kvstore.type == "nccl" and config.context.devices != "gpu":
            self.fail(
                ("kvstore", "type"),
                "kvstore.type nccl needs context.devices: gpu (NCCL only reduces on GPUs)",
                hint="Use kvstore.type local or device on CPUs.",
            )
        kv = config.kvstore
        for path in worker_update_keys(config.optimizer):
            if updates_on_servers(kv.type, kv.update_on_kvstore):
                self.fail(
                    path,
                    f"{'.'.join(path)} needs the updates on the workers, but kvstore.type "
                    f"{kv.type} with update_on_kvstore {_show_plain(kv.update_on_kvstore)} "
                    "updates on the servers, which never see the summed gradients' norm or "
                    "the epoch",
                    hint="Set kvstore.update_on_kvstore: false (with dist_sync rather than "
                    f"dist_async), or remove {'.'.join(path)}.",
                )
        self._check_sparse_embedding(config)
        for i, name in enumerate(config.fit.eval_metrics or ()):
            problem = decoding_model_problem(name, config.model.name)
            if problem is not None:
                self.fail(
                    ("fit", "eval_metrics", i), f"fit.eval_metrics[{i}] {problem}", SEQ2SEQ_HINT
                )
        sched = config.optimizer.lr_scheduler
        if sched is not None and sched.type == "plateau" and sched.metric is not None:
            self._needs_eval_data(config, ("optimizer", "lr_scheduler", "type"))
            path = ("optimizer", "lr_scheduler", "metric")
            self._is_a_fit_metric(config, path, sched.metric)
        early = config.fit.early_stopping
        if early is not None:
            self._needs_eval_data(config, ("fit", "early_stopping"))
            self._is_a_fit_metric(config, ("fit", "early_stopping", "metric"), early.metric)
        if config.fit.eval_interval is not None:
            self._needs_eval_data(config, ("fit", "eval_interval"))
        best = config.checkpoint.best_metric
        if best is not None:
            self._needs_eval_data(config, ("checkpoint", "best_metric"))
            self._is_a_fit_metric(config, ("checkpoint", "best_metric"), best)

    def _needs_eval_data(self, config: Config, path: KeyPath) -> None:
        """``path`` is set, which only means something when there is a data.eval section."""
        if config.data.eval is None:
            key = ".".join(map(str, path))
            self.fail(
                path,
                f"{key} needs evaluation data, but data.eval is not set",
                hint=f"Add a data.eval section, or remove {key}.",
            )

    def _is_a_fit_metric(self, config: Config, path: KeyPath, metric: str) -> None:
        """The metric named at ``path`` must be one that the evaluations compute."""
        names = evaluation_metric_names(config.data, config.fit)
        if metric not in names and config.data.eval_sets:
            first = config.data.eval_set_names[0]
            self.fail(
                path,
                f"{'.'.join(map(str, path))} {metric!r} is not one of the evaluations' metrics "
                f"({', '.join(names)}): with several eval sets each metric is named by its set",
                hint=f"Name the set, e.g. {first}.{metric.rpartition('.')[2]}.",
            )
        if metric not in names:
            key = "fit.metrics" if config.fit.eval_metrics is None else "fit.eval_metrics"
            self.fail(
                path,
                f"{'.'.join(map(str, path))} {metric!r} is not one of {key} "
                f"({', '.join(names) or 'none'}): it watches the evaluations",
                hint=DECODING_METRIC_HINT
                if is_decoding_metric(metric)
                else f"Pick one of {key}, or add it there.",
            )


#: an eval set's name (data.eval as a mapping of sets): it prefixes the set's metric names
_SET_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _names_eval_sets(raw: Any) -> bool:
    """Whether a ``data.eval`` value is a mapping of named sets (every value a mapping) rather
    than one iterator section."""
    return isinstance(raw, dict) and bool(raw) and all(isinstance(v, dict) for v in raw.values())


def _inherit_train_reading(
    train: IteratorSection, evaluate: IteratorSection, eval_keys: Mapping[str, Any]
) -> IteratorSection:
    """``evaluate`` with the train iterator's value of each key that says how text is read
    (its options' ``must_match_train``) and that the eval section does not set itself."""
    if evaluate.name != train.name or not dataclasses.is_dataclass(evaluate.options):
        return evaluate
    keys = getattr(type(train.options), "must_match_train", ())
    inherited = {key: getattr(train.options, key) for key in keys if key not in eval_keys}
    if not inherited:
        return evaluate
    options = dataclasses.replace(evaluate.options, **inherited)
    return dataclasses.replace(evaluate, options=options)


def _dc_field(cls: type, name: str) -> dataclasses.Field[Any]:
    for f in dataclasses.fields(cls):
        if f.name == name:
            return f
    raise KeyError(name)


def _param_field_specs(params: Mapping[str, ParamSpec]) -> list[_FieldSpec]:
    return [_FieldSpec(k, p.type, p.default, p.doc) for k, p in params.items()]


# --------------------------------------------------------------------------------------------
# Public API: load
# --------------------------------------------------------------------------------------------


def _default_name(source: str) -> str:
    if source.startswith("<"):
        return "experiment"
    stem = Path(source).stem
    return stem or "experiment"


def parse_config(
    text: str,
    *,
    source: str,
    base_dir: Path,
    overrides: Sequence[str] = (),
    registries: Registries | None = None,
    path: Path | None = None,
) -> Config:
    """Parse YAML ``text`` (named ``source`` in messages; read from the file ``path``, when
    given, whose folder its ``include`` paths are relative to) and apply ``--set``
    ``overrides``.

    Relative paths in the config are resolved against ``base_dir``. Raises ``ConfigError``.
    """
    locs = Locations(source)
    folder = path.absolute().parent if path is not None else Path(base_dir)
    tree = read_tree(text, source, locs, folder, path)
    for text_ in overrides:
        _apply_override(tree, text_, locs)
    builder = _Builder(locs, Path(base_dir), registries or Registries(), _default_name(source))
    return builder.config(tree, source)


def load_config(
    path: str | Path,
    overrides: Sequence[str] = (),
    *,
    base_dir: Path | None = None,
    registries: Registries | None = None,
) -> Config:
    """Read the experiment file ``path``, apply ``overrides`` (``"a.b=value"``), check it all.

    ``base_dir`` defaults to the file's folder; pass the original one when loading a copy of
    a config (a run folder's ``config.yaml``) whose relative paths point elsewhere.
    """
    path = Path(path)
    text = read_config_text(path)
    folder = base_dir if base_dir is not None else path.absolute().parent
    return parse_config(
        text,
        source=str(path),
        base_dir=folder,
        overrides=overrides,
        registries=registries,
        path=path,
    )


# --------------------------------------------------------------------------------------------
# Public API: dump and explain
# --------------------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """YAML-able plain values: lists, dicts, str/int/float/bool/None."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Path):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
    return value


def _rows(config: Config) -> Iterator[tuple[tuple[str, ...], Any, Any, str]]:
    """(key path, value, default, doc) of every resolved leaf key, in schema order."""

    def section(obj: Any, path: tuple[str, ...], skip: Sequence[str] = ()) -> Iterator[Any]:
        for spec in _field_specs(type(obj), _dotted(path)):
            if spec.name in skip:
                continue
            yield (*path, spec.name), getattr(obj, spec.name), spec.default, spec.doc

    def component(comp: ComponentSection, path: tuple[str, ...]) -> Iterator[Any]:
        f = _dc_field(type(comp), "name")
        yield (*path, comp.selector), comp.name, _field_default(f), f.metadata.get("doc", "")
        if dataclasses.is_dataclass(comp.options):
            yield from section(comp.options, path)
        else:
            plain = comp.options if isinstance(comp.options, Mapping) else {}
            for key, value in plain.items():
                doc = f"option of {comp.name} (no options dataclass: passed as given)"
                yield (*path, key), value, None, doc

    for name in SECTIONS:
        obj = getattr(config, name)
        path = (name,)
        if name == "experiment":
            for key, value, default, doc in section(obj, path):
                if key[-1] == "name":
                    default = _default_name(config.source)
                yield key, value, default, doc
        elif name == "model":
            yield from component(obj, path)
        elif name == "data":
            yield from component(obj.train, ("data", "train"))
            for set_name, evaluated in obj.eval_sets:
                yield from component(evaluated, ("data", "eval", set_name))
            if obj.eval_sets:
                pass  # the first set is data.eval too: listed once, by its name
            elif obj.eval is None:
                yield ("data", "eval"), None, None, _dc_field(DataSection, "eval").metadata["doc"]
            else:
                yield from component(obj.eval, ("data", "eval"))
        elif name == "optimizer":
            spec = OPTIMIZERS[obj.name]
            for key, value, default, doc in section(obj, path, skip=("params", "lr_scheduler")):
                if key[-1] == "learning_rate":
                    default = spec.learning_rate
                yield key, value, default, doc
            sched = obj.lr_scheduler
            if sched is None:
                f = _dc_field(OptimizerSection, "lr_scheduler")
                yield (*path, "lr_scheduler"), None, None, f.metadata["doc"]
            else:
                keys = sched.applicable_keys()
                for row in section(sched, (*path, "lr_scheduler")):
                    if row[0][-1] in keys:
                        yield row
            for key, value in obj.params.items():
                yield (*path, key), value, spec.params[key].default, spec.params[key].doc
        elif name == "initializer":
            ispec = INITIALIZERS[obj.name]
            yield from section(obj, path, skip=("params", "overrides", "warm_start"))
            for key, value in obj.params.items():
                yield (*path, key), value, ispec.params[key].default, ispec.params[key].doc
            doc = _dc_field(InitializerSection, "overrides").metadata["doc"]
            listed = [
                {"pattern": o.pattern, "name": o.name, **dict(o.params)} for o in obj.overrides
            ]
            yield (*path, "overrides"), listed, [], doc
            if obj.warm_start is None:
                doc = _dc_field(InitializerSection, "warm_start").metadata["doc"]
                yield (*path, "from"), None, None, doc
            else:
                yield from section(obj.warm_start, (*path, "from"))
        elif name == "fit":
            for row in section(obj, path):
                if row[0][-1] == "callbacks":  # flattened as written: {name, ...options}
                    listed = [{"name": c.name, **(_plain(c.options) or {})} for c in obj.callbacks]
                    row = (row[0], listed, [], row[3])
                yield row
        else:
            yield from section(obj, path)


def config_to_dict(config: Config) -> dict[str, Any]:
    """The resolved config as plain, YAML-able values, every default included.

    Component sections are flattened back (``model: {name: lstm_lm, num_hidden: 200, ...}``)
    and optimizer/initializer parameters sit beside ``name``, as in the file.
    """
    out: dict[str, Any] = {}
    for path, value, _default, _doc in _rows(config):
        target = out
        for part in path[:-1]:
            target = target.setdefault(part, {})
        target[path[-1]] = _plain(value)
    return out


def _escape_references(value: Any) -> Any:
    """``value`` with each ``${`` in its strings written ``$${``, so that reading the dump
    back gives the text, not an environment lookup."""
    if isinstance(value, str):
        return value.replace("${", "$${")
    if isinstance(value, list):
        return [_escape_references(v) for v in value]
    if isinstance(value, dict):
        return {k: _escape_references(v) for k, v in value.items()}
    return value


def dump_config(config: Config) -> str:
    """YAML text of the resolved config; ``load_config`` of it gives an equal Config."""
    source = config.source.replace("\n", " ")
    header = (
        f"# Resolved experiment config written by mxtrain {mxtrain.__version__}: every key,\n"
        f"# defaults included. Loaded from {source}.\n"
    )
    body = yaml.dump(
        _escape_references(config_to_dict(config)),
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        width=100,
    )
    return header + body


def value_origins(config: Config) -> dict[str, str]:
    """Where each resolved key's value came from, by dotted key: ``file:line`` (an included
    file's for an included value), ``--set KEY=VALUE``, or ``default``."""
    origin = config.origin or (lambda _path: None)
    return {_dotted(path): origin(path) or "default" for path, *_ in _rows(config)}


def explain_config(config: Config) -> list[ExplainRow]:
    """``(dotted key, value, default, doc)`` for every resolved key, for ``check --explain``.

    Values and defaults are plain (lists, not tuples); a field without a default has
    ``REQUIRED`` as its default.
    """
    return [
        (_dotted(path), _plain(value), _plain(default), doc)
        for path, value, default, doc in _rows(config)
    ]
