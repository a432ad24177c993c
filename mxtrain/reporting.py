"""What the user sees: one rich Console for log lines and progress, JSON events, the log file.

On a terminal, each epoch gets a progress bar (batches, samples/s, tokens/s, ETA, the
running metric) and each finished epoch one row of a summary table; log lines print above
the bars because they share one Console, so lines never tear the bars. When the output is
not a terminal (shell jobs, CI, ``--progress plain``) each log interval is one plain,
grep-friendly line instead: a fixed head (``epoch 1 batch 100/1320``) followed by
``key=value`` fields in a stable order. ``--json`` writes one JSON object per event to
stdout (see :data:`EVENT_TYPES`) and moves the human output to stderr. The run folder's log
file always gets everything at debug level, whatever the terminal shows.

Everything here runs once per log interval or epoch, never per batch.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import math
import re
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, TextIO

from rich import box
from rich.console import Console
from rich.logging import RichHandler
from rich.progress import (
    BarColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Column, Table

from mxtrain.errors import ExitCode, MxtrainError, PreemptedError
from mxtrain.formatting import format_clock
from mxtrain.metric_tracker import MetricTracker
from mxtrain.registry import plugin_failures_named

LOGGER_NAME = "mxtrain"
ProgressMode = Literal["auto", "rich", "plain", "quiet"]

#: Version of the ``--json`` event format; bumped when a field changes meaning or goes away.
EVENT_SCHEMA_VERSION = 1
#: Every event ``--json`` writes, in the order a run produces them (the middle ones repeat).
EVENT_TYPES = (
    "start",
    "interval",
    "eval",
    "checkpoint",
    "epoch_end",
    "early_stop",
    "error",
    "end",
)

log = logging.getLogger(LOGGER_NAME)

# A log record carrying ``extra={"console": False}`` goes to the log file only: the terminal
# shows the same information another way (a bar update, a table row).
_FILE_ONLY: dict[str, Any] = {"console": False}


def format_metrics(values: Mapping[str, float]) -> str:
    """``perplexity=123.45 accuracy=0.2100`` with a sensible number of digits."""
    return " ".join(f"{name}={_number(value)}" for name, value in values.items())


def _number(value: Any) -> str:
    if isinstance(value, float) and math.isfinite(value) and abs(value) >= 100:
        return f"{value:.2f}"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def _key(name: str) -> str:
    """A metric name usable as the key of a ``key=value`` field (no spaces or '=')."""
    return re.sub(r"[\s=]+", "_", name)


def _json_safe(value: Any) -> Any:
    """Non-finite floats become null: strict JSON parsers (jq, most languages) reject NaN."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


