"""Build batches in a background thread while the model computes.

Python-side batch building (bucketing, padding, ``mx.nd.array`` copies) otherwise runs between
two ``forward`` calls and leaves the engine idle. ``PrefetchIter`` keeps up to ``depth`` batches
ready.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["PrefetchIter"]

_POLL_S = 0.05  # how often blocked puts/gets look at the stop flag and the worker's health


class _End:
    """Marks the end of the wrapped iterator's epoch."""


class _Failure:
    """Carries an exception raised by the wrapped iterator to the consumer."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class PrefetchIter:
    """Wrap a DataIter (or any iterator of batches) and prefetch ``depth`` batches.

    ``next()``, iteration, ``reset()`` and ``close()`` behave like the wrapped iterator's.
    An exception raised by the wrapped iterator is re-raised by ``next()`` with its original
    traceback. ``prepare(batch)``, if given, is called on the consumer's thread just before a
    batch is returned (binding executors is not thread-safe in MXNet, so it never runs in the
    worker). Other attributes (``provide_data``, ``default_bucket_key``, ...) come from the
    wrapped iterator.

    The worker reads ahead: when a consumer stops early, the wrapped iterator has advanced up to
    ``depth`` batches further than what was consumed.
    """

    def __init__(
        self,
        data_iter: Any,
        depth: int = 2,
        prepare: Callable[[Any], None] | None = None,
    ) -> None:
        if depth < 1:
            raise ValueError(f"prefetch depth must be at least 1, got {depth}")
        self._iter = data_iter
        self._depth = depth
        self._prepare = prepare
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._finished = False  # the current epoch ended (or failed) for the consumer
        self._closed = False

    # -- pass-through -----------------------------------------------------------------------

    @property
    def provide_data(self) -> Any:
        return self._iter.provide_data

    @property
    def provide_label(self) -> Any:
        return self._iter.provide_label

    @property
    def default_bucket_key(self) -> Any:
        return self._iter.default_bucket_key

    @property
    def batch_size(self) -> Any:
        return self._iter.batch_size

    def __getattr__(self, name: str) -> Any:
        # only called for attributes not found on the wrapper itself
        inner = self.__dict__.get("_iter")
        if inner is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(inner, name)

    # -- worker -----------------------------------------------------------------------------

    def _start(self) -> None:
        self._stop.clear()
        self._queue = queue.Queue(maxsize=self._depth)
        self._thread = threading.Thread(
            target=self._work,
            args=(self._iter, self._queue, self._stop),
            name="mxtrain-prefetch",
            daemon=True,  # never keeps the interpreter alive; close() still joins it
        )
        self._thread.start()

    @staticmethod
    def _work(it: Any, out: queue.Queue[Any], stop: threading.Event) -> None:
        while not stop.is_set():
            item: Any
            try:
                item = next(it)
            except StopIteration:
                item = _End()
            except BaseException as exc:  # handed to the consumer as is
                item = _Failure(exc)
            while not stop.is_set():
                try:
                    out.put(item, timeout=_POLL_S)
                    break
                except queue.Full:
                    continue
            if isinstance(item, _End | _Failure):
                return

    def _stop_worker(self) -> None:
        thread = self._thread
        if thread is None:
            return
        self._stop.set()
        # the worker may be blocked on a full queue: it polls the stop flag, draining helps it
        # notice sooner
        while thread.is_alive():
            try:
                while True:
                    self._queue.get_nowait()
            except queue.Empty:
                pass
            thread.join(timeout=_POLL_S)
        self._thread = None

    # -- iterator protocol ------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        return self.next()

    def next(self) -> Any:
        """The next batch; ``StopIteration`` at the end of the epoch."""
        if self._closed:
            raise RuntimeError("PrefetchIter is closed")
        if self._finished:
            raise StopIteration
        if self._thread is None:
            self._start()
        thread = self._thread
        assert thread is not None
        while True:
            try:
                item = self._queue.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not thread.is_alive() and self._queue.empty():
                    self._finished = True
                    raise RuntimeError("prefetch worker stopped without a result") from None
        if isinstance(item, _End):
            self._finished = True
            self._join()
            raise StopIteration
        if isinstance(item, _Failure):
            self._finished = True
            self._join()
            # the exception object carries the worker's traceback; raising it appends ours
            raise item.exc
        if self._prepare is not None:
            self._prepare(item)
        return item

    def _join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def reset(self) -> None:
        """Stop the worker, reset the wrapped iterator, start again on the next ``next()``."""
        if self._closed:
            raise RuntimeError("PrefetchIter is closed")
        self._stop_worker()
        self._iter.reset()
        self._finished = False

    def close(self) -> None:
        """Stop and join the worker thread. Safe to call more than once."""
        self._stop_worker()
        self._closed = True

    def __enter__(self) -> PrefetchIter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # best effort without joining: the daemon worker exits at its next stop-flag check
        stop = self.__dict__.get("_stop")
        if stop is not None:
            stop.set()
