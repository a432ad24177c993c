"""PrefetchIter: order, errors, reset, close, read-ahead."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import threading
import time
import traceback
from typing import Any

import mxnet as mx
import numpy as np
import pytest

from mxtrain.engine.prefetch import PrefetchIter


class CountingIter(mx.io.DataIter):
    """Yields batches 0..n-1 (data = batch index); optionally fails at batch ``fail_at``."""

    def __init__(self, n: int = 5, fail_at: int | None = None) -> None:
        super().__init__(batch_size=2)
        self.n = n
        self.fail_at = fail_at
        self.pos = 0
        self.produced = 0
        self.resets = 0
        self.vocab = {"a": 1}

    @property
    def provide_data(self) -> list[Any]:
        return [mx.io.DataDesc("data", (2, 3))]

    @property
    def provide_label(self) -> list[Any]:
        return [mx.io.DataDesc("label", (2, 3))]

    @property
    def default_bucket_key(self) -> int:
        return 3

    def reset(self) -> None:
        self.pos = 0
        self.resets += 1

    def next(self) -> Any:
        if self.pos >= self.n:
            raise StopIteration
        if self.pos == self.fail_at:
            self._explode()
        i = self.pos
        self.pos += 1
        self.produced += 1
        return mx.io.DataBatch([mx.nd.full((2, 3), i)], [mx.nd.zeros((2, 3))], bucket_key=3)

    def _explode(self) -> None:
        raise ValueError(f"broken batch {self.pos}")


def ids(it: Any) -> list[int]:
    return [int(b.data[0].asnumpy()[0, 0]) for b in it]


_EARLIER: set[threading.Thread] = set()


def prefetch_threads() -> list[threading.Thread]:
    """Live prefetch workers started by the current test (other tests' leaks don't count)."""
    return [t for t in threading.enumerate() if t.name == "mxtrain-prefetch" and t not in _EARLIER]


@pytest.fixture(autouse=True)
def _ignore_earlier_threads() -> None:
    _EARLIER.clear()
    _EARLIER.update(t for t in threading.enumerate() if t.name == "mxtrain-prefetch")


def test_order_preserved_over_epochs() -> None:
    with PrefetchIter(CountingIter(7), depth=3) as it:
        assert ids(it) == list(range(7))
        with pytest.raises(StopIteration):
            it.next()
        it.reset()
        assert ids(it) == list(range(7))
    assert not prefetch_threads()


def test_same_batches_as_ndarrayiter() -> None:
    data = np.arange(40, dtype=np.float32).reshape(10, 4)
    plain = mx.io.NDArrayIter(data, np.arange(10), batch_size=3, last_batch_handle="pad")
    expected = [(b.data[0].asnumpy(), b.pad) for b in plain]
    plain.reset()
    with PrefetchIter(plain) as it:
        got = [(b.data[0].asnumpy(), b.pad) for b in it]
    assert len(got) == len(expected) == 4
    for (g, gp), (e, ep) in zip(got, expected, strict=True):
        np.testing.assert_array_equal(g, e)
        assert gp == ep


def test_worker_exception_reraised_with_traceback() -> None:
    inner = CountingIter(5, fail_at=2)
    it = PrefetchIter(inner)
    assert it.next() is not None and it.next() is not None
    with pytest.raises(ValueError, match="broken batch 2") as err:
        it.next()
    frames = [f.name for f in traceback.extract_tb(err.value.__traceback__)]
    assert "_explode" in frames  # raised in the worker, not re-created
    with pytest.raises(StopIteration):
        it.next()
    assert not prefetch_threads()  # the worker finished after handing over the error
    inner.fail_at = None
    it.reset()
    assert ids(it) == list(range(5))
    it.close()


def test_reset_mid_epoch_restarts_cleanly() -> None:
    inner = CountingIter(6)
    it = PrefetchIter(inner, depth=2)
    assert [int(it.next().data[0].asnumpy()[0, 0]) for _ in range(2)] == [0, 1]
    it.reset()
    assert inner.resets == 1
    assert len(prefetch_threads()) == 0  # stopped; restarts on demand
    assert ids(it) == list(range(6))
    for _ in range(3):  # repeated resets never leak threads
        it.reset()
        it.next()
        assert len(prefetch_threads()) == 1
    it.close()
    assert not prefetch_threads()


def test_close_joins_thread_and_is_idempotent() -> None:
    it = PrefetchIter(CountingIter(100), depth=2)
    it.next()
    (thread,) = prefetch_threads()
    assert thread.daemon
    it.close()
    assert not thread.is_alive()
    it.close()
    with pytest.raises(RuntimeError, match="closed"):
        it.next()


def test_reads_ahead_up_to_depth() -> None:
    inner = CountingIter(50)
    it = PrefetchIter(inner, depth=3)
    it.next()
    # one returned + three queued + one waiting in the worker's hands
    deadline = time.monotonic() + 60  # generous: the worker thread may wait for a busy core
    while inner.produced < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert inner.produced == 5
    time.sleep(0.2)
    assert inner.produced == 5  # bounded
    it.close()


def test_prepare_runs_on_consumer_thread_in_order() -> None:
    seen: list[tuple[int, str]] = []

    def prepare(batch: Any) -> None:
        seen.append((int(batch.data[0].asnumpy()[0, 0]), threading.current_thread().name))

    with PrefetchIter(CountingIter(4), prepare=prepare) as it:
        assert ids(it) == [0, 1, 2, 3]
    me = threading.current_thread().name
    assert seen == [(i, me) for i in range(4)]


def test_attributes_pass_through() -> None:
    inner = CountingIter()
    it = PrefetchIter(inner)
    assert it.provide_data == inner.provide_data
    assert it.provide_label == inner.provide_label
    assert it.default_bucket_key == 3
    assert it.batch_size == 2
    assert it.vocab == {"a": 1}
    with pytest.raises(AttributeError):
        _ = it.no_such_attribute
    with pytest.raises(ValueError):
        PrefetchIter(inner, depth=0)
