"""glibc malloc settings for the server process.

The dense network allocates a few MiB per layer at large batches (1024 rows x 512 floats is
2 MiB).  With glibc's defaults such blocks are mmapped, or the worker thread's arena is
trimmed back to the OS after each batch, and every batch page-faults its memory in again.
Raising ``M_MMAP_THRESHOLD`` and ``M_TRIM_THRESHOLD`` to 1 GiB keeps the freed blocks in the
heap for the next batch: batch-1024 requests took 29 ms instead of 48 ms in the server (same-run
A/B, ``python -m bench.server.run``'s DLRM).  The cost: memory freed below 1 GiB at the top of
the heap is not handed back to the OS, so the process would stay at its peak footprint after
one very large request.  :class:`Trimmer` gives it back (``malloc_trim``) after requests of
at least :data:`LARGE_ROWS` rows or :data:`LARGE_BODY` bytes, which are rare and slow
anyway, so the usual batch sizes keep their warm heap.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
import time

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


#: Requests at least this large give the memory they used back to the OS when done.
LARGE_ROWS = 8192
LARGE_BODY = 16 << 20


def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc
        return None
    if trim is not None:
        trim.argtypes = [ctypes.c_size_t]
        trim.restype = ctypes.c_int
    return trim


class Trimmer:
    """Hands freed heap memory back to the OS (glibc ``malloc_trim``) in a thread, at most
    once per ``interval`` seconds, after large requests (see the module docstring)."""

    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        self.trims = 0
        self._trim = _malloc_trim()
        self._lock = threading.Lock()
        self._pending = False
        self._last = 0.0

    def after_request(self, inputs: dict, body_bytes: int) -> None:
        """:meth:`after` for a request's decoded ``inputs`` (its longest first dimension)."""
        rows = max((a.shape[0] for a in inputs.values() if getattr(a, "ndim", 0)), default=0)
        self.after(rows, body_bytes)

    def after(self, rows: int, body_bytes: int) -> None:
        """Note a finished request of ``rows`` rows and ``body_bytes`` bytes; trims soon when
        it was a large one.  Never blocks."""
        if self._trim is None or (rows < LARGE_ROWS and body_bytes < LARGE_BODY):
            return
        with self._lock:
            if self._pending:
                return
            self._pending = True
        threading.Thread(target=self._run, name="tierserve-trim", daemon=True).start()

    def _run(self) -> None:
        # a moment for the request's own buffers to be freed, then at most once per interval
        time.sleep(max(0.2, self._last + self.interval - time.monotonic()))
        with self._lock:
            self._pending = False
        self._trim(0)
        self._last = time.monotonic()
        self.trims += 1


#: The server's trimmer.
trimmer = Trimmer()
