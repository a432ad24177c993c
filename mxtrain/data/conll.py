"""Reading CoNLL and CoNLL-U files into token/label sentences (no MXNet here).

CoNLL: one token per line, its columns separated by whitespace (or tabs), a blank line after
each sentence. Every token line of a file must have the same number of columns. A line whose
token is ``-DOCSTART-`` (CoNLL-2003 document marks) ends the sentence before it and is not a
token.

CoNLL-U (https://universaldependencies.org/format.html): 10 tab-separated columns (ID, FORM,
LEMMA, UPOS, XPOS, FEATS, HEAD, DEPREL, DEPS, MISC), ``#`` comment lines, and two kinds of
lines that are not words of the sentence: multi-word token ranges (ID ``3-4``) and empty nodes
(ID ``5.1``); all three are skipped.

Every problem is a :class:`DataError` naming the file and the line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from mxtrain.data.base import resolve_source
from mxtrain.data.tagged_options import CONLLU_COLUMNS, TaggedSequencesOptions
from mxtrain.data.text_files import read_data_text
from mxtrain.errors import DataError

DOCSTART = "-DOCSTART-"
_INT_ID = re.compile(r"[0-9]+")
_RANGE_ID = re.compile(r"[0-9]+-[0-9]+")
_EMPTY_NODE_ID = re.compile(r"[0-9]+\.[0-9]+")
_FORMAT_HINT = (
    "Each line holds one token and its columns (e.g. 'dogs NNS'), with a blank line after "
    "each sentence; CoNLL-U lines have 10 tab-separated columns. Set format, delimiter, "
    "token_column and label_column to match the file."
)


@dataclass(frozen=True)
class TaggedSentence:
    """One sentence: its tokens, their labels (None when not read) and where it starts."""

    tokens: tuple[str, ...]
    labels: tuple[str, ...] | None
    line: int  # 1-based line of the first token in the file


def detect_format(lines: list[str]) -> str:
    """``conllu`` if the first token line has 10 tab-separated columns and a CoNLL-U ID."""
    for line in lines:
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.rstrip("\r").split("\t")
        ident = fields[0].strip()
        is_id = any(p.fullmatch(ident) for p in (_INT_ID, _RANGE_ID, _EMPTY_NODE_ID))
        return "conllu" if len(fields) == CONLLU_COLUMNS and is_id else "conll"
    return "conll"


def _column(
    index: int, count: int, name: str, source: str, number: int, fmt: str, fields: list[str]
) -> int:
    """``index`` (negative: from the end) as a position in a line of ``count`` columns."""
    resolved = index + count if index < 0 else index
    if not 0 <= resolved < count:
        shown = " | ".join(fields)
        raise DataError(
            f"{source}:{number}: {name} {index} does not exist: this {fmt} line has {count} "
            f"column{'s' if count != 1 else ''} ({shown}).",
            hint=f"Set {name} to a 0-based column of the file (negative counts from the end). "
            + _FORMAT_HINT,
        )
    return resolved


def _is_conllu_word(fields: list[str], source: str, number: int) -> bool:
    """Whether a CoNLL-U line is a word of its sentence (not a multi-word token range or an
    empty node); DataError when it is not a CoNLL-U token line at all."""
    if len(fields) != CONLLU_COLUMNS:
        spaces = " (spaces instead of tabs?)" if len(fields) < CONLLU_COLUMNS else ""
        raise DataError(
            f"{source}:{number}: a CoNLL-U line has {CONLLU_COLUMNS} tab-separated "
            f"columns, this one has {len(fields)}{spaces}.",
            hint=_FORMAT_HINT,
        )
    ident = fields[0]
    if _RANGE_ID.fullmatch(ident) or _EMPTY_NODE_ID.fullmatch(ident):
        return False
    if not _INT_ID.fullmatch(ident):
        raise DataError(
            f"{source}:{number}: the ID {ident!r} is not a word index (1, 2, ...), a "
            "multi-word range (3-4) or an empty node (5.1).",
            hint=_FORMAT_HINT,
        )
    return True


def _token_label_columns(
    fields: list[str],
    token_index: int,
    label_index: int,
    labels: bool,
    source: str,
    number: int,
    fmt: str,
) -> tuple[int, int]:
    """The positions of the token and label columns (-1: labels not read) in ``fields``, the
    first token line (line ``number`` of ``source``)."""
    ti = _column(token_index, len(fields), "token_column", source, number, fmt, fields)
    li = -1
    if labels:
        li = _column(label_index, len(fields), "label_column", source, number, fmt, fields)
        if li == ti:
            raise DataError(
                f"{source}:{number}: token_column {token_index} and label_column "
                f"{label_index} are the same column of this {len(fields)}-column line, "
                "so there are no labels.",
                hint="Give a file with a label column, or set token_column and label_column.",
            )
    return ti, li


def parse_conll(
    text: str,
    source: str,
    options: TaggedSequencesOptions,
    *,
    labels: bool = True,
    max_sentences: int | None = None,
) -> tuple[str, list[TaggedSentence]]:
    """(format, sentences) of a CoNLL or CoNLL-U text; ``source`` names it in messages.

    ``labels: False`` reads only the token column (predicting: the label column may be
    missing). Sentences without tokens (e.g. only comments) are skipped.
    """
    lines = text.split("\n")
    fmt = options.format if options.format != "auto" else detect_format(lines)
    conllu = fmt == "conllu"
    tab = conllu or options.delimiter == "tab"
    token_index, label_index = options.columns(fmt)
    sentences: list[TaggedSentence] = []
    tokens: list[str] = []
    tags: list[str] = []
    start = 0
    first: tuple[int, int] | None = None  # (columns, line) of the first conll token line
    columns: tuple[int, int] | None = None  # resolved (token, label) positions

    def close() -> bool:
        """End the current sentence; True when max_sentences are read."""
        nonlocal tokens, tags
        if tokens:
            sentences.append(TaggedSentence(tuple(tokens), tuple(tags) if labels else None, start))
            tokens, tags = [], []
        return max_sentences is not None and len(sentences) >= max_sentences

    for number, raw in enumerate(lines, 1):
        line = raw.rstrip("\r")
        if not line.strip():
            if close():
                break
            continue
        if conllu and line.startswith("#"):
            continue
        fields = [f.strip() for f in line.split("\t")] if tab else line.split()
        if conllu:
            if not _is_conllu_word(fields, source, number):
                continue
        elif first is None:
            first = (len(fields), number)
        elif len(fields) != first[0]:
            raise DataError(
                f"{source}:{number}: this line has {len(fields)} column"
                f"{'s' if len(fields) != 1 else ''}, but the file's first token line "
                f"(line {first[1]}) has {first[0]}.",
                hint="Every token line of a CoNLL file needs the same columns"
                + ("" if tab else " (with delimiter: whitespace a token cannot contain spaces)")
                + ". "
                + _FORMAT_HINT,
            )
        if columns is None:
            columns = _token_label_columns(
                fields, token_index, label_index, labels, source, number, fmt
            )
        token = fields[columns[0]]
        if not conllu and token == DOCSTART:
            if close():
                break
            continue
        if not token:
            raise DataError(f"{source}:{number}: the token column is empty.", hint=_FORMAT_HINT)
        if labels:
            label = fields[columns[1]]
            if not label:
                raise DataError(f"{source}:{number}: the label column is empty.", hint=_FORMAT_HINT)
            tags.append(label)
        if not tokens:
            start = number
        tokens.append(token)
    else:
        close()
    return fmt, sentences


def read_conll(
    options: TaggedSequencesOptions,
    base_dir: Path,
    *,
    labels: bool = True,
    max_sentences: int | None = None,
) -> tuple[str, str, list[TaggedSentence]]:
    """(path for messages, format, sentences) of ``options.source``; DataError if none."""
    path = resolve_source(options.source, base_dir)
    name = str(path)
    text = read_data_text(path, options.source, expected="a CoNLL file")
    fmt, sentences = parse_conll(text, name, options, labels=labels, max_sentences=max_sentences)
    if not sentences:
        raise DataError(
            f"The data file {name} has no sentences (it is empty, or only blank lines"
            + (" and comments)." if fmt == "conllu" else ")."),
            hint=_FORMAT_HINT,
        )
    return name, fmt, sentences
