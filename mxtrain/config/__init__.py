"""Experiment configuration: the YAML schema, its loader and its dumper.

Nothing in this package imports MXNet or click, so ``mxtrain check`` and ``--help`` stay fast.
It is the only part of mxtrain that reads or writes YAML. The package exports what reads and
writes configs; the section classes live in :mod:`mxtrain.config.schema`.
"""

from mxtrain.config.loader import (
    ExplainRow,
    Registries,
    config_to_dict,
    dump_config,
    explain_config,
    load_config,
    parse_config,
    value_origins,
)
from mxtrain.config.schema import Config
from mxtrain.config.yaml_tree import (
    MAX_CONFIG_BYTES,
    MAX_CONFIG_DEPTH,
    MAX_CONFIG_VALUES,
    MAX_MAPPING_KEYS,
)

__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_CONFIG_DEPTH",
    "MAX_CONFIG_VALUES",
    "MAX_MAPPING_KEYS",
    "Config",
    "ExplainRow",
    "Registries",
    "config_to_dict",
    "dump_config",
    "explain_config",
    "load_config",
    "parse_config",
    "value_origins",
]
