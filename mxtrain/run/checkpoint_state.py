"""What a module hands the checkpoint writer (mxtrain.run.checkpoint): arrays on
the CPU and JSON-able data, nothing that knows about files. Importing this costs no MXNet."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["CheckpointSource", "ModuleCheckpoint"]


@dataclass(frozen=True)
class ModuleCheckpoint:
    """Where a module stands: everything a checkpoint must hold to continue exactly."""

    arg_params: dict[str, Any]  # parameter name -> CPU NDArray
    aux_params: dict[str, Any]  # auxiliary-state name -> CPU NDArray
    #: the optimizer's state arrays and their JSON description (optimizer_state.py); empty
    #: and None before init_optimizer, or when the state lives on the kvstore servers
    optimizer_arrays: dict[str, Any] = field(default_factory=dict)
    optimizer_meta: dict[str, Any] | None = None
    #: an optimizer exists but its state lives on the kvstore servers (not saved)
    optimizer_on_servers: bool = False
    #: recurrent state carried across batches, ``NAME@DEVICE`` -> CPU NDArray
    recurrent_states: dict[str, Any] = field(default_factory=dict)


class CheckpointSource(Protocol):
    """A module the checkpoint writer can save."""

    def checkpoint_state(self) -> ModuleCheckpoint: ...
