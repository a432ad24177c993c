"""Reporter output (plain lines, table rows, JSON events) and the environment facts."""

from __future__ import annotations

import io
import json
import logging
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from rich.console import Console

from mxtrain.errors import DataError, PreemptedError
from mxtrain.formatting import format_clock
from mxtrain.reporting import EVENT_SCHEMA_VERSION, EventWriter, Reporter
from mxtrain.run import environment

INTERVAL_LINE = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d INFO epoch (?P<epoch>\d+) batch (?P<batch>\d+)/(?P<total>\d+)"
    r"(?P<fields>( [a-z_]+=\S+)+)$"
)


def plain_reporter(**kwargs) -> tuple[Reporter, io.StringIO]:
    out = io.StringIO()
    return Reporter("plain", console=Console(file=out, width=200), **kwargs), out


def fields_of(line: str) -> list[tuple[str, str]]:
    return [tuple(f.split("=", 1)) for f in line.split() if "=" in f]  # type: ignore[misc]


def test_plain_interval_line_is_key_value_in_a_stable_order() -> None:
    reporter, out = plain_reporter()
    reporter.begin_run("fit", Path("runs/x"), num_epoch=3)
    reporter.start_epoch(2, 40)
    reporter.interval(2, 10, 1234.56, 9876.5, {"perplexity": 612.3, "my acc": 0.5}, lr=0.25,
                      seconds=2.0, batches=10)  # fmt: skip
    reporter.interval(2, 20, 100.0, None, {"perplexity": 1.5}, seconds=1.0, batches=10)
    reporter.close()
    lines = out.getvalue().splitlines()
    first = INTERVAL_LINE.match(lines[0])
    assert first is not None, lines[0]
    assert (first["epoch"], first["batch"], first["total"]) == ("2", "10", "40")
    assert fields_of(lines[0]) == [
        ("samples_per_s", "1234.6"),
        ("tokens_per_s", "9876.5"),
        ("lr", "0.25"),
        ("eta_s", "6"),  # 30 batches left at 10 batches per 2 s
        ("train_perplexity", "612.30"),
        ("train_my_acc", "0.5000"),
    ]
    # No token counts (row data): the field is left out, the order of the others unchanged.
    assert [k for k, _ in fields_of(lines[1])] == ["samples_per_s", "eta_s", "train_perplexity"]


def test_epoch_summary_marks_the_best_epoch_for_the_watched_metric() -> None:
    reporter, out = plain_reporter()
    reporter.begin_run("fit", Path("r"), num_epoch=3, best_metric="accuracy", lower_is_better=False)
    for epoch, acc in [(1, 0.5), (2, 0.4), (3, 0.7)]:
        reporter.epoch_summary(
            epoch,
            seconds=1.0,
            samples_per_s=10.0,
            tokens_per_s=None,
            train={"accuracy": acc},
            eval={"accuracy": acc},
            lr=0.1,
            checkpoint=f"e{epoch:04d}-b000000",
        )
    reporter.close()
    done = [line for line in out.getvalue().splitlines() if " done " in line]
    assert ["best=*" in line for line in done] == [True, False, True]
    assert "checkpoint=e0002-b000000" in done[1]
    assert "best: epoch 3 eval accuracy=0.7000" in out.getvalue()


def test_rich_mode_prints_table_rows_and_keeps_plain_lines_for_the_file(tmp_path: Path) -> None:
    out = io.StringIO()
    reporter = Reporter("rich", console=Console(file=out, width=120, force_terminal=True))
    reporter.attach_log_file(tmp_path / "train.log")
    reporter.begin_run("fit", tmp_path, num_epoch=2, best_metric="perplexity")
    for epoch, ppl in [(1, 50.0), (2, 60.0)]:
        reporter.start_epoch(epoch, 10)
        reporter.interval(epoch, 5, 100.0, 200.0, {"perplexity": ppl}, seconds=1.0, batches=5)
        reporter.epoch_summary(
            epoch,
            seconds=2.0,
            samples_per_s=100.0,
            tokens_per_s=200.0,
            train={"perplexity": ppl},
            eval={"perplexity": ppl},
            lr=0.5,
        )
    reporter.close()
    screen = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    rows = [line for line in screen.splitlines() if re.match(r"^[12]/2 ", line)]
    assert len(rows) == 2 and "50.0000 *" in rows[0] and "*" not in rows[1]
    assert screen.count("train perplexity") == 1  # one header for rows of the same columns
    assert "batch 5/10" not in screen  # interval lines are bar updates on a terminal...
    log_text = (tmp_path / "train.log").read_text()
    assert "epoch 1 batch 5/10" in log_text and "epoch 2 done" in log_text  # ...and in the file


def test_quiet_mode_shows_warnings_only() -> None:
    out = io.StringIO()
    reporter = Reporter("quiet", console=Console(file=out, width=120))
    logging.getLogger("mxtrain").info("hidden")
    logging.getLogger("mxtrain").warning("shown")
    reporter.close()
    assert "hidden" not in out.getvalue() and "shown" in out.getvalue()


