"""Resume after a damaged newest checkpoint keeps the damaged one (fuzz class: damaged
checkpoints): it trains the skipped epoch again, and the save of that epoch's tag first puts
the damaged folder aside as ``checkpoints/damaged-<tag>-<n>`` instead of writing over it."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from mxtrain.cli.main import cli


def test_resume_keeps_a_truncated_newest_checkpoint_aside(tiny_config: Path) -> None:
    result = CliRunner().invoke(cli, ["fit", str(tiny_config)])
    assert result.exit_code == 0, result.output
    run = tiny_config.parent / "runs" / "tiny"
    params = run / "checkpoints" / "e0002-b000000" / "params.nd"
    damaged = params.read_bytes()[: params.stat().st_size // 2]
    params.write_bytes(damaged)  # truncated, as by a full disk or a killed copy

    result = CliRunner().invoke(cli, ["resume", str(run)])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    aside = run / "checkpoints" / "damaged-e0002-b000000-1"
    assert (aside / "params.nd").read_bytes() == damaged  # the damaged bytes are kept
    log = (run / "train.log").read_text()
    assert "checkpoint e0002-b000000 is not usable" in log and "falling back" in log
    assert "checkpoint e0002-b000000 is damaged (params.nd is truncated" in log
    assert str(aside) in log
    status = json.loads((run / "run.json").read_text())
    assert status["status"] == "finished" and status["resumes"][-1]["from"] == "e0001-b000000"
    # the epoch trained again has a valid checkpoint under its own tag, which score uses
    result = CliRunner().invoke(cli, ["score", str(run), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["checkpoint"] == "e0002-b000000"
