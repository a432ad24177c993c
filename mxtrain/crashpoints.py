"""Named crash points: a test and debugging facility, not a user feature.

Every step of the run-folder and checkpoint protocols calls :func:`crash_point` with a name
from :data:`POINTS` and where it is (a checkpoint tag, an epoch and batch, a file name).
The environment variable ``MXTRAIN_CRASH_AT`` is read once, at import; unset (always, in
normal use) every call returns at once. Set, it holds rules separated by ``;``::

    [kill:]NAME[@KEY=VALUE[,KEY=VALUE...]][#N]   SIGKILL this process at the N-th hit (1st)
    term:NAME[@...][#N]                           send it SIGTERM there (a stop request)
    trace:FILE                                    append every hit to FILE as a JSON line

``@`` keeps only hits whose details match (``checkpoint.manifest@tag=e0002-b000000``);
``#N`` counts the matching hits. A kill uses SIGKILL, so no handler, ``finally`` or flush
runs: the files are exactly as a power cut or an OOM kill would leave them.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass
from typing import Any

ENV_VAR = "MXTRAIN_CRASH_AT"

#: Every crash point in mxtrain, by name, with where it sits. A name passed to crash_point
#: must be listed here (checked while the facility is on); tests enumerate this list.
POINTS: dict[str, str] = {
    # run folder creation (mxtrain fit): built under a hidden name, then renamed into place
    "run-folder.staged": "all first files written in the hidden staging folder",
    "run-folder.published": "staging folder renamed to the run folder",
    # atomic small files (rundir.atomic_write_bytes): temporary written+fsynced, then renamed
    "file.written": "temporary file of an atomic write complete and fsynced",
    "file.replaced": "temporary file renamed over the real name",
    "mxnet-file.written": "<prefix>-symbol.json (or a params file) temporary written, fsynced",
    "mxnet-file.replaced": "that file renamed into place",
    # metrics.jsonl
    "metrics.appended": "one record appended to metrics.jsonl and flushed",
    # the training loop
    "train.batch": "one training batch done (no file is being written)",
    # checkpoint.save_checkpoint
    "checkpoint.tmp-created": "checkpoints/.tmp-<tag>-<pid>/ created",
    "checkpoint.params-written": "params.nd written and fsynced",
    "checkpoint.optimizer-arrays-written": "optimizer.nd written and fsynced",
    "checkpoint.optimizer-meta-written": "optimizer.json written and fsynced",
    "checkpoint.state-written": "state.json written and fsynced",
    "checkpoint.manifest-written": "manifest.json written and fsynced",
    "checkpoint.tmp-synced": "the temporary folder fsynced",
    "checkpoint.top-params-copied": "<prefix>-NNNN.params temporary copy written and fsynced",
    "checkpoint.top-params-renamed": "<prefix>-NNNN.params renamed into place",
    "checkpoint.top-params-synced": "the run folder fsynced after that rename",
    "checkpoint.old-moved-aside": "an existing checkpoint of the same tag renamed aside",
    "checkpoint.moved-in": "the new checkpoint renamed into place",
    "checkpoint.root-synced": "checkpoints/ fsynced after that rename",
    "checkpoint.old-removed": "the checkpoint set aside deleted",
    # checkpoint.remove_checkpoint (retention: keep_last, resume --force)
    "checkpoint.delete-renamed": "a checkpoint renamed to .del-<tag>-<pid> before deletion",
    "checkpoint.delete-synced": "checkpoints/ fsynced after that rename",
    "checkpoint.delete-removed": "the renamed folder deleted",
    "checkpoint.delete-top-params": "its <prefix>-NNNN.params deleted",
}


@dataclass
class _Rule:
    action: str  # kill or term
    name: str
    where: dict[str, str]
    nth: int
    seen: int = 0

    def matches(self, name: str, where: dict[str, Any]) -> bool:
        return name == self.name and all(str(where.get(k)) == v for k, v in self.where.items())


def _parse(spec: str) -> tuple[list[_Rule], str | None]:
    rules: list[_Rule] = []
    trace: str | None = None
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        action, sep, rest = part.partition(":")
        if not sep:
            action, rest = "kill", part
        if action == "trace":
            trace = rest
            continue
        if action not in ("kill", "term"):
            raise ValueError(f"{ENV_VAR}: unknown action {action!r} in {part!r} (kill/term/trace)")
        rest, _, nth = rest.partition("#")
        name, _, where_text = rest.partition("@")
        if name not in POINTS:
            raise ValueError(f"{ENV_VAR}: {name!r} is not a crash point (see mxtrain.crashpoints)")
        where = dict(item.split("=", 1) for item in where_text.split(",") if item)
        rules.append(_Rule(action, name, where, int(nth) if nth else 1))
    return rules, trace


_RULES, _TRACE = _parse(os.environ.get(ENV_VAR, ""))
_ACTIVE = bool(_RULES) or _TRACE is not None


def crash_point(name: str, **where: Any) -> None:
    """Crash here if ``MXTRAIN_CRASH_AT`` says so; free when the variable is unset."""
    if not _ACTIVE:
        return
    if name not in POINTS:
        raise KeyError(f"crash point {name!r} is not registered in mxtrain.crashpoints.POINTS")
    if _TRACE is not None:
        with open(_TRACE, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"name": name, "where": where}, default=str) + "\n")
    for rule in _RULES:
        if rule.seen < rule.nth and rule.matches(name, where):
            rule.seen += 1
            if rule.seen == rule.nth:
                os.kill(os.getpid(), signal.SIGKILL if rule.action == "kill" else signal.SIGTERM)
