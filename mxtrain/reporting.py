"""What the user sees: one rich Console for log lines and progress, plus the log file.

On a terminal, each epoch gets a progress bar with speed and the running metric; log lines
print above the bars (they share one Console, so lines never tear the bars). When stdout is
not a terminal (shell jobs, CI, ``--progress plain``) each log interval is one plain,
grep-friendly line instead. The run folder's log file always gets everything at debug level.
"""

from __future__ import annotations

import logging
import logging.handlers
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from rich.console import Console
from rich.logging import RichHandler
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

LOGGER_NAME = "mxtrain"
ProgressMode = Literal["auto", "rich", "plain", "quiet"]

log = logging.getLogger(LOGGER_NAME)


def format_metrics(values: Mapping[str, float]) -> str:
    """``perplexity=123.45 accuracy=0.2100`` with a sensible number of digits."""
    parts = []
    for name, value in values.items():
        if isinstance(value, float) and math.isfinite(value) and abs(value) >= 100:
            parts.append(f"{name}={value:.2f}")
        else:
            parts.append(f"{name}={value:.4f}")
    return " ".join(parts)


class Reporter:
    """Routes log records and training progress to the terminal and the log file."""

    def __init__(self, mode: ProgressMode = "auto", *, console: Console | None = None) -> None:
        self.console = console or Console(stderr=False, highlight=False, soft_wrap=True)
        if mode == "auto":
            mode = "rich" if self.console.is_terminal else "plain"
        self.mode = mode
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._file_handler: logging.Handler | None = None
        self._console_handler = self._make_console_handler()
        log.setLevel(logging.DEBUG)
        log.propagate = False
        for handler in list(log.handlers):
            log.removeHandler(handler)
        log.addHandler(self._console_handler)
        # Records logged before the run folder exists (data loading, binding) are kept
        # here and written to the log file once it is attached.
        self._early = logging.handlers.MemoryHandler(
            capacity=10_000, flushLevel=logging.CRITICAL + 1
        )
        self._early.setLevel(logging.DEBUG)
        log.addHandler(self._early)

    def _make_console_handler(self) -> logging.Handler:
        handler: logging.Handler
        if self.mode == "rich":
            handler = RichHandler(
                console=self.console, show_path=False, show_time=True, markup=False
            )
            handler.setFormatter(logging.Formatter("%(message)s", datefmt="[%X]"))
        else:
            # Plain lines go to stdout through the same Console, so ordering with any rich
            # output is preserved; timestamps make shell-job logs useful.
            handler = _ConsoleLineHandler(self.console)
            handler.setFormatter(
                logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%Y-%m-%d %H:%M:%S")
            )
        handler.setLevel(logging.WARNING if self.mode == "quiet" else logging.INFO)
        return handler

    def attach_log_file(self, path: Path) -> None:
        """Also write every record (debug level) to ``path``."""
        handler = logging.FileHandler(path, encoding="utf-8")
        handler.setLevel(logging.DEBUG)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        self._early.setTarget(handler)
        self._early.flush()
        log.removeHandler(self._early)
        log.addHandler(handler)
        self._file_handler = handler

    # progress ---------------------------------------------------------------------------
    def start_epoch(self, epoch: int, num_batches: int | None) -> None:
        """Open the progress display for one epoch (1-based epoch number)."""
        if self.mode != "rich":
            return
        self._progress = Progress(
            TextColumn("epoch {task.fields[epoch]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[speed]}"),
            TextColumn("{task.fields[metrics]}"),
            console=self.console,
            transient=True,
        )
        self._progress.start()
        self._task = self._progress.add_task(
            "train", total=num_batches, epoch=epoch, speed="", metrics=""
        )

    def advance(self, batches: int) -> None:
        """Move the bar by ``batches`` (called once per log interval, not per batch)."""
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, advance=batches)

    def interval(
        self,
        epoch: int,
        batch: int,
        samples_per_s: float,
        tokens_per_s: float | None,
        metrics: Mapping[str, float],
    ) -> None:
        """Report one log interval: a bar update on a terminal, a line otherwise."""
        speed = f"{samples_per_s:,.0f} samples/s"
        if tokens_per_s is not None:
            speed += f" {tokens_per_s:,.0f} tok/s"
        text = format_metrics(metrics)
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, speed=speed, metrics=text)
            log.debug("epoch %d batch %d %s %s", epoch, batch, speed, text)
        else:
            log.info("epoch %d batch %d %s train %s", epoch, batch, speed, text)

    def end_epoch(self) -> None:
        """Close the epoch's progress display."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
            self._task = None

    def close(self) -> None:
        """Stop progress and detach handlers (safe to call twice)."""
        self.end_epoch()
        log.removeHandler(self._early)
        if self._file_handler is not None:
            log.removeHandler(self._file_handler)
            self._file_handler.close()
            self._file_handler = None


class _ConsoleLineHandler(logging.Handler):
    """Writes formatted records as plain lines through a rich Console (no markup, no wrap)."""

    def __init__(self, console: Console) -> None:
        super().__init__()
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.console.print(self.format(record), markup=False, highlight=False, soft_wrap=True)
        except Exception:  # a logging handler must never raise into the training loop
            self.handleError(record)


def print_error(message: str) -> None:
    """Print a user-facing error to stderr as one paragraph."""
    Console(stderr=True, highlight=False, soft_wrap=True).print(
        f"error: {message}", markup=False, style="bold red" if sys.stderr.isatty() else None
    )
