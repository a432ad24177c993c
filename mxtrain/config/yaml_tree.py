"""YAML text -> plain values with the ``file:line`` of every key (composed, never loaded).

What the config loader and the run-folder readers share: YAML 1.2 core-schema scalars, size
limits checked while composing, :class:`Locations` and :class:`TreeBuilder`, and
``${env:NAME}`` references in string values (:func:`substitute_env`).
"""

from __future__ import annotations

import math
import os
import re
import typing
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from mxtrain.errors import ConfigError

KeyPath = tuple[str | int, ...]

# --------------------------------------------------------------------------------------------
# YAML 1.2 core-schema resolution for both reading and writing
# --------------------------------------------------------------------------------------------

_NULL = "tag:yaml.org,2002:null"
_BOOL = "tag:yaml.org,2002:bool"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_STR = "tag:yaml.org,2002:str"
_SEQ = "tag:yaml.org,2002:seq"
_MAP = "tag:yaml.org,2002:map"
_MERGE = "tag:yaml.org,2002:merge"

_RESOLVERS: tuple[tuple[str, re.Pattern[str], str], ...] = (
    (_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), "tTfF"),
    (_NULL, re.compile(r"^(?:~|null|Null|NULL|)$"), "~nN"),
    (_INT, re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"), "-+0123456789"),
    (
        _FLOAT,
        re.compile(
            r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
            r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
        ),
        "-+.0123456789",
    ),
    (_MERGE, re.compile(r"^<<$"), "<"),
)


def _install_resolvers(cls: Any) -> None:
    cls.yaml_implicit_resolvers = {}
    for tag, regexp, first in _RESOLVERS:
        cls.add_implicit_resolver(tag, regexp, list(first))
    cls.add_implicit_resolver(_NULL, _RESOLVERS[1][1], [""])


#: Largest config file read, in bytes. Shipped configs are a few kilobytes; the limit keeps
#: reading and parsing any file well under a second.
MAX_CONFIG_BYTES = 256 * 1024
#: Most values (keys, list items, scalars) one document may hold, every alias expansion
#: counted, so an alias bomb ("billion laughs") is refused before it is expanded. Configs hold
#: a few hundred; composing 5,000 takes well under a second even on a slow, busy CPU.
MAX_CONFIG_VALUES = 5_000
#: Deepest nesting of lists and mappings; configs need four or five levels.
MAX_CONFIG_DEPTH = 32
#: Most keys in one mapping (the schema's largest section has a few dozen).
MAX_MAPPING_KEYS = 1_000


class _LimitExceeded(Exception):
    """A size limit hit while composing; becomes a ConfigError with its position."""

    def __init__(self, message: str, hint: str, mark: Any) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.mark = mark


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core-schema scalars; we only ever compose with it.

    Composing counts every value (an alias counts as the whole subtree it stands for) and
    the nesting depth, and stops at :data:`MAX_CONFIG_VALUES` / :data:`MAX_CONFIG_DEPTH`
    before the composer recurses or expands further.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.values_seen = 0
        self.depth = 0
        self.anchor_sizes: dict[str, int] = {}

    def _count(self, values: int, mark: Any) -> None:
        self.values_seen += values
        if self.values_seen > MAX_CONFIG_VALUES:
            raise _LimitExceeded(
                f"the document holds more than {MAX_CONFIG_VALUES:,} values "
                "(aliases counted as what they expand to)",
                "Configs need a few hundred values at most; remove the bulk, or the aliases "
                "that repeat large anchors (the limit is mxtrain.config.MAX_CONFIG_VALUES).",
                mark,
            )

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            self._count(self.anchor_sizes.get(str(event.anchor), 1), event.start_mark)
            return typing.cast(Node, super().compose_node(parent, index))
        self._count(1, event.start_mark)
        self.depth += 1
        if self.depth > MAX_CONFIG_DEPTH:
            raise _LimitExceeded(
                f"lists or mappings are nested more than {MAX_CONFIG_DEPTH} levels deep",
                "Configs need a few levels; flatten the value (the limit is "
                "mxtrain.config.MAX_CONFIG_DEPTH).",
                event.start_mark,
            )
        before = self.values_seen
        try:
            node = super().compose_node(parent, index)
        finally:
            self.depth -= 1
        if event.anchor is not None:
            self.anchor_sizes[str(event.anchor)] = self.values_seen - before + 1
        return typing.cast(Node, node)


