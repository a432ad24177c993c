"""Label vocabulary of a sequence tagger, saved as JSON in the run folder (no MXNet here)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from mxtrain.data.vocab import read_versioned_json
from mxtrain.run.atomic import atomic_write_text

PAD = "<pad>"
UNK = "<unk>"
SPECIALS = (PAD, UNK)  # their ids are their positions: pad 0 (ignored by the loss), unk 1
FORMAT = "mxtrain-label-vocab"
VERSION = 1
FILE_NAME = "label_vocab.json"  # its name in the run folder


class LabelVocab:
    """A list of labels; the id of a label is its position.

    ``<pad>`` = 0 marks positions without a label (padding): the loss and the metrics skip
    them. ``<unk>`` = 1 stands for labels the training data did not have (found in eval data:
    such positions count as errors). A literal ``<pad>`` label in the data also becomes
    ``<unk>``, so that it is not silently skipped.
    """

    pad_id = 0
    unk_id = 1

    def __init__(self, labels: Sequence[str]) -> None:
        labels = list(labels)
        if tuple(labels[: len(SPECIALS)]) != SPECIALS:
            raise ValueError(f"a label vocabulary must start with {list(SPECIALS)}")
        if len(set(labels)) != len(labels):
            raise ValueError("a label vocabulary must not contain a label twice")
        self._labels = labels
        self._ids = {label: i for i, label in enumerate(labels)}
        self._ids[PAD] = self.unk_id

    @classmethod
    def build(cls, sequences: Iterable[Sequence[str]]) -> LabelVocab:
        """Every label that occurs, sorted by name (a stable order, whatever the data order)."""
        seen: set[str] = set()
        for sequence in sequences:
            seen.update(sequence)
        seen.difference_update(SPECIALS)
        return cls([*SPECIALS, *sorted(seen)])

    def __len__(self) -> int:
        return len(self._labels)

    def __contains__(self, label: object) -> bool:
        return label in self._ids

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LabelVocab) and self._labels == other._labels

    __hash__ = None  # type: ignore[assignment]

    @property
    def labels(self) -> list[str]:
        """All labels in id order, specials included (a copy)."""
        return list(self._labels)

    def encode(self, labels: Iterable[str]) -> list[int]:
        """Label ids; unknown labels become ``<unk>``."""
        get, unk = self._ids.get, self.unk_id
        return [get(label, unk) for label in labels]

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Labels of ``ids`` (ints or floats holding ints); out-of-range ids raise IndexError."""
        out = []
        for i in ids:
            index = int(i)
            if index < 0:
                raise IndexError(f"label id {index} is negative")
            out.append(self._labels[index])
        return out

    def to_json(self) -> dict[str, Any]:
        """The saved form."""
        return {
            "format": FORMAT,
            "version": VERSION,
            "specials": {"pad": PAD, "unk": UNK},
            "labels": self._labels,
        }

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write JSON atomically (a temporary file renamed over ``path``)."""
        atomic_write_text(
            Path(path), json.dumps(self.to_json(), ensure_ascii=False, indent=0) + "\n"
        )

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> LabelVocab:
        """Read a file written by ``save``; raise ``DataError`` naming the file and the fault."""
        path = Path(path)
        hint = (
            f"Use the {FILE_NAME} that mxtrain fit wrote into the run folder of this model "
            "(it belongs with that run's vocab.json and parameters)."
        )

        obj, bad = read_versioned_json(
            path, kind="label vocabulary", fmt=FORMAT, version=VERSION, hint=hint
        )
        if obj.get("specials") != {"pad": PAD, "unk": UNK}:
            raise bad(f"has unexpected specials {obj.get('specials')!r}")
        labels = obj.get("labels")
        if not isinstance(labels, list) or not all(isinstance(t, str) for t in labels):
            raise bad('has no "labels" list of strings')
        if tuple(labels[: len(SPECIALS)]) != SPECIALS:
            raise bad(f"does not start with the special labels {list(SPECIALS)}")
        seen: set[str] = set()
        for i, label in enumerate(labels):
            if label in seen:
                raise bad(f"lists the label {label!r} twice (again at id {i})")
            seen.add(label)
        return cls(labels)