def test_events_are_json_lines_with_time_and_schema_version() -> None:
    stream = io.StringIO()
    EventWriter(stream).emit("interval", epoch=1, train={"perplexity": float("nan")}, run=Path("r"))
    record = json.loads(stream.getvalue())  # strict JSON: NaN became null
    assert record["event"] == "interval" and record["schema_version"] == EVENT_SCHEMA_VERSION
    assert isinstance(record["time"], float) and record["train"] == {"perplexity": None}
    assert record["run"] == "r"


def test_a_closed_event_stream_does_not_stop_training() -> None:
    class Closed(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError

    writer = EventWriter(Closed())
    writer.emit("start")
    writer.emit("end")  # no exception, and no second attempt


def run_session(error: BaseException | None) -> list[dict]:
    """The events of one ``Reporter.session`` whose body raises ``error`` (if any)."""
    stream = io.StringIO()
    reporter = Reporter(
        "quiet", console=Console(file=io.StringIO()), json_events=True, event_stream=stream
    )
    try:
        with reporter.session("fit"):
            reporter.begin_run("fit", Path("runs/a"), num_epoch=1)
            if error is not None:
                raise error
    except BaseException as exc:
        assert exc is error  # the session reports errors but never swallows them
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_session_ends_with_end_event_and_reports_errors_before_it() -> None:
    ok = run_session(None)
    assert [e["event"] for e in ok] == ["start", "end"]
    assert ok[-1]["status"] == "finished" and ok[-1]["exit_code"] == 0
    assert ok[-1]["run"] == "runs/a"

    failed = run_session(DataError("no such file x.txt", hint="check data.train.source"))
    assert [e["event"] for e in failed] == ["start", "error", "end"]
    assert failed[1]["type"] == "DataError" and failed[1]["exit_code"] == 3
    assert failed[1]["hint"] == "check data.train.source"
    assert failed[2]["status"] == "failed" and failed[2]["exit_code"] == 3

    stopped = run_session(PreemptedError("stopped on request"))
    assert [e["event"] for e in stopped] == ["start", "end"]
    assert stopped[-1]["status"] == "preempted" and stopped[-1]["exit_code"] == 75

    bug = run_session(RuntimeError("boom"))
    assert bug[1]["event"] == "error" and bug[2]["exit_code"] == 1


def test_format_clock() -> None:
    assert format_clock(3725.4) == "1:02:05"
    assert format_clock(None) == "-:--:--"


# environment facts ------------------------------------------------------------------------


def test_relevant_env_keeps_thread_and_library_settings_only() -> None:
    environ = {"OMP_NUM_THREADS": "2", "MXNET_ENGINE_TYPE": "NaiveEngine", "HOME": "/root",
               "OPENBLAS_CORETYPE": "Haswell", "AWS_SECRET": "x"}  # fmt: skip
    assert environment.relevant_env(environ) == {
        "MXNET_ENGINE_TYPE": "NaiveEngine",
        "OMP_NUM_THREADS": "2",
        "OPENBLAS_CORETYPE": "Haswell",
    }


def _git(folder: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(folder), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return done.stdout.strip()


def test_git_state_of_a_work_tree_clean_then_dirty(tmp_path: Path) -> None:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    _git(tmp_path, "init", "-q")
    (tmp_path / "train.py").write_text("print(1)\n")
    _git(tmp_path, "add", "train.py")
    _git(tmp_path, "commit", "-q", "-m", "first")
    head = _git(tmp_path, "rev-parse", "HEAD")
    (tmp_path / "sub").mkdir()
    (tmp_path / "untracked.txt").write_text("runs and outputs do not make a tree dirty")
    state = environment.git_state(tmp_path / "sub")
    assert state == {"commit": head, "dirty": False, "root": str(tmp_path.resolve())}
    (tmp_path / "train.py").write_text("print(2)\n")
    assert environment.git_state(tmp_path)["dirty"] is True  # type: ignore[index]


def test_git_state_is_none_outside_a_repo_or_without_git(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert environment.git_state(tmp_path) is None
    monkeypatch.setenv("PATH", str(tmp_path))  # no git executable anywhere
    assert environment.git_state(Path.cwd()) is None


def test_collect_has_the_facts_and_logs_them(caplog: pytest.LogCaptureFixture) -> None:
    facts = environment.collect(contexts=["cpu(0)"], seed=7, threads={"OMP_NUM_THREADS": "1"})
    for key in ("mxtrain", "mxnet", "numpy", "python", "platform", "cpu_count", "env", "seed"):
        assert key in facts, key
    assert facts["seed"] == 7 and facts["contexts"] == ["cpu(0)"]
    # every figure names the CPU and the instruction set its kernels used
    assert facts["cpu"] and facts["isa"] in ("AVX-512", "AVX2", "no AVX2")
    assert facts["isa"] in environment.describe(facts)
    json.dumps(facts)  # run.json must be able to hold it
    logger = logging.getLogger("test_envinfo")
    with caplog.at_level(logging.DEBUG, logger="test_envinfo"):
        environment.log_facts(facts, logger=logger)
    assert "seed 7" in caplog.records[0].getMessage()
    assert any(r.levelno == logging.DEBUG and "threads.OMP_NUM_THREADS" in r.getMessage()
               for r in caplog.records)  # fmt: skip
