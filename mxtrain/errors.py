"""User-facing errors and the process exit codes they map to.

Every mistake a user can make (bad config, missing file, bad data) is raised as an
``MxtrainError`` subclass carrying a one-paragraph message that says where the problem is
and how to fix it. The CLI prints the message without a traceback and exits with the
error's code. Anything else that escapes is a bug in mxtrain (exit code 1).
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Process exit codes, documented in the README."""

    OK = 0
    INTERNAL = 1  # an unexpected error: a bug in mxtrain or MXNet (run with --debug)
    CONFIG = 2  # bad config file, bad --set override, bad command-line usage
    DATA = 3  # missing, unreadable or unusable data
    DIVERGED = 4  # loss became NaN or infinite
    RUN_FOLDER = 5  # run folder exists / is unusable; nothing was overwritten
    SWEEP_POINTS_FAILED = 6  # sweep: every point ran, some failed (summary.md says which)
    STUCK = 70  # distributed: no progress for kvstore.watchdog_seconds (a peer died or hung)
    PEER_LOST = 71  # launch: a process of the job was killed, or a server/scheduler failed
    PREEMPTED = 75  # stopped by SIGTERM/SIGINT after saving a resumable checkpoint


class MxtrainError(Exception):
    """A problem the user can fix; ``str(error)`` is the whole message."""

    exit_code: int = ExitCode.CONFIG

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message.strip()
        self.hint = hint.strip() if hint else None
        super().__init__(self.render())

    def render(self) -> str:
        """The message and the fix, as one paragraph."""
        if self.hint:
            return f"{self.message} {self.hint}"
        return self.message


class ConfigError(MxtrainError):
    """Invalid configuration: a YAML file, a ``--set`` override or a command-line argument."""

    exit_code = ExitCode.CONFIG


class DataError(MxtrainError):
    """Data that is missing, unreadable, malformed or empty."""

    exit_code = ExitCode.DATA


class RunFolderError(MxtrainError):
    """A run folder that cannot be used as asked (exists, not writable, incomplete)."""

    exit_code = ExitCode.RUN_FOLDER


class DivergedError(MxtrainError):
    """Training produced a non-finite loss."""

    exit_code = ExitCode.DIVERGED


class PreemptedError(MxtrainError):
    """Training stopped on request (SIGTERM/SIGINT) after saving a resumable checkpoint."""

    exit_code = ExitCode.PREEMPTED


class SweepPointsFailed(MxtrainError):
    """A sweep ran every point, and some of them failed (each recorded in its summary)."""

    exit_code = ExitCode.SWEEP_POINTS_FAILED


class PluginError(ConfigError):
    """A user plugin's own code raised (while imported, created or called): exit code 2,
    like every other mistake in what the config names. Built by
    :func:`mxtrain.registry.plugin_failure`, which names the plugin and its file."""


class InvalidValue(ValueError):
    """A value an options class cannot accept; ``key`` is its dotted path inside the section.

    Config sections and built-in component options (models, iterators) raise it from their
    ``__post_init__``; the config loader turns it into a ConfigError at that key's line
    (``model.num_hidden must be ...``). A plugin's options may raise it too; a plain
    ``ValueError`` from a plugin is reported at its section (``model: ...``).
    """

    def __init__(self, key: str, problem: str) -> None:
        self.key = key
        self.problem = problem
        super().__init__(f"{key} {problem}")
