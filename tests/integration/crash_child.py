"""One mxtrain command in a child process, for the crash-point tests.

The children are forked from a ``multiprocessing`` fork server that has only imported MXNet
(most of a new Python process's start-up here), so each costs a fraction of a second instead
of two. mxtrain itself is imported in the child after ``MXTRAIN_CRASH_AT`` is set, because
the variable is read once, when ``mxtrain.crashpoints`` is imported.
"""

from __future__ import annotations

import os
import sys


def run_command(args: list[str], crash_at: str, cwd: str, output: str) -> None:
    """``mxtrain ARGS`` with ``MXTRAIN_CRASH_AT=crash_at``; stdout and stderr go to ``output``."""
    os.environ["MXTRAIN_CRASH_AT"] = crash_at
    os.environ["OMP_NUM_THREADS"] = "1"
    os.chdir(cwd)
    fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.argv = ["mxtrain", *args]
    from mxtrain.cli import main

    main()