def _dotted(path: KeyPath) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return "mapping"
    if isinstance(value, (list, tuple)):
        return "list"
    return type(value).__name__


def _show(value: Any) -> str:
    """A value as the user wrote it, with its type: ``'abc' (str)``, ``true (bool)``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, Mapping):
        text = "{" + ", ".join(f"{k}: {_show_plain(v)}" for k, v in value.items()) + "}"
    else:
        text = _show_plain(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{text} ({_type_name(value)})"


def _show_plain(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_show_plain(v) for v in value) + "]"
    return repr(value)


# --------------------------------------------------------------------------------------------
# Locations: dotted key -> "file:line" or "--set key=value"
# --------------------------------------------------------------------------------------------


class Locations:
    """Where each key of a config file is (``file:line``), for error messages."""

    def __init__(self, default: str) -> None:
        self.default = default
        self._where: dict[KeyPath, str] = {}
        # the paths one level below each path that lead to a location: forgetting a subtree
        # then visits that subtree only, so N ``--set`` overrides cost O(N), not O(N²)
        self._below: dict[KeyPath, set[KeyPath]] = {}

    def set(self, path: KeyPath, where: str) -> None:
        self._where[path] = where
        for depth in range(len(path), 0, -1):
            below = self._below.setdefault(path[: depth - 1], set())
            if path[:depth] in below:  # its ancestors are linked already
                break
            below.add(path[:depth])

    def drop_under(self, path: KeyPath) -> None:
        """Forget the location of ``path`` and of every key below it."""
        pending = [path]
        while pending:
            key = pending.pop()
            self._where.pop(key, None)
            pending.extend(self._below.pop(key, ()))
        if path:
            self._below.get(path[:-1], set()).discard(path)

    def copy_under(self, other: Locations, path: KeyPath) -> None:
        """Take ``other``'s locations of ``path`` and of every key below it."""
        pending = [path]
        while pending:
            key = pending.pop()
            found = other._where.get(key)
            if found is not None:
                self.set(key, found)
            pending.extend(other._below.get(key, ()))

    def exact(self, path: KeyPath) -> str | None:
        """Where ``path`` itself was written, or None (a default, or only its section was)."""
        return self._where.get(path)

    def where(self, path: KeyPath) -> str:
        for i in range(len(path), -1, -1):
            found = self._where.get(path[:i])
            if found is not None:
                return found
        return self.default

    def known(self, path: KeyPath) -> bool:
        return path in self._where


# --------------------------------------------------------------------------------------------
# Reading YAML text into plain values + locations
# --------------------------------------------------------------------------------------------


#: a reference in a string value (group 1: what is inside the braces), or an escaped ``$${``
_REFERENCES = re.compile(r"\$\$\{|\$\{[^}]*\}")
#: ``${env:NAME}`` or ``${env:NAME,default}`` (the default runs to the closing brace)
_ENV_REFERENCE = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)(?:,([^}]*))?\}")


def _retagged(node: Node, value: str) -> ScalarNode | None:
    """A plain scalar node holding ``value``, tagged as YAML 1.2 would tag it if written
    there, or None when that is a string."""
    tag = next((t for t, regexp, _ in _RESOLVERS if t != _MERGE and regexp.match(value)), _STR)
    return None if tag == _STR else ScalarNode(tag, value, node.start_mark, node.end_mark)


