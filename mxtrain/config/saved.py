"""Reading a config as plain data, without checking it against the schema.

``mxtrain show``/``runs``/``diff`` look at a run's saved ``config.yaml`` months later: the
run must stay readable even when a plugin has moved or the schema has since changed, so
these readers keep YAML's structure and skip validation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mxtrain.config.yaml_tree import Locations, TreeBuilder, compose_yaml
from mxtrain.errors import ConfigError
from mxtrain.user_files import read_file


def read_config_tree(path: str | Path) -> dict[str, Any]:
    """The YAML mapping in ``path`` as plain dicts/lists/scalars (safe loading, not validated).

    Raises ``ConfigError`` naming the file (and line) when it is missing, unreadable, not
    YAML or not a mapping.
    """
    source = str(path)
    data = read_file(Path(path), "config file", error=ConfigError)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"cannot read config file {source}: {exc}.") from None
    node = compose_yaml(text, source)
    if node is None:
        return {}
    tree = TreeBuilder(source, Locations(source), lambda line: f"{source}:{line}").build(node, ())
    if not isinstance(tree, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of sections.")
    return tree
