"""Options of the ``gluon`` model: a Gluon block built by name (no MXNet import: the config
loader and `mxtrain check` read them)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from mxtrain.errors import InvalidValue
from mxtrain.option_checks import CheckedOptions, check_choice, documented

LAYOUTS = ("NT", "TN")


@dataclass(frozen=True)
class GluonOptions(CheckedOptions):
    """A HybridBlock made by ``block(**options)``, traced by mxtrain per bucket."""

    block: str = documented(
        "",
        "what makes the HybridBlock: a class or function as 'package.module:attr' (e.g. "
        "'gluoncv.model_zoo:get_model') or 'path/to/file.py:attr' (relative to the config "
        "file's folder); it is called with `options` as keyword arguments",
    )
    options: Mapping[str, Any] = field(
        default_factory=lambda: MappingProxyType({}),
        metadata={
            "doc": "keyword arguments of `block`, e.g. {name: resnet18_v1, classes: 10}; "
            "the values $vocab_size and $num_classes stand for the data's"
        },
    )
    layout: Literal["NT", "TN"] = documented(
        "NT",
        "sequence data only: NT: the block reads (batch, length) and returns (batch, length, "
        "classes); TN: it reads (length, batch) and returns (length, batch, classes), as "
        "GluonNLP's language models do (mxtrain transposes around it)",
    )

    def validate(self) -> None:
        if not isinstance(self.block, str) or ":" not in self.block:
            raise InvalidValue(
                "block",
                "must name what makes the block, as 'package.module:attr' or "
                f"'path/to/file.py:attr', not {self.block!r}",
            )
        check_choice("layout", self.layout, LAYOUTS)
