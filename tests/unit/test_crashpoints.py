"""The crash-point rules: parsing, matching, and the refusal of unknown names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mxtrain import crashpoints


def test_rules_are_parsed_with_details_and_counts(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    rules, found = crashpoints._parse(
        f"checkpoint.manifest-written@tag=e0002-b000000; term:train.batch@epoch=2,batch=3#2;"
        f"trace:{trace}"
    )
    assert found == str(trace)
    kill, term = rules
    assert (kill.action, kill.name, kill.where, kill.nth) == (
        "kill",
        "checkpoint.manifest-written",
        {"tag": "e0002-b000000"},
        1,
    )
    assert (term.action, term.where, term.nth) == ("term", {"epoch": "2", "batch": "3"}, 2)
    assert term.matches("train.batch", {"epoch": 2, "batch": 3, "extra": 1})
    assert not term.matches("train.batch", {"epoch": 2, "batch": 4})
    assert not term.matches("metrics.appended", {"epoch": 2, "batch": 3})


@pytest.mark.parametrize(
    ("spec", "message"),
    [("explode:train.batch", "unknown action 'explode'"), ("kill:no.such", "'no.such' is not")],
)
def test_bad_rules_are_refused(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        crashpoints._parse(spec)


def test_off_costs_nothing_and_trace_refuses_unregistered_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    crashpoints.crash_point("no.such.point")  # off: returns at once, checks nothing
    trace = tmp_path / "t.jsonl"
    monkeypatch.setattr(crashpoints, "_ACTIVE", True)
    monkeypatch.setattr(crashpoints, "_TRACE", str(trace))
    monkeypatch.setattr(crashpoints, "_RULES", [])
    crashpoints.crash_point("train.batch", epoch=1, batch=2)
    assert json.loads(trace.read_text()) == {
        "name": "train.batch",
        "where": {"epoch": 1, "batch": 2},
    }
    with pytest.raises(KeyError, match="not registered"):
        crashpoints.crash_point("no.such.point")
