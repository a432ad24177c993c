"""scripts/quickstart.sh and scripts/test.sh hand their arguments to the right program.

A fake Python records what the scripts run, so no virtual environment is built and nothing
is downloaded: the test copies the two scripts and ``_venv.sh`` into a temporary project.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

from click.testing import CliRunner

from mxtrain.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]

# Stands for python3.11: the version check passes, `-m venv DIR` makes DIR/bin/{python,
# mxtrain} (copies of this script), and every call is appended to $CALLS (and, shell-quoted
# so that each argument can be recovered, to $CALLS.argv).
FAKE_PYTHON = """\
#!/usr/bin/env bash
echo "$(basename "$0") $*" >> "$CALLS"
{ printf '%q ' "$(basename "$0")" "$@"; echo; } >> "$CALLS.argv"
if [ "${1:-}" = "-m" ] && [ "${2:-}" = "venv" ]; then
  mkdir -p "$3/bin"
  cp "$0" "$3/bin/python"
  cp "$0" "$3/bin/mxtrain"
  cp "$0" "$3/bin/ruff"
  cp "$0" "$3/bin/mypy"
fi
exit 0
"""


def _project(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    project = tmp_path / "project"
    (project / "scripts").mkdir(parents=True)
    for name in ("quickstart.sh", "test.sh", "_venv.sh"):
        shutil.copy(ROOT / "scripts" / name, project / "scripts" / name)
    fake = tmp_path / "python3.11"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    env = dict(os.environ, PYTHON=str(fake), CALLS=str(tmp_path / "calls.txt"))
    return project, env


def _run(project: Path, env: dict[str, str], *args: str) -> None:
    done = subprocess.run(
        ["bash", *args], cwd=project, env=env, capture_output=True, text=True, timeout=60,
        stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def _calls(tmp_path: Path) -> list[str]:
    return (tmp_path / "calls.txt").read_text().splitlines()


def test_quickstart_passes_its_arguments_to_fit_not_to_pip(tmp_path: Path) -> None:
    project, env = _project(tmp_path)
    _run(project, env, "scripts/quickstart.sh", "--set", "experiment.seed=2")
    calls = _calls(tmp_path)
    installs = [c for c in calls if "pip install" in c and " -e " in c]
    assert installs == [f"python -m pip install --quiet -e {project}"]
    # mxtrain's own bytecode, written once (PYTHONDONTWRITEBYTECODE would have every process
    # compile it)
    assert calls.index(f"python -m compileall -q {project}/mxtrain {project}/scripts") > (
        calls.index(installs[0])
    )
    fits = [c for c in calls if c.startswith("mxtrain fit")]
    assert fits == [
        "mxtrain fit configs/ptb_lstm.yaml --name ptb_lstm_quickstart --force "
        "--set fit.num_epoch=1 --set model.dropout=0 --set optimizer.lr_scheduler={type: "
        "multifactor, unit: epochs, steps: [0.75], factor: 0.25} --set experiment.seed=2"
    ]


def test_the_quickstart_command_passes_mxtrain_check_on_the_shipped_config(
    tmp_path: Path,
) -> None:
    """The overrides quickstart.sh adds must stay valid as configs/ptb_lstm.yaml changes."""
    project, env = _project(tmp_path)
    _run(project, env, "scripts/quickstart.sh")
    argv = [shlex.split(line) for line in (tmp_path / "calls.txt.argv").read_text().splitlines()]
    (fit,) = [a for a in argv if a[:2] == ["mxtrain", "fit"]]
    options = fit[3:]
    sets = [options[i + 1] for i, option in enumerate(options) if option == "--set"]
    assert sets, fit
    args = ["check", str(ROOT / fit[2])]
    for value in sets:
        args += ["--set", value]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "num_epoch: 1" in result.output and "steps: [0.75]" in result.output


def test_test_sh_installs_the_test_extras_and_passes_pytest_arguments(tmp_path: Path) -> None:
    project, env = _project(tmp_path)
    _run(project, {**env, "MXTRAIN_TEST_WORKERS": "1"}, "scripts/test.sh", "-k", "config")
    calls = _calls(tmp_path)
    assert f"python -m pip install --quiet -e {project}[test]" in calls
    assert f"python -m compileall -q {project}/mxtrain {project}/scripts" in calls
    assert "python -m pytest -q --durations=15 -k config" in calls
    # one worker per usable core: each test file runs whole on one of them
    _run(project, {**env, "MXTRAIN_TEST_WORKERS": "3"}, "scripts/test.sh", "-k", "config")
    assert _calls(tmp_path)[-1] == (
        "python -m pytest -q --durations=15 -n 3 --dist loadfile -k config"
    )
    # by default one per usable core, whatever OMP_NUM_THREADS says (nproc obeys it)
    _run(project, {**env, "OMP_NUM_THREADS": "1"}, "scripts/test.sh")
    cores = len(os.sched_getaffinity(0))
    expected = (
        f"python -m pytest -q --durations=15 -n {cores} --dist loadfile"
        if cores > 1
        else "python -m pytest -q --durations=15"
    )
    assert _calls(tmp_path)[-1].strip() == expected
