"""Making freed memory go back to the operating system (glibc's malloc only).

glibc serves allocations below its mmap threshold from heaps it keeps, and raises that
threshold (up to 32 MiB) each time a larger mmapped block is freed. Executors unbound for
``bucket_memory`` free hundreds of such blocks; kept in the heaps, they stay in the
process's resident memory and fragment, so the memory bound would hold on paper only.
A fixed threshold and trim limit make large blocks come from mmap and go back on free.

The price is paid by every large temporary from then on (a oneDNN backward allocates one
of batch x vocabulary floats per batch on the word LM: a few percent of its speed), so the
module switches only for a bound the user set, when it first unbinds a bucket. Under the
default bound it only trims the heaps after unbinding (:func:`trim_heaps`), which returns
their free pages at no cost per batch but leaves what fragmentation keeps.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from collections.abc import Callable

_LOG = logging.getLogger(__name__)

# mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_MMAP_MAX = -4
M_ARENA_MAX = -8
#: blocks from this size up are mmapped and unmapped when freed
MMAP_THRESHOLD = 128 * 1024

_done = False


@functools.cache  # loaded once: trim_heaps runs at every unbinding
def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


@functools.cache
def mallopt() -> Callable[[int, int], int] | None:
    """glibc's ``mallopt(parameter, value)`` (nonzero on success), or None where the C
    library has none."""
    function = getattr(_libc(), "mallopt", None)
    if function is None:
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int]
    function.restype = ctypes.c_int
    return function


def trim_heaps() -> bool:
    """Give the free pages of glibc's heaps back to the system (``malloc_trim``); False
    where the C library has no such call."""
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None)
    if trim is None:
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    trim(0)
    return True


def return_freed_memory() -> bool:
    """Fix glibc's mmap and trim thresholds for this process (once); False where the C
    library is not glibc or refuses, which leaves the allocator as it was."""
    global _done
    if _done:
        return True
    set_option = mallopt()
    if set_option is None:
        _LOG.debug("no mallopt in the C library: freed memory stays with the allocator")
        return False
    ok = bool(set_option(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        set_option(M_TRIM_THRESHOLD, MMAP_THRESHOLD)
    )
    _done = ok
    return ok
