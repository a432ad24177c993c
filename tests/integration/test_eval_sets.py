"""Several eval sets (data.eval as a mapping of named sections): each scored at every
evaluation, metrics named set.metric in the log, metrics.jsonl and `runs`; best_metric names the
set; `score --data NAME` scores one set and equals what fit logged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from mxtrain.cli.main import cli
from mxtrain.run.folder import read_metrics

SETS = (
    "data.eval={valid: {iterator: bucket_sentence, source: valid.txt, batch_size: 8, "
    "shuffle: false}, test: {source: train.txt, batch_size: 8, shuffle: false}}"
)


def invoke(*args: object):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def test_every_set_is_scored_and_named(tiny_config: Path) -> None:
    result = invoke(
        "fit", tiny_config, "--set", SETS, "--set", "checkpoint.best_metric=valid.perplexity",
        "--set", "fit.early_stopping={metric: test.perplexity, patience: 5}",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    run = tiny_config.parent / "runs" / "tiny"
    epochs = [r for r in read_metrics(run / "metrics.jsonl") if r["event"] == "epoch"]
    assert [set(r["eval"]) for r in epochs] == [{"valid.perplexity", "test.perplexity"}] * 2
    assert epochs[0]["eval"]["valid.perplexity"] != epochs[0]["eval"]["test.perplexity"]
    assert "eval_valid.perplexity=" in (run / "train.log").read_text()
    listed = json.loads(invoke("runs", run.parent, "--json").output)
    assert listed[0]["best"]["metric"] == "valid.perplexity"
    best = min(r["eval"]["valid.perplexity"] for r in epochs)
    assert listed[0]["best"]["value"] == pytest.approx(best)
    # score one set by its name: what fit logged for that set at that checkpoint
    scored = invoke("score", f"{run}:2", "--data", "test", "--json")
    assert scored.exit_code == 0, scored.output
    metrics = json.loads(scored.output.strip().splitlines()[-1])["metrics"]
    assert metrics["perplexity"] == pytest.approx(epochs[1]["eval"]["test.perplexity"], rel=1e-6)
    # the config keeps its sets: check shows them, and a resumed run reads them back
    shown = invoke("check", run / "config.yaml")
    assert shown.exit_code == 0 and "    valid:\n" in shown.output and "    test:\n" in shown.output


def test_a_metric_without_its_set_is_refused_naming_the_sets(tiny_config: Path) -> None:
    result = invoke(
        "check", tiny_config, "--set", SETS, "--set", "checkpoint.best_metric=perplexity"
    )
    assert result.exit_code == 2
    assert "valid.perplexity, test.perplexity" in result.output and "Name the set" in result.output
    bad = invoke("check", tiny_config, "--set", "data.eval={my-set: {source: valid.txt}}")
    assert bad.exit_code == 2 and "an eval set's name is a word" in bad.output
