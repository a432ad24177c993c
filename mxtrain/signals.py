"""Turning SIGTERM/SIGINT into a graceful stop request for the training loop.

The first signal only sets a flag: the loop finishes the batch it is on, saves a checkpoint
of that exact point and exits with the "preempted" code (75). A second SIGINT (Ctrl-C)
raises KeyboardInterrupt at once; a second SIGTERM does the same. Checkpoints are written
atomically, so stopping at any instant never corrupts one.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType, TracebackType
from typing import Any

log = logging.getLogger("mxtrain")

HANDLED = (signal.SIGTERM, signal.SIGINT)


class StopRequests:
    """Context manager that installs the handlers; ``requested()`` is polled by the loop."""

    def __init__(
        self, action: str = "finishing the current batch, then saving a checkpoint"
    ) -> None:
        self._action = action  # what the first signal starts, for the log
        self._event = threading.Event()
        self._previous: dict[int, Any] = {}

    def requested(self) -> bool:
        """True once a stop signal arrived."""
        return self._event.is_set()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self._event.is_set():
            log.warning("%s again: stopping at once", name)
            raise KeyboardInterrupt
        self._event.set()
        log.warning("%s received: %s (press Ctrl-C again to stop at once)", name, self._action)

    def __enter__(self) -> StopRequests:
        # Signal handlers can only be installed from the main thread (tests may train in
        # another one); there, stop requests simply never arrive.
        if threading.current_thread() is threading.main_thread():
            for signum in HANDLED:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