class TreeBuilder:
    """Plain Python values from composed nodes, recording each key's line."""

    def __init__(
        self,
        label: str,
        locs: Locations,
        line_prefix: Callable[[int], str],
        environ: Mapping[str, str] | None = None,
    ) -> None:
        """``environ``: what ``${env:NAME}`` reads (default: the process environment)."""
        self.label = label
        self.environ = os.environ if environ is None else environ
        self.locs = locs
        self.line_prefix = line_prefix
        self.budget = MAX_CONFIG_VALUES
        self.active: set[int] = set()

    def fail(self, node: Node, message: str, hint: str | None = None) -> NoReturn:
        raise ConfigError(f"{self.line_prefix(node.start_mark.line + 1)}: {message}", hint=hint)

    def build(self, node: Node, path: KeyPath) -> Any:
        self.budget -= 1
        if self.budget < 0:
            self.fail(
                node,
                f"the document expands to more than {MAX_CONFIG_VALUES:,} values (alias bomb?).",
            )
        if len(path) > MAX_CONFIG_DEPTH:
            self.fail(
                node,
                f"{_dotted(path[:3])}...: values are nested more than {MAX_CONFIG_DEPTH} levels "
                "deep (aliases included).",
                hint="Flatten the value (the limit is mxtrain.config.MAX_CONFIG_DEPTH).",
            )
        if id(node) in self.active:
            self.fail(node, f"{_dotted(path) or 'the document'} refers to itself via an alias.")
        self.active.add(id(node))
        try:
            if isinstance(node, MappingNode):
                return self._mapping(node, path)
            if isinstance(node, SequenceNode):
                if node.tag != _SEQ:
                    self.fail(node, f"unsupported YAML tag {node.tag!r} at {_dotted(path)}.")
                items = []
                for i, item in enumerate(node.value):
                    self.locs.set((*path, i), self.line_prefix(item.start_mark.line + 1))
                    items.append(self.build(item, (*path, i)))
                return items
            return self._scalar(node, path)
        finally:
            self.active.discard(id(node))

    def _scalar(self, node: Node, path: KeyPath) -> Any:
        tag, text = node.tag, node.value
        what = _dotted(path) or "the value"
        try:
            if tag == _NULL:
                return None
            if tag == _STR:
                self._check_text(node, text, what)
                if "${" not in text:
                    return text
                value = self._substitute(node, text, what)
                if getattr(node, "style", None) is None and _ENV_REFERENCE.fullmatch(text):
                    # a plain scalar that is one reference reads as if the value were written
                    # there: ${env:LR,0.001} is a number, ${env:DEBUG,false} a boolean
                    typed = _retagged(node, value)
                    if typed is not None:
                        return self._scalar(typed, path)
                return value
            if tag == _BOOL:
                if text.lower() not in ("true", "false"):
                    raise ValueError
                return text.lower() == "true"
            if tag == _INT:
                if text.startswith(("0o", "0x")):
                    return int(text, 0)
                return int(text, 10)
            if tag == _FLOAT:
                low = text.lower().lstrip("+")
                if low in (".inf", "-.inf", ".nan"):
                    return {".inf": math.inf, "-.inf": -math.inf, ".nan": math.nan}[low]
                return float(text)
        except ValueError:
            self.fail(node, f"{what}: {text!r} is not a valid {tag.rsplit(':', 1)[-1]}.")
        self.fail(
            node,
            f"unsupported YAML tag {tag!r} at {what}.",
            hint="Only plain strings, numbers, true/false, null, lists and mappings are allowed.",
        )

    def _substitute(self, node: Node, text: str, what: str) -> str:
        """``text`` with each ``${env:NAME}`` / ``${env:NAME,default}`` replaced (``$${`` is
        a literal ``${``); an unset variable without a default or any other ``${...}`` fails
        at the value's line."""

        def replace(match: re.Match[str]) -> str:
            if match.group(0) == "$${":
                return "${"
            reference = match.group(0)
            env = _ENV_REFERENCE.fullmatch(reference)
            if env is None:
                self.fail(
                    node,
                    f"{what}: {reference!r} is not a reference mxtrain knows; values may refer "
                    "to environment variables only, as ${env:NAME} or ${env:NAME,default}.",
                    hint="Write $${ for a literal ${.",
                )
            name, default = env.group(1), env.group(2)
            found = self.environ.get(name)
            if found is not None:
                return found
            if default is None:
                self.fail(
                    node,
                    f"{what}: the environment variable {name} is not set (the value refers to "
                    f"it as {reference}).",
                    hint=f"Export {name}, or give a default: ${{env:{name},DEFAULT}}.",
                )
            return default

        return _REFERENCES.sub(replace, text)

    def _check_text(self, node: Node, text: str, what: str) -> None:
        """Refuse NUL and lone surrogates (from YAML escapes): no file name, name or option
        can hold them, and they used to fail deep inside fit instead of here."""
        bad = next((c for c in text if c == "\0" or 0xD800 <= ord(c) <= 0xDFFF), None)
        if bad is not None:
            self.fail(
                node,
                f"{what}: {text[:40]!r} holds {bad!r}, which is not valid text "
                "(a NUL or a lone surrogate).",
                hint="Remove that escape from the value.",
            )

    def _mapping(self, node: MappingNode, path: KeyPath) -> dict[str, Any]:
        if node.tag != _MAP:
            self.fail(node, f"unsupported YAML tag {node.tag!r} at {_dotted(path)}.")
        if len(node.value) > MAX_MAPPING_KEYS:
            self.fail(
                node,
                f"{_dotted(path) or 'the top level'} has {len(node.value):,} keys, more than "
                f"the {MAX_MAPPING_KEYS:,} one mapping may hold.",
                hint="Remove the extra keys (the limit is mxtrain.config.MAX_MAPPING_KEYS).",
            )
        seen: dict[str, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE:
                continue
            key = self._key(key_node, path)
            line = key_node.start_mark.line + 1
            if key in seen:
                self.fail(
                    key_node,
                    f"duplicate key {_dotted((*path, key))!r} (first set at line {seen[key]}).",
                    hint="YAML would silently keep the last one; remove one of them.",
                )
            seen[key] = line
        if any(k.tag == _MERGE for k, _ in node.value):
            try:
                yaml.constructor.SafeConstructor().flatten_mapping(node)
            except yaml.MarkedYAMLError as exc:
                self.fail(node, f"bad '<<' merge in {_dotted(path) or 'the document'}: {exc}")
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = self._key(key_node, path)
            sub = (*path, key)
            if key in result:  # merged keys come first; the mapping's own keys win
                del result[key]
                self.locs.drop_under(sub)  # only then: scanning every location per key is O(n²)
            self.locs.set(sub, self.line_prefix(key_node.start_mark.line + 1))
            result[key] = self.build(value_node, sub)
        return result

    def _key(self, key_node: Node, path: KeyPath) -> str:
        if not isinstance(key_node, ScalarNode) or key_node.tag != _STR:
            value = self._scalar(key_node, path) if isinstance(key_node, ScalarNode) else None
            shown = _show(value) if isinstance(key_node, ScalarNode) else "a collection"
            self.fail(
                key_node,
                f"keys must be strings, got {shown} in {_dotted(path) or 'the top level'}.",
                hint="Put the key in quotes if you meant the text.",
            )
        self._check_text(key_node, str(key_node.value), f"a key in {_dotted(path) or 'the top'}")
        return str(key_node.value)


def _position(text: str, index: int, label: str, is_file: bool) -> str:
    """``file:line:column`` (or ``--set ...: column N``) of character ``index`` of ``text``."""
    line = text.count("\n", 0, index) + 1
    column = index - (text.rfind("\n", 0, index) + 1) + 1
    return f"{label}:{line}:{column}" if is_file else f"{label}: column {column}"


def compose_yaml(text: str, label: str, *, is_file: bool = True) -> Node | None:
    """The YAML node tree of ``text`` (safe loading), every problem a ConfigError naming
    ``label``; None for an empty document."""
    loader: _Loader | None = None
    try:
        loader = _Loader(text)  # this already checks every character (ReaderError)
        return loader.get_single_node()
    except yaml.reader.ReaderError as exc:
        code = exc.character if isinstance(exc.character, int) else ord(str(exc.character))
        utf16 = " It looks like UTF-16 text; save it as UTF-8." if code == 0 else ""
        raise ConfigError(
            f"{_position(text, exc.position, label, is_file)}: the character U+{code:04X} is "
            "not allowed in a config (control characters, NUL and lone surrogates are refused).",
            hint='Remove it or write it as an escape inside double quotes ("\\x01").' + utf16,
        ) from None
    except _LimitExceeded as exc:
        where = _position(text, exc.mark.index, label, is_file)
        raise ConfigError(f"{where}: {exc.message}.", hint=exc.hint) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        if mark is None:
            where = label
        elif is_file:
            where = f"{label}:{mark.line + 1}:{mark.column + 1}"
        else:
            where = f"{label}: column {mark.column + 1}"
        problem = exc.problem or "invalid YAML"
        context = ""
        if exc.context and exc.context_mark and exc.context_mark is not mark:
            context = f" ({exc.context} at line {exc.context_mark.line + 1})"
        elif exc.context:
            context = f" ({exc.context})"
        raise ConfigError(
            f"{where}: invalid YAML: {problem}{context}.",
            hint="Check the indentation, colons and quotes around that position.",
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{label}: invalid YAML: {exc}") from None
    finally:
        if loader is not None:
            loader.dispose()


_install_resolvers(_Loader)
