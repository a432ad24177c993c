"""Experiment configuration: the YAML schema, its loader and its dumper.

Nothing in this package imports MXNet or click, so ``mxtrain check`` and ``--help`` stay fast.
It is the only part of mxtrain that reads or writes YAML.
"""

from mxtrain.config.loader import (
    ExplainRow,
    Registries,
    config_to_dict,
    dump_config,
    explain_config,
    load_config,
    parse_config,
)
from mxtrain.config.schema import (
    INITIALIZERS,
    OPTIMIZERS,
    REQUIRED,
    CheckpointSection,
    ComponentSection,
    Config,
    ContextSection,
    DataSection,
    ExperimentSection,
    FitSection,
    InitializerSection,
    InitializerSpec,
    InvalidValue,
    IteratorSection,
    KVStoreSection,
    LrSchedulerSection,
    ModelSection,
    OptimizerSection,
    OptimizerSpec,
    ParamSpec,
)

__all__ = [
    "INITIALIZERS",
    "OPTIMIZERS",
    "REQUIRED",
    "CheckpointSection",
    "ComponentSection",
    "Config",
    "ContextSection",
    "DataSection",
    "ExperimentSection",
    "ExplainRow",
    "FitSection",
    "InitializerSection",
    "InitializerSpec",
    "InvalidValue",
    "IteratorSection",
    "KVStoreSection",
    "LrSchedulerSection",
    "ModelSection",
    "OptimizerSection",
    "OptimizerSpec",
    "ParamSpec",
    "Registries",
    "config_to_dict",
    "dump_config",
    "explain_config",
    "load_config",
    "parse_config",
]
