"""``include:``: experiment files built on shared bases.

A config's top-level ``include`` (a path or a list of paths, each relative to the file that
names it) lists files whose mappings are merged in order, then the including file's own keys
over them: mappings merge key by key at every depth, while lists, scalars and null replace
what came before. Included files may include others; a file that includes itself, directly or
through others, is refused, as are more than :data:`MAX_INCLUDED_FILES` files in all.

Every key keeps the ``file:line`` of the file that last set it, so an error in an included
value names the included file. Paths in the config's values (data files, run folders) are not
affected: they stay relative to the config being run, whichever file wrote them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from yaml.nodes import ScalarNode

from mxtrain.config.yaml_tree import (
    _NULL,
    MAX_CONFIG_BYTES,
    KeyPath,
    Locations,
    TreeBuilder,
    _show,
    compose_yaml,
)
from mxtrain.errors import ConfigError
from mxtrain.user_files import read_file

#: Most files one config may include, all levels counted (a base of a base counts too).
MAX_INCLUDED_FILES = 64
#: the top-level key that names the included files
INCLUDE_KEY = "include"
SECTIONS_HINT = "See configs/ for complete examples."


def read_config_text(path: Path, what: str = "config file") -> str:
    """The UTF-8 text of a config file, every problem a ConfigError naming it."""
    source = str(path)
    data = read_file(
        path,
        what,
        error=ConfigError,
        missing_hint="Check the path; it is relative to the current directory.",
        limit=MAX_CONFIG_BYTES,
    )
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"{source} is larger than {MAX_CONFIG_BYTES // 1024} KiB, too large for a config file.",
            hint="Point at the experiment's YAML file; data belongs in files the config names "
            "(the limit is mxtrain.config.MAX_CONFIG_BYTES).",
        )
    return decode_config(data, source)


def decode_config(data: bytes, source: str) -> str:
    """The UTF-8 text of a config file, or a ConfigError naming the line of the bad byte."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise ConfigError(
            f"{source} is UTF-16 text (it starts with a UTF-16 byte order mark); configs are "
            "UTF-8.",
            hint="Save the file as UTF-8, for example with `iconv -f UTF-16 -t UTF-8`.",
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            f"{source} is not UTF-8 text: line {line}, byte {exc.start} "
            f"(0x{data[exc.start]:02x}: {exc.reason}).",
            hint="Save the file as UTF-8.",
        ) from None


def read_tree(
    text: str, source: str, locs: Locations, folder: Path, path: Path | None = None
) -> dict[str, Any]:
    """The config in ``text`` (named ``source``; read from ``path`` when it is a file) as
    plain values with its includes merged, every key's ``file:line`` recorded in ``locs``;
    ``folder``: what its includes are relative to."""
    chain = (path.resolve(),) if path is not None else ()
    return _Reader().tree(text, source, locs, folder, chain, top=True)


class _Reader:
    def __init__(self) -> None:
        self.files = 0

    def tree(
        self,
        text: str,
        source: str,
        locs: Locations,
        folder: Path,
        chain: tuple[Path, ...],
        top: bool = False,
    ) -> dict[str, Any]:
        node = compose_yaml(text, source)
        if node is None or (isinstance(node, ScalarNode) and node.tag == _NULL):
            if not top:
                return {}  # an empty base adds nothing
            raise ConfigError(
                f"{source} is empty; an experiment needs at least a data.train section.",
                hint=SECTIONS_HINT,
            )
        own_locs = Locations(source)
        own = TreeBuilder(source, own_locs, lambda line: f"{source}:{line}").build(node, ())
        if not isinstance(own, dict):
            raise ConfigError(
                f"{source}:{node.start_mark.line + 1}: the top level must be a mapping of "
                f"sections, got {_show(own)}.",
                hint=SECTIONS_HINT,
            )
        merged: dict[str, Any] = {}
        for entry, where in self._entries(own, own_locs):
            path = self._resolve(entry, where, folder, chain)
            base_locs = Locations(str(path))
            base = self.tree(
                read_config_text(path, "included config file"),
                str(path),
                base_locs,
                path.parent,
                (*chain, path),
            )
            merge(merged, locs, base, base_locs)
        merge(merged, locs, own, own_locs)
        return merged

    @staticmethod
    def _entries(own: dict[str, Any], own_locs: Locations) -> list[tuple[str, str]]:
        """(path as written, ``file:line``) of each include, ``include`` taken out of ``own``."""
        if INCLUDE_KEY not in own:
            return []
        value = own.pop(INCLUDE_KEY)
        where = own_locs.where((INCLUDE_KEY,))
        listed = value if isinstance(value, list) else [value]
        places = [own_locs.where((INCLUDE_KEY, i)) for i in range(len(listed))]
        own_locs.drop_under((INCLUDE_KEY,))
        entries = []
        for entry, at in zip(listed, places, strict=True):
            at = at if isinstance(value, list) else where
            if not isinstance(entry, str) or not entry.strip():
                raise ConfigError(
                    f"{at}: include: expected a file path or a list of them, got {_show(entry)}.",
                    hint="For example include: base.yaml or include: [base.yaml, data.yaml].",
                )
            entries.append((entry, at))
        return entries

    def _resolve(self, entry: str, where: str, folder: Path, chain: tuple[Path, ...]) -> Path:
        path = (folder / entry).resolve()
        self.files += 1
        if self.files > MAX_INCLUDED_FILES:
            raise ConfigError(
                f"{where}: include {entry!r}: more than {MAX_INCLUDED_FILES} included files in "
                "all.",
                hint="Include fewer files (the limit is "
                "mxtrain.config.includes.MAX_INCLUDED_FILES).",
            )
        if path in chain:
            loop = " -> ".join(p.name for p in (*chain[chain.index(path) :], path))
            raise ConfigError(
                f"{where}: include {entry!r} includes a file that is already being read, so "
                f"the includes never end: {loop}.",
                hint="Remove the include that closes the loop.",
            )
        if not path.is_file():
            raise ConfigError(
                f"{where}: include {entry!r}: {path} is not a file.",
                hint=f"Include paths are relative to the file that names them ({folder}).",
            )
        return path


def merge(
    base: dict[str, Any], base_locs: Locations, over: dict[str, Any], over_locs: Locations
) -> None:
    """Merge ``over`` into ``base`` in place (mappings key by key, anything else replaced),
    with the locations of what ``over`` set copied into ``base_locs``."""
    _merge(base, base_locs, over, over_locs, ())


def _merge(
    base: dict[str, Any],
    base_locs: Locations,
    over: dict[str, Any],
    over_locs: Locations,
    path: KeyPath,
) -> None:
    for key, value in over.items():
        sub = (*path, key)
        old = base.get(key)
        if isinstance(value, dict) and isinstance(old, dict):
            base_locs.set(sub, over_locs.where(sub))
            _merge(old, base_locs, value, over_locs, sub)
        else:
            base[key] = value
            base_locs.drop_under(sub)
            base_locs.copy_under(over_locs, sub)
