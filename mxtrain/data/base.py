"""What iterators tell the rest of mxtrain, and what they are told. No MXNet import here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class DataInfo:
    """Facts about a dataset that model builders need (sizes of inputs and outputs)."""

    vocab_size: int | None = None  # number of input token ids, padding and specials included
    num_classes: int | None = None  # number of output classes (= vocab_size for a language model)
    pad_id: int | None = None  # id used for padding inputs and ignored labels


@dataclass(frozen=True)
class DataContext:
    """How an iterator is being built.

    ``role`` is ``"train"`` or ``"eval"``. An eval iterator receives the train iterator as
    ``train`` so it can reuse its vocabulary and buckets. ``base_dir`` is the folder relative
    paths in the config are resolved against (the config file's folder). ``vocab_file``, when
    set, is a saved vocabulary to load instead of building one.
    """

    role: str
    seed: int
    base_dir: Path
    train: Any = None
    vocab_file: Path | None = None
