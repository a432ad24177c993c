"""context.large_buffers=reuse: a buffer over 64 MB allocated again and again by a worker
thread (what oneDNN's softmax backward does every batch) is not mapped and page-faulted in
afresh each time. Counted in page faults, not timed."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent(
    """
    import ctypes, resource, sys, threading
    from mxtrain.engine import kernels

    policy = sys.argv[1]
    if policy == "reuse":
        kernels.prepare_allocator(policy)  # before any other thread allocates
        kernels.set_large_buffers(policy)
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    size = 80 * 2**20  # over glibc's 64 MB thread-arena heaps
    faults = []

    def worker():
        for _ in range(4):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            buffer = libc.malloc(size)
            ctypes.memset(buffer, 1, size)
            libc.free(buffer)
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    print(faults[-1])
    """
)


def _faults_of_last_allocation(policy: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, policy], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_reuse_keeps_a_large_buffer_of_a_worker_thread_mapped():
    pages = 80 * 2**20 // 4096
    assert _faults_of_last_allocation("release") > pages // 2  # glibc maps it afresh
    assert _faults_of_last_allocation("reuse") < pages // 10


def test_prepare_allocator_leaves_release_alone():
    from mxtrain.engine import kernels

    assert kernels.prepare_allocator("release") is False
