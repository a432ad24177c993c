"""Token vocabulary with fixed special ids, saved as JSON beside the checkpoints."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from mxtrain.errors import DataError
from mxtrain.run.atomic import atomic_write_text
from mxtrain.user_files import UnusableFile, read_regular

PAD = "<pad>"
UNK = "<unk>"
EOS = "<eos>"
SPECIALS = (PAD, UNK, EOS)  # their ids are their positions: pad 0, unk 1, eos 2
FORMAT = "mxtrain-vocab"
VERSION = 1


class Vocab:
    """A list of tokens; the id of a token is its position.

    ``<pad>`` = 0, ``<unk>`` = 1, ``<eos>`` = 2, then the extra reserved tokens ``specials``
    (e.g. ``<bos>``: ids 3, 4, ...; never counted or dropped by ``build``), then regular
    tokens. Unknown tokens encode
    to ``<unk>``; so does a literal ``<pad>`` in the text, which must not vanish from the
    loss as padding would. ``level`` and ``lowercase`` record how the text was tokenized so
    a vocabulary is not reused with a different tokenizer by mistake (None: not recorded).
    """

    pad_id = 0
    unk_id = 1
    eos_id = 2

    def __init__(
        self,
        tokens: Sequence[str],
        *,
        level: str | None = None,
        lowercase: bool | None = None,
        specials: Sequence[str] = (),
    ) -> None:
        tokens = list(tokens)
        specials = list(specials)
        if tuple(tokens[: len(SPECIALS)]) != SPECIALS:
            raise ValueError(f"a vocabulary must start with {list(SPECIALS)}")
        if tokens[len(SPECIALS) : len(SPECIALS) + len(specials)] != specials:
            raise ValueError(
                f"a vocabulary with specials {specials} must list them right after {list(SPECIALS)}"
            )
        if len(set(tokens)) != len(tokens):
            raise ValueError("a vocabulary must not contain a token twice")
        self._tokens = tokens
        self._ids = {token: i for i, token in enumerate(tokens)}
        self._ids[PAD] = self.unk_id
        self.level = level
        self.lowercase = lowercase
        self.specials = tuple(specials)

    @classmethod
    def build(
        cls,
        sentences: Iterable[Sequence[str]],
        *,
        min_count: int = 1,
        max_size: int | None = None,
        level: str | None = None,
        lowercase: bool | None = None,
        specials: Sequence[str] = (),
        extra: Sequence[str] = (),
    ) -> Vocab:
        """Count tokens and keep the frequent ones, most frequent first (ties: by token).

        ``max_size`` limits the whole vocabulary, the three specials and ``specials``
        included; ``specials`` (extra reserved tokens) follow ``<eos>`` whatever their counts.
        ``extra`` tokens (e.g. the words of pretrained vectors) follow the counted ones, in
        their order, those already kept (and reserved ones) aside; ``max_size`` does not
        limit them.
        """
        specials = list(specials)
        counts: Counter[str] = Counter()
        for sentence in sentences:
            counts.update(sentence)
        for special in (*SPECIALS, *specials):
            counts.pop(special, None)
        kept = sorted(
            (item for item in counts.items() if item[1] >= min_count),
            key=lambda item: (-item[1], item[0]),
        )
        reserved = [*SPECIALS, *specials]
        if max_size is not None:
            kept = kept[: max(0, max_size - len(reserved))]
        tokens = [*reserved, *(token for token, _ in kept)]
        known = set(tokens)
        for token in extra:
            if token not in known:
                known.add(token)
                tokens.append(token)
        return cls(
            tokens,
            level=level,
            lowercase=lowercase,
            specials=specials,
        )

    def __len__(self) -> int:
        return len(self._tokens)

    def __contains__(self, token: object) -> bool:
        return token in self._ids

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Vocab)
            and self._tokens == other._tokens
            and self.specials == other.specials
        )

    __hash__ = None  # type: ignore[assignment]

    @property
    def tokens(self) -> list[str]:
        """All tokens in id order (a copy)."""
        return list(self._tokens)

    def token_id(self, token: str) -> int:
        """The id of one token (``<unk>``'s id if unknown)."""
        return self._ids.get(token, self.unk_id)

    def encode(self, tokens: Iterable[str]) -> list[int]:
        """Token ids; unknown tokens become ``<unk>``."""
        get, unk = self._ids.get, self.unk_id
        return [get(token, unk) for token in tokens]

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Tokens of ``ids`` (ints or floats holding ints); out-of-range ids raise IndexError."""
        tokens = self._tokens
        out = []
        for i in ids:
            index = int(i)
            if index < 0:
                raise IndexError(f"token id {index} is negative")
            out.append(tokens[index])
        return out

    def check_lowercase(self, lowercase: bool, source: str, origin: str) -> None:
        """DataError when the data ``source`` is lowercased (``lowercase``) unlike the text
        this vocabulary (``origin`` in the message) was built from."""
        if self.lowercase is not None and self.lowercase != lowercase:
            raise DataError(
                f"The data {source} has lowercase: {str(lowercase).lower()}, but "
                f"{origin} was built with lowercase: {str(self.lowercase).lower()}.",
                hint="Use the same lowercase setting for all data of one model.",
            )

    def to_json(self) -> dict[str, Any]:
        """The saved form; ``reserved`` (the extra specials) only when there are any, so a
        vocabulary without them is saved exactly as before."""
        obj: dict[str, Any] = {
            "format": FORMAT,
            "version": VERSION,
            "specials": {"pad": PAD, "unk": UNK, "eos": EOS},
            "level": self.level,
            "lowercase": self.lowercase,
            "tokens": self._tokens,
        }
        if self.specials:
            obj["reserved"] = list(self.specials)
        return obj

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write JSON atomically (a temporary file renamed over ``path``)."""
        atomic_write_text(
            Path(path), json.dumps(self.to_json(), ensure_ascii=False, indent=0) + "\n"
        )

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Vocab:
        """Read a file written by ``save``; raise ``DataError`` naming the file and the fault."""
        path = Path(path)
        hint = (
            "Use the vocab.json that mxtrain wrote into the run folder, or remove the "
            "vocab_file setting to build the vocabulary from the training data."
        )

        obj, bad = read_versioned_json(
            path, kind="vocabulary", fmt=FORMAT, version=VERSION, hint=hint
        )
        specials = obj.get("specials")
        if specials != {"pad": PAD, "unk": UNK, "eos": EOS}:
            raise bad(f"has unexpected specials {specials!r}")
        tokens = obj.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            raise bad('has no "tokens" list of strings')
        if tuple(tokens[: len(SPECIALS)]) != SPECIALS:
            raise bad(f"does not start with the special tokens {list(SPECIALS)}")
        seen: set[str] = set()
        for i, token in enumerate(tokens):
            if token in seen:
                raise bad(f"lists the token {token!r} twice (again at id {i})")
            seen.add(token)
        reserved = obj.get("reserved", [])
        if not isinstance(reserved, list) or not all(isinstance(t, str) for t in reserved):
            raise bad(f'has a "reserved" entry that is not a list of tokens: {reserved!r}')
        if tokens[len(SPECIALS) : len(SPECIALS) + len(reserved)] != reserved:
            raise bad(f"does not list its reserved tokens {reserved} right after {list(SPECIALS)}")
        level, lowercase = obj.get("level"), obj.get("lowercase")
        if level is not None and not isinstance(level, str):
            raise bad(f'has a "level" that is not a string: {level!r}')
        if lowercase is not None and not isinstance(lowercase, bool):
            raise bad(f'has a "lowercase" that is not true/false: {lowercase!r}')
        return cls(tokens, level=level, lowercase=lowercase, specials=reserved)


def read_versioned_json(
    path: Path, *, kind: str, fmt: str, version: int, hint: str
) -> tuple[dict[str, Any], Callable[[str], DataError]]:
    """Read a JSON file mxtrain wrote, check its ``format`` and ``version`` entries.

    Returns the object and a function that makes further ``DataError`` messages in the same
    style ("The <kind> file <path> <what>."), for the caller's own checks.
    """

    def bad(what: str) -> DataError:
        return DataError(f"The {kind} file {path} {what}.", hint=hint)

    try:
        text = read_regular(path).decode("utf-8")
    except UnusableFile as exc:
        raise DataError(f"The {kind} file {path} {exc.problem}.", hint=exc.hint or hint) from None
    except UnicodeDecodeError as exc:
        raise bad(f"is not UTF-8 text (byte {exc.start})") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise bad(f"is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    if not isinstance(obj, dict) or obj.get("format") != fmt:
        raise bad(f'is not an mxtrain {kind} (no "format": "{fmt}" entry)')
    if obj.get("version") != version:
        raise bad(
            f"has format version {obj.get('version')!r}; this mxtrain reads version {version}"
        )
    return obj, bad