class EventWriter:
    """Writes ``--json`` events as JSON Lines, each flushed at once so a reader sees it."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream
        self._broken = False

    def emit(self, event: str, **fields: Any) -> None:
        """Write one event: ``{"event", "time", "schema_version", ...fields}``."""
        if self._broken:
            return
        record = {
            "event": event,
            "time": round(time.time(), 3),
            "schema_version": EVENT_SCHEMA_VERSION,
            **_json_safe(fields),
        }
        stream = self._stream or sys.stdout
        try:
            stream.write(json.dumps(record) + "\n")
            stream.flush()
        except (BrokenPipeError, ValueError):
            # The reader went away (or closed the stream): training goes on without events.
            self._broken = True
            log.warning("the --json event stream was closed; no further events are written")


class Reporter:
    """Routes log records, progress and events to the terminal, stdout and the log file.

    ``mode`` picks the human output: ``rich`` bars and tables, ``plain`` lines, ``quiet``
    (warnings and errors only) or ``auto`` (rich on a terminal, plain otherwise). With
    ``json_events`` the events go to stdout and the human output to stderr.
    """

    def __init__(
        self,
        mode: ProgressMode = "auto",
        *,
        console: Console | None = None,
        json_events: bool = False,
        event_stream: TextIO | None = None,
    ) -> None:
        self.console = console or Console(stderr=json_events, highlight=False, soft_wrap=True)
        if mode == "auto":
            mode = "rich" if self.console.is_terminal else "plain"
        self.mode = mode
        self.events = EventWriter(event_stream) if json_events else None
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._num_batches: int | None = None
        self._num_epoch: int | None = None
        self._best: MetricTracker | None = None  # the watched metric (begin_run)
        self._table_columns: tuple[str, ...] | None = None
        self._outcome: dict[str, Any] = {}
        self._best_reported = False
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
            # Plain lines go through the same Console, so ordering with any rich output is
            # preserved; timestamps make shell-job logs useful.
            handler = _ConsoleLineHandler(self.console)
            handler.setFormatter(
                logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%Y-%m-%d %H:%M:%S")
            )
        handler.setLevel(logging.WARNING if self.mode == "quiet" else logging.INFO)
        handler.addFilter(lambda record: getattr(record, "console", True))
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

    def _emit(self, event: str, **fields: Any) -> None:
        if self.events is not None:
            self.events.emit(event, **fields)

    # run lifecycle ----------------------------------------------------------------------
    @contextmanager
    def session(self, command: str) -> Iterator[Reporter]:
        """Wrap one command: on the way out, emit ``error`` (if any) and ``end`` events.

        ``end`` always comes last, with ``status`` finished/failed/preempted/interrupted
        and the ``exit_code`` the process is about to return. Exceptions propagate.
        """
        started = time.time()

        def end(status: str, exit_code: int) -> None:
            self.close()
            self._emit(
                "end",
                command=command,
                status=status,
                exit_code=exit_code,
                duration_s=round(time.time() - started, 3),
                **self._outcome,
            )

        try:
            with plugin_failures_named():  # reported as the plugin's error, not an internal one
                yield self
        except PreemptedError as exc:
            end("preempted", int(exc.exit_code))
            raise
        except MxtrainError as exc:
            self._emit(
                "error",
                type=type(exc).__name__,
                message=exc.message,
                hint=exc.hint,
                exit_code=int(exc.exit_code),
            )
            end("failed", int(exc.exit_code))
            raise
        except KeyboardInterrupt:
            end("interrupted", 130)
            raise
        except Exception as exc:
            self._emit(
                "error",
                type=type(exc).__name__,
                message=str(exc),
                hint="an internal error; run with `mxtrain --debug` for the traceback",
                exit_code=int(ExitCode.INTERNAL),
            )
            end("failed", int(ExitCode.INTERNAL))
            raise
        else:
            end("finished", 0)

    def begin_run(
        self,
        command: str,
        run_path: Path,
        *,
        num_epoch: int,
        best_metric: str | None = None,
        lower_is_better: bool = True,
        best_so_far: Mapping[str, Any] | None = None,
        **fields: Any,
    ) -> None:
        """Training is about to start: remember what the summaries need, emit ``start``.

        ``best_metric`` is the eval metric whose best epoch gets the ``*`` mark;
        ``best_so_far`` (``{"value", "epoch"}``) carries it over a resume. Other
        ``fields`` (environment, resumed_from, ...) go into the start event as they are.
        """
        self._num_epoch = num_epoch
        self._best = MetricTracker(best_metric, lower_is_better) if best_metric else None
        if self._best is not None and best_so_far and best_so_far.get("value") is not None:
            self._best.best = float(best_so_far["value"])
            self._best.epoch = best_so_far.get("epoch")
        self._outcome["run"] = str(run_path)
        self._emit(
            "start",
            command=command,
            run=str(run_path),
            num_epoch=num_epoch,
            best_metric=best_metric,
            **fields,
        )

    # progress ---------------------------------------------------------------------------
    def start_epoch(self, epoch: int, num_batches: int | None) -> None:
        """Open the progress display for one epoch (1-based epoch number)."""
        self._num_batches = num_batches
        if self.mode != "rich":
            return
        self.end_epoch()
        of_epochs = f"/{self._num_epoch}" if self._num_epoch else ""
        # Text columns that can grow (metrics) are cut with an ellipsis rather than wrapped,
        # so a narrow terminal still gets one line per bar.
        self._progress = Progress(
            TextColumn(f"epoch {epoch}{of_epochs}"),
            BarColumn(bar_width=30),
            TextColumn("{task.completed}/{task.fields[total_text]}"),
            TimeElapsedColumn(),
            TextColumn("eta {task.fields[eta]}"),
            TextColumn("{task.fields[speed]}"),
            TextColumn(
                "{task.fields[metrics]}", table_column=Column(no_wrap=True, overflow="ellipsis")
            ),
            console=self.console,
            transient=True,
            refresh_per_second=4,  # the numbers change once per log interval anyway
        )
        self._progress.start()
        self._task = self._progress.add_task(
            "train",
            total=num_batches,
            total_text=num_batches if num_batches is not None else "?",
            eta=format_clock(None),
            speed="",
            metrics="",
        )

    def interval(
        self,
        epoch: int,
        batch: int,
        samples_per_s: float,
        tokens_per_s: float | None,
        metrics: Mapping[str, float],
        *,
        lr: float | None = None,
        seconds: float | None = None,
        batches: int | None = None,
    ) -> None:
        """Report one log interval: a bar update on a terminal, a line otherwise.

        ``batches`` trained in ``seconds`` give the epoch's ETA (the speed of this interval).
        """
        eta_s = None
        if self._num_batches is not None and seconds is not None and batches:
            eta_s = max(self._num_batches - batch, 0) * seconds / batches
        of_total = f"/{self._num_batches}" if self._num_batches is not None else ""
        fields = [f"samples_per_s={samples_per_s:.1f}"]
        if tokens_per_s is not None:
            fields.append(f"tokens_per_s={tokens_per_s:.1f}")
        if lr is not None:
            fields.append(f"lr={lr:.6g}")
        if eta_s is not None:
            fields.append(f"eta_s={eta_s:.0f}")
        fields += [f"train_{_key(k)}={_number(v)}" for k, v in metrics.items()]
        line = f"epoch {epoch} batch {batch}{of_total} " + " ".join(fields)
        if self._progress is not None and self._task is not None:
            speed = f"{samples_per_s:,.0f} samples/s"
            if tokens_per_s is not None:
                speed += f" {tokens_per_s:,.0f} tok/s"
            self._progress.update(
                self._task,
                completed=batch,
                speed=speed,
                eta=format_clock(eta_s),
                metrics=format_metrics(metrics),
            )
            log.info(line, extra=_FILE_ONLY)
        else:
            log.info(line)
        self._emit(
            "interval",
            epoch=epoch,
            batch=batch,
            num_batches=self._num_batches,
            samples_per_s=round(samples_per_s, 2),
            tokens_per_s=None if tokens_per_s is None else round(tokens_per_s, 2),
            lr=lr,
            eta_s=None if eta_s is None else round(eta_s, 1),
            train=dict(metrics),
        )

    def evaluation(
        self,
        epoch: int,
        batch: int,
        values: Mapping[str, float],
        seconds: float,
        *,
        at_epoch_end: bool = False,
    ) -> None:
        """Report an evaluation (inside an epoch, or the one at its end).

        The terminal shows an epoch-end evaluation in the epoch summary, so its own line
        goes to the log file only.
        """
        fields = [f"seconds={seconds:.2f}"]
        fields += [f"eval_{_key(k)}={_number(v)}" for k, v in values.items()]
        extra = _FILE_ONLY if at_epoch_end else None
        log.info("epoch %d batch %d eval %s", epoch, batch, " ".join(fields), extra=extra)
        self._emit("eval", epoch=epoch, batch=batch, eval=dict(values), seconds=round(seconds, 3))

    def checkpoint(self, tag: str, *, epoch: int, batch: int, path: Path, best: bool) -> None:
        """Report a saved checkpoint (``epoch`` epochs done, ``batch`` batches into the next)."""
        log.debug("saved checkpoint %s%s", tag, " (best)" if best else "")
        self._emit("checkpoint", tag=tag, epoch=epoch, batch=batch, path=str(path), best=best)

    def end_epoch(self) -> None:
        """Close the epoch's progress display."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
            self._task = None

    def epoch_summary(
        self,
        epoch: int,
        *,
        seconds: float,
        samples_per_s: float,
        tokens_per_s: float | None,
        train: Mapping[str, float],
        eval: Mapping[str, float] | None,
        lr: float | None,
        checkpoint: str | None = None,
        partial: bool = False,
    ) -> None:
        """Report a finished epoch: a table row on a terminal, a plain line otherwise.

        The epoch whose eval value of the watched metric is the best so far is marked
        ``*`` (``best=*`` in plain lines).
        """
        self.end_epoch()
        is_best = self._is_best(epoch, eval)
        fields = [f"seconds={seconds:.2f}", f"samples_per_s={samples_per_s:.1f}"]
        if tokens_per_s is not None:
            fields.append(f"tokens_per_s={tokens_per_s:.1f}")
        if lr is not None:
            fields.append(f"lr={lr:.6g}")
        fields += [f"train_{_key(k)}={_number(v)}" for k, v in train.items()]
        fields += [f"eval_{_key(k)}={_number(v)}" for k, v in (eval or {}).items()]
        if partial:
            fields.append("partial=yes")
        if checkpoint is not None:
            fields.append(f"checkpoint={checkpoint}")
        if is_best:
            fields.append("best=*")
        line = f"epoch {epoch} done " + " ".join(fields)
        if self.mode == "rich":
            log.info(line, extra=_FILE_ONLY)
            self._print_table_row(epoch, seconds, train, eval, lr, partial, is_best)
        else:
            log.info(line)
        self._outcome.update(epochs_done=epoch, final_eval=dict(eval) if eval else None)
        self._outcome["best"] = self._best_so_far()
        self._emit(
            "epoch_end",
            epoch=epoch,
            partial=partial,
            seconds=round(seconds, 3),
            samples_per_s=round(samples_per_s, 2),
            tokens_per_s=None if tokens_per_s is None else round(tokens_per_s, 2),
            lr=lr,
            train=dict(train),
            eval=dict(eval) if eval is not None else None,
            checkpoint=checkpoint,
            best=is_best,
            best_so_far=self._best_so_far(),
        )

    def _is_best(self, epoch: int, values: Mapping[str, float] | None) -> bool:
        """Record one evaluation of the watched metric; True when it is the best so far."""
        if self._best is None or not values or self._best.metric not in values:
            return False
        return self._best.update(values[self._best.metric], epoch)

    def _best_so_far(self) -> dict[str, Any] | None:
        return self._best.summary() if self._best is not None else None

    def _print_table_row(
        self,
        epoch: int,
        seconds: float,
        train: Mapping[str, float],
        eval: Mapping[str, float] | None,
        lr: float | None,
        partial: bool,
        is_best: bool,
    ) -> None:
        """One row of the epoch summary table; the header again whenever the columns change."""
        names = (
            "epoch",
            *(f"train {k}" for k in train),
            *(f"eval {k}" for k in eval or {}),
            "lr",
            "time",
        )
        show_header = names != self._table_columns
        self._table_columns = names
        # Every row is its own Table with the same fixed column widths, so rows printed an
        # epoch apart line up under one header.
        table = Table(
            box=box.SIMPLE_HEAD,
            show_header=show_header,
            show_edge=False,
            pad_edge=False,
            header_style="bold",
        )
        for index, name in enumerate(names):
            table.add_column(
                name, justify="left" if index == 0 else "right", width=max(len(name), 10)
            )
        best_metric = self._best.metric if self._best is not None else None
        cells = [f"{epoch}/{self._num_epoch}" + (" part" if partial else "")]
        cells += [_number(v) for v in train.values()]
        for name, value in (eval or {}).items():
            mark = " *" if is_best and name == best_metric else "  "
            cells.append(_number(value) + mark)
        cells += [f"{lr:.4g}" if lr is not None else "-", format_clock(seconds)]
        table.add_row(*cells)
        self.console.print(table)

    def early_stop(self, epoch: int, reason: str, message: str) -> None:
        """Report that training ends before fit.num_epoch (``reason``: the config key's name)."""
        log.info("training ends early: %s", message)
        self._outcome["stop_reason"] = reason
        self._emit("early_stop", epoch=epoch, reason=reason, message=message)

    def close(self) -> None:
        """Stop progress and detach handlers (safe to call twice)."""
        self.end_epoch()
        best = self._best_so_far()
        if best is not None and not self._best_reported:
            self._best_reported = True
            log.info(
                "best: epoch %s eval %s=%s", best["epoch"], best["metric"], _number(best["value"])
            )
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
