"""``--ensemble RUN`` of ``mxtrain predict`` and ``mxtrain score``: further seq2seq runs that
decode together with the main one (the mean of their next-token probabilities at each step:
:mod:`mxtrain.decoding.seq2seq`).

Each member is opened like the main run (its own config, model and checkpoint: ``RUN``,
``RUN:EPOCH``, ``RUN:best``), reading the same input, and must share the main run's source
and target vocabularies token for token and its tokenization: the ensemble feeds every model
the same source ids and scores the same output ids. Runs trained on the same data with the
same vocabulary options (e.g. the seeds of one sweep) do; others can be made to by training
them with ``data.train.vocab`` set to the first run's ``vocab.json``. The members' models may
differ (layers, sizes, attention, even rnn_seq2seq beside transformer_seq2seq), but not
their target order: a right-to-left model (``reverse_target``) cannot average its next token
with a left-to-right one's.

``--rerank RUN`` opens further runs the same way (the same vocabularies and tokenization, any
target order): each searches on its own, and every model scores every candidate any search
kept (:func:`mxtrain.decoding.seq2seq.decode_sources`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from mxtrain.data.base import TASK_SEQ2SEQ
from mxtrain.decoding.seq2seq import reverses
from mxtrain.errors import ConfigError
from mxtrain.inference.open import OpenedRun, open_run

log = logging.getLogger("mxtrain")

#: what ``--ensemble`` says when a run cannot join
ENSEMBLE_HINT = (
    "--ensemble takes seq2seq runs trained with the same source and target vocabularies "
    "(the seeds of one sweep, or runs given data.train.vocab = the first run's vocab.json)."
)


def open_members(
    refs: Sequence[str | os.PathLike[str]],
    main: OpenedRun,
    *,
    data: str | os.PathLike[str] | None,
    target: str | os.PathLike[str] | None,
    role: str,
    flag: str = "--ensemble",
) -> list[OpenedRun]:
    """The runs ``refs`` opened for decoding beside ``main`` (no module bound), each checked
    to share ``main``'s vocabularies and tokenization (a ConfigError naming both runs if
    not); an ``--ensemble`` member also its target order (``reverse_target``), which a
    ``--rerank`` model may turn around."""
    if refs and getattr(main.data_iter.data_info, "task", None) != TASK_SEQ2SEQ:
        raise ConfigError(
            f"{flag} decodes with further seq2seq models; {main.run.path} is not a seq2seq run.",
            hint=f"Leave out {flag} for this run.",
        )
    if data is None:  # the members read what main reads: their own eval files may be gone
        data, target = _default_files(main)
    members = []
    for ref in refs:
        member = open_run(
            ref, data=data, target=target, role=role, needs_module=lambda data_iter: False
        )
        check_same_vocabularies(main, member, flag)
        if flag == "--ensemble":
            check_same_order(main, member)
        members.append(member)
    if members and flag == "--ensemble":
        log.info(
            "ensemble of %d models: %s",
            len(members) + 1,
            ", ".join(f"{m.run.path} ({describe(m)})" for m in [main, *members]),
        )
    elif members:
        log.info(
            "reranking with %d further models: %s",
            len(members),
            ", ".join(f"{m.run.path} ({describe(m)}{_order(m)})" for m in members),
        )
    return members


def reverses_target(opened: OpenedRun) -> bool:
    """Whether ``opened``'s model reads and writes targets last token first."""
    return reverses(opened.data_iter.data_info)


def _order(opened: OpenedRun) -> str:
    return ", right to left" if reverses_target(opened) else ""


def check_same_order(main: OpenedRun, member: OpenedRun) -> None:
    """A ConfigError unless ``member`` writes targets in ``main``'s order: an ensemble
    averages the two models' next token, which must be the same position."""
    if reverses_target(main) != reverses_target(member):
        right_to_left = member if reverses_target(member) else main
        raise ConfigError(
            f"--ensemble {member.run.path}: {right_to_left.run.path} writes targets right to "
            "left (data reverse_target: true) and the other left to right, so their next "
            "tokens cannot be averaged step by step.",
            hint="Rerank with the other direction's model instead: with --rerank RUN it "
            "searches on its own and every model scores every candidate.",
        )


def _default_files(main: OpenedRun) -> tuple[str | None, str | None]:
    """The source and target files ``main`` reads when no --data is given (its data.eval),
    as absolute paths; (None, None) where its data section names no such files. A member
    needs only its run folder (vocabularies and checkpoint), not its own eval files."""
    section = main.config.data.eval
    options = getattr(section, "options", None)
    source, target = getattr(options, "source", None), getattr(options, "target", None)
    if not isinstance(source, str) or not isinstance(target, str):
        return None, None
    return str(main.config.resolve_path(source)), str(main.config.resolve_path(target))


def describe(opened: OpenedRun) -> str:
    """The checkpoint an opened run decodes with, for messages and reports."""
    if opened.checkpoint is not None:
        return opened.checkpoint.describe()
    return opened.params_file.name


def check_same_vocabularies(main: OpenedRun, member: OpenedRun, flag: str = "--ensemble") -> None:
    """A ConfigError unless ``member`` reads text as ``main`` does: a seq2seq run with the
    same tokenization and the same source and target vocabularies, token for token."""
    main_info, info = main.data_iter.data_info, member.data_iter.data_info
    if getattr(info, "task", None) != TASK_SEQ2SEQ:
        raise ConfigError(
            f"{flag} {member.run.path}: not a seq2seq run (its data reports task "
            f"{getattr(info, 'task', None)!r}).",
            hint=ENSEMBLE_HINT,
        )
    if info.tokens != main_info.tokens:
        raise ConfigError(
            f"{flag} {member.run.path} splits text into {info.tokens!r} tokens, "
            f"{main.run.path} into {main_info.tokens!r}.",
            hint=ENSEMBLE_HINT,
        )
    for side in ("vocab", "target_vocab"):
        ours, theirs = _tokens(main.data_iter, side), _tokens(member.data_iter, side)
        if ours != theirs:
            raise ConfigError(
                f"{flag} {member.run.path}: its {_side_name(side)} vocabulary differs from "
                f"{main.run.path}'s ({_first_difference(ours, theirs)}).",
                hint=ENSEMBLE_HINT,
            )


def _tokens(data_iter: Any, side: str) -> list[str]:
    vocab = getattr(data_iter, side, None)
    if vocab is None:
        raise ConfigError(
            f"The data iterator {type(data_iter).__name__} keeps no {side}, so the runs' "
            "vocabularies cannot be compared.",
            hint=ENSEMBLE_HINT,
        )
    return list(vocab.tokens)


def _side_name(side: str) -> str:
    return "source" if side == "vocab" else "target"


def _first_difference(ours: list[str], theirs: list[str]) -> str:
    for i, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        if a != b:
            return f"id {i} is {a!r} in one and {b!r} in the other"
    return f"{len(ours)} tokens against {len(theirs)}"
