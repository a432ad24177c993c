"""What every command shares: common options and the error handling that turns mxtrain's errors
into one-paragraph messages and exit codes.

Commands import from here, never from ``cli/main.py`` (which imports every command).
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

import click

from mxtrain.errors import ExitCode, MxtrainError
from mxtrain.option_checks import MAX_SEQUENCE_LENGTH, MAX_TENSOR_ELEMENTS
from mxtrain.registry import plugin_failures_named

F = TypeVar("F", bound=Callable[..., Any])

set_option = click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a config value by dotted key, typed by the schema; repeatable. "
    "Example: --set optimizer.learning_rate=0.5 --set context.ids=[0,1]",
)

progress_option = click.option(
    "--progress",
    type=click.Choice(["auto", "rich", "plain", "quiet"]),
    default="auto",
    show_default=True,
    help="rich: progress bars and an epoch table; plain: one key=value line per log "
    "interval (the default when the output is not a terminal); quiet: warnings and errors "
    "only.",
)
quiet_option = click.option(
    "--quiet", "-q", is_flag=True, help="Same as --progress quiet: warnings and errors only."
)
json_option = click.option(
    "--json",
    "json_events",
    is_flag=True,
    help="Write machine-readable events to stdout, one JSON object per line (start, "
    "interval, eval, checkpoint, epoch_end, early_stop, error, end; see docs/run-folder.md); the "
    "human output goes to stderr.",
)


#: ``--batch-size``: rows of one array, which MXNet 1.9.1 caps at 2**31 - 1 elements
BATCH_SIZE = click.IntRange(min=1, max=MAX_TENSOR_ELEMENTS)
#: ``--bucket``: a sequence length to unroll a model for (mxtrain.run.bucket_keys)
SEQUENCE_LENGTH = click.IntRange(min=1, max=MAX_SEQUENCE_LENGTH)
#: ``--epoch``: epochs completed (0: the checkpoint before training, where one was kept)
EPOCH = click.IntRange(min=0)


def batch_size_override(reads: str, per_batch: str) -> Callable[[F], F]:
    """``--batch-size`` of score and predict: replaces the batch_size of the iterator that
    reads ``reads``; ``per_batch`` says what a batch counts."""
    return click.option(
        "--batch-size",
        type=BATCH_SIZE,
        default=None,
        help=f"Replaces the batch_size of the iterator that reads {reads}: {per_batch}",
    )


def further_runs_option(flag: str, help: str) -> Callable[[F], F]:
    """``--ensemble`` or ``--rerank`` of predict and score: further seq2seq runs decoding
    beside the checkpoint; ``help`` says what the command does with them."""
    return click.option(flag, metavar="RUN[:EPOCH|:best|:TAG]", multiple=True, help=help)


def int8_options(func: F) -> F:
    """``--int8``, ``--calibration-batches`` and ``--calibration-data`` of predict and score."""
    func = click.option(
        "--calibration-data",
        type=click.Path(dir_okay=False),
        default=None,
        help="--int8: measure the ranges on this file (read like the training data) instead "
        "of data.train.",
    )(func)
    func = click.option(
        "--calibration-batches",
        type=click.IntRange(min=1),
        default=None,
        help="--int8: batches of data.train (spread over it) the ranges are measured on "
        "(default 20).",
    )(func)
    return click.option(
        "--int8",
        is_flag=True,
        help="Run the LSTM and FullyConnected layers in int8 (CPU, oneDNN): faster, at a "
        "small cost in accuracy. The first run of a checkpoint measures the value ranges on "
        "training data and keeps them in RUN/int8/ (docs/inference.md).",
    )(func)


def int8_request(int8: bool, batches: int | None, data: str | None) -> Any:
    """The Int8Options of the --int8 flags, None without --int8 (a UsageError when the
    calibration flags come without it)."""
    if not int8:
        for flag, value in (("--calibration-batches", batches), ("--calibration-data", data)):
            if value is not None:
                raise click.UsageError(f"{flag} applies only with --int8.")
        return None
    from pathlib import Path

    from mxtrain.inference.int8 import DEFAULT_CALIBRATION_BATCHES, Int8Options

    return Int8Options(
        calibration_batches=batches if batches is not None else DEFAULT_CALIBRATION_BATCHES,
        calibration_data=Path(data) if data is not None else None,
    )


def length_penalty_option(ranks: str) -> Callable[[F], F]:
    """``--length-penalty`` of predict and score (None: the library's default, 1.0);
    ``ranks`` says what the penalty ranks for the command."""
    return click.option(
        "--length-penalty",
        type=click.FloatRange(min=0),
        default=None,
        help="alpha of the GNMT length penalty ((5 + length) / 6) ** alpha that divides the "
        f"log-probability of an output, ranking {ranks}; 0: none. Default: 1.0 (Sockeye's).",
    )


def progress_mode(progress: str, quiet: bool) -> str:
    """The --progress value, with --quiet winning."""
    return "quiet" if quiet else progress


def handle_errors(func: F) -> F:
    """Turn mxtrain errors into one-paragraph messages and exit codes (no traceback)."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        debug = bool(click.get_current_context().find_root().obj.get("debug"))
        try:
            with plugin_failures_named():  # a plugin's exception is the plugin's, not a bug
                return func(*args, **kwargs)
        except MxtrainError as exc:
            if debug:
                traceback.print_exc()
            label = "stopped" if exc.exit_code == ExitCode.PREEMPTED else "error"
            click.echo(f"{label}: {exc}", err=True)
            sys.exit(int(exc.exit_code))
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)
        except BrokenPipeError:
            # stdout was closed by the reader (`mxtrain list | head`): not an error of ours.
            # Point stdout at /dev/null so Python's exit-time flush does not complain.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            sys.exit(141)
        except (click.exceptions.Exit, click.ClickException, SystemExit):
            raise
        except Exception as exc:  # a bug: say so, keep the message short unless --debug
            if debug:
                traceback.print_exc()
            click.echo(
                f"internal error: {type(exc).__name__}: {exc}. This is a bug in mxtrain or "
                "MXNet; run again with `mxtrain --debug ...` for the traceback and report it.",
                err=True,
            )
            sys.exit(int(ExitCode.INTERNAL))

    return wrapper  # type: ignore[return-value]
