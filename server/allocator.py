"""glibc malloc settings for the server process.

The dense network allocates a few MiB per layer at large batches (1024 rows x 512 floats is
2 MiB).  With glibc's defaults such blocks are mmapped, or the worker thread's arena is
trimmed back to the OS after each batch, and every batch page-faults its memory in again.
Raising ``M_MMAP_THRESHOLD`` and ``M_TRIM_THRESHOLD`` to 1 GiB keeps the freed blocks in the
heap for the next batch: batch-1024 requests took 29 ms instead of 48 ms in the server (same-run
A/B, ``python -m bench.server.run``'s DLRM).  The cost: memory freed below 1 GiB at the top of
the heap is not handed back to the OS, so the process stays at its peak footprint.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger("tierserve.server.allocator")

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
ONE_GIB = 1 << 30


def tune_malloc(threshold: int = ONE_GIB) -> bool:
    """Set glibc's mmap and trim thresholds to ``threshold`` bytes; False where the C library
    is not glibc or refuses a value."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(M_MMAP_THRESHOLD, threshold)) and bool(mallopt(M_TRIM_THRESHOLD, threshold))
    if not ok:
        log.warning("mallopt refused a threshold of %d bytes; malloc keeps its defaults", threshold)
    return ok
