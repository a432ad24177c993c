"""The plugin files a run was trained with, kept in its run folder, and what is not kept.

``fit`` copies every plugin referenced as ``path/to/file.py:attr`` (``model.name``, the
``gluon`` model's ``block``, ``data.*.iterator``, ``fit.metrics``) into ``RUN/plugins/``
beside ``config.yaml``, with ``RUN/plugins/plugins.json`` recording which reference (resolved
against the config's folder) each copy stands for. ``resume``, ``score`` and ``predict``
import the kept copies instead of the originals (:func:`uses_kept_plugins`), so the run keeps
working, with the code it was trained with, after the original file is edited, moved or
deleted, and a copied run folder works on its own. Plugins given as ``package.module:attr``
are installed code and are not copied, nor are the modules a plugin file imports.

Data files are not copied: relative data paths in ``config.yaml`` resolve against the
original config folder recorded in ``run.json`` (``config_dir``). When that folder is gone, a
missing data file is reported as such (:func:`explain_missing_config_dir`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from mxtrain.config.schema import Config
from mxtrain.errors import ConfigError, DataError, RunFolderError
from mxtrain.registry import GLUON_MODEL, plugin_file_path, redirected_plugin_files
from mxtrain.run.atomic import atomic_write_bytes, atomic_write_text
from mxtrain.run.folder import RunFolder
from mxtrain.run.layout import PLUGINS_DIR, PLUGINS_MANIFEST, RUN_FILE
from mxtrain.user_files import UnusableFile, read_regular

_Function = TypeVar("_Function", bound=Callable[..., Any])


def plugin_references(config: Config) -> list[str]:
    """The ``file.py`` parts of every file plugin the config uses, in config order."""
    names = [config.model.name, config.data.train.name]
    if config.model.name == GLUON_MODEL:  # the block it builds by name
        names.append(str(getattr(config.model.options, "block", "")))
    if config.data.eval is not None:
        names.append(config.data.eval.name)
    names.extend(section.name for _, section in config.data.eval_sets)
    names.extend(config.fit.metrics)
    names.extend(config.fit.eval_metrics or ())
    names.extend(callback.name for callback in config.fit.callbacks)
    files: list[str] = []
    for name in names:
        module_part = str(name).rpartition(":")[0]
        if module_part.endswith(".py") and module_part not in files:
            files.append(module_part)
    return files


def keep_plugin_files(config: Config, run_path: Path) -> list[Path]:
    """Copy the config's plugin files into ``run_path/plugins`` and write the manifest.

    Returns the kept copies. Two files of the same name from different folders are kept as
    ``name.py`` and ``name-2.py``.
    """
    references = plugin_references(config)
    if not references:
        return []
    folder = run_path / PLUGINS_DIR
    folder.mkdir(exist_ok=True)
    entries: list[dict[str, str]] = []
    kept: list[Path] = []
    for reference in references:
        original = plugin_file_path(reference, Path(config.base_dir))
        name = original.name
        counter = 1
        while any(entry["kept"] == name for entry in entries):
            counter += 1
            name = f"{original.stem}-{counter}{original.suffix}"
        copy = folder / name
        try:
            content = read_regular(original)
        except UnusableFile as exc:
            raise ConfigError(f"The plugin file {original} {exc.problem}.", hint=exc.hint) from None
        try:
            atomic_write_bytes(copy, content)
        except OSError as exc:
            raise RunFolderError(
                f"Keeping a copy of the plugin file {original} in {folder} failed: "
                f"{exc.strerror or exc}.",
                hint="Check the free space and permissions of the runs folder.",
            ) from None
        digest = hashlib.sha256(content).hexdigest()
        entries.append(
            {"reference": reference, "original": str(original), "kept": name, "sha256": digest}
        )
        kept.append(copy)
    # Written last: a crash before it leaves copies that nothing redirects to.
    atomic_write_text(folder / PLUGINS_MANIFEST, json.dumps({"files": entries}, indent=2) + "\n")
    return kept


def kept_plugin_redirects(run_path: Path, config_dir: Path) -> dict[str, Path]:
    """Original absolute plugin path -> kept copy, for a run folder read against ``config_dir``.

    Empty for runs without kept plugins (trained before they were kept); a damaged manifest
    or a missing copy is a RunFolderError.
    """
    manifest = run_path / PLUGINS_DIR / PLUGINS_MANIFEST
    if not manifest.exists():
        return {}
    try:
        entries = json.loads(read_regular(manifest))["files"]
        redirects = {}
        for entry in entries:
            copy = run_path / PLUGINS_DIR / str(entry["kept"])
            if copy.name != entry["kept"] or not copy.is_file():
                raise RunFolderError(
                    f"The run folder {run_path} lacks its kept plugin file {copy}.",
                    hint=f"Restore it, or delete {manifest} to load plugins from where the "
                    "config names them.",
                )
            original = plugin_file_path(str(entry["reference"]), config_dir)
            redirects[str(original)] = copy
    except UnusableFile as exc:
        raise RunFolderError(f"The plugin manifest {manifest} {exc.problem}.") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RunFolderError(
            f"The plugin manifest {manifest} is damaged ({exc}).",
            hint=f"Delete {manifest} to load plugins from where the config names them.",
        ) from None
    return redirects


def run_folder_of(ref: Any) -> Path | None:
    """The run folder named by ``RUN`` or ``RUN:SUFFIX`` (an epoch, a tag), if it exists."""
    text = os.fspath(ref)
    for candidate in (text, text.rpartition(":")[0]):
        try:
            if candidate and (Path(candidate) / RUN_FILE).is_file():
                return Path(candidate)
        except (OSError, ValueError):  # a name too long, ...: the command itself says so
            continue
    return None


@contextmanager
def kept_plugins(run_path: Path | None) -> Iterator[None]:
    """Import the run's kept plugin files, and explain missing data of a vanished config folder."""
    if run_path is None:
        yield
        return
    config_dir = RunFolder(run_path).config_dir()
    with redirected_plugin_files(kept_plugin_redirects(run_path, config_dir)):
        try:
            yield
        except DataError as exc:
            explained = explain_missing_config_dir(exc, config_dir)
            if explained is exc:
                raise
            raise explained from None


def explain_missing_config_dir(exc: DataError, config_dir: Path) -> DataError:
    """``exc`` with a note when the run's recorded config folder no longer exists."""
    note = f"The run's config folder {config_dir} (recorded in run.json"
    if config_dir.is_dir() or "does not exist" not in exc.message or note in exc.message:
        return exc  # nothing to add, or added already (score -> open_run nest)
    return DataError(
        f"{exc.message} {note} as config_dir; relative data paths in config.yaml resolve "
        "against it) no longer exists: the run folder was copied or moved, and data files "
        "are not kept in it.",
        hint=f"Recreate {config_dir} with the data (or a link to it); score and predict can "
        "also be given the data explicitly (--data FILE, --input FILE).",
    )


def uses_kept_plugins(function: _Function) -> _Function:
    """Run ``function(ref, ...)`` within :func:`kept_plugins` of the run folder ``ref`` names."""

    @functools.wraps(function)
    def wrapper(ref: Any, *args: Any, **kwargs: Any) -> Any:
        with kept_plugins(run_folder_of(ref)):
            return function(ref, *args, **kwargs)

    return wrapper  # type: ignore[return-value]
