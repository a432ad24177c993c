"""Making freed memory go back to the operating system (glibc's malloc only).

glibc serves allocations below its mmap threshold from heaps it keeps, and raises that
threshold (up to 32 MiB) each time a larger mmapped block is freed. Executors unbound for
``bucket_memory`` free hundreds of such blocks; kept in the heaps, they stay in the
process's resident memory and fragment, so the memory bound would hold on paper only.
A fixed threshold and trim limit make large blocks come from mmap and go back on free.

The price is paid by every large temporary from then on (a oneDNN backward allocates one
of batch x vocabulary floats per batch on the word LM: a few percent of its speed), so the
module switches only when it first unbinds a bucket, not when a bound is merely set.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

_LOG = logging.getLogger(__name__)

# mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: blocks from this size up are mmapped and unmapped when freed
MMAP_THRESHOLD = 128 * 1024

_done = False


def return_freed_memory() -> bool:
    """Fix glibc's mmap and trim thresholds for this process (once); False where the C
    library is not glibc or refuses, which leaves the allocator as it was."""
    global _done
    if _done:
        return True
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        _LOG.debug("no mallopt in the C library: freed memory stays with the allocator")
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, MMAP_THRESHOLD)
    )
    _done = ok
    return ok
