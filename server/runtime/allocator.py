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

``malloc_trim`` gives back the main arena's top and the free blocks inside every arena, but
not the free top of an inference thread's own arena, where a large batch's blocks end up
when nothing was allocated above them; glibc trims that top only when a block is freed on
that arena and the top is over the trim threshold.  :func:`release_thread_arena`, called on
the thread that ran a large batch, frees one block there under a low threshold.  The batch's
outputs stay above its freed temporaries until the response is sent, and freed then they make
a free top again: :meth:`Trimmer.after_batch` also holds a block of that arena, which the
trim frees under the low threshold once the request is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
import time

log = logging.getLogger("tierserve.server.runtime.allocator")

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
ONE_GIB = 1 << 30


#: The trim threshold :func:`tune_malloc` set (None: glibc's own, which trims by itself).
_tuned_threshold: int | None = None


def _libc_function(name: str, argtypes: list, restype):
    """``name`` from the C library, typed; None where there is none (not glibc)."""
    lib = ctypes.util.find_library("c")
    try:
        function = getattr(ctypes.CDLL(lib), name) if lib else None
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return None
    if function is not None:
        function.argtypes = argtypes
        function.restype = restype
    return function


_mallopt = _libc_function("mallopt", [ctypes.c_int, ctypes.c_int], ctypes.c_int)


def tune_malloc(threshold: int = ONE_GIB) -> bool:
    """Set glibc's mmap and trim thresholds to ``threshold`` bytes; False where the C library
    is not glibc or refuses a value."""
    global _tuned_threshold
    if _mallopt is None:
        return False
    ok = bool(_mallopt(M_MMAP_THRESHOLD, threshold)) and bool(_mallopt(M_TRIM_THRESHOLD, threshold))
    if not ok:
        log.warning("mallopt refused a threshold of %d bytes; malloc keeps its defaults", threshold)
    _tuned_threshold = threshold if ok else None
    return ok


#: prctl(2) options: a process's opt-out of transparent huge pages (Linux 3.15 and later).
PR_SET_THP_DISABLE = 41
PR_GET_THP_DISABLE = 42
_prctl = _libc_function("prctl", [ctypes.c_int] + [ctypes.c_ulong] * 4, ctypes.c_int)


def disable_transparent_hugepages(disabled: bool = True) -> bool:
    """Opt this process out of transparent huge pages (``PR_SET_THP_DISABLE``), or back in
    (``disabled`` false: the opt-out is inherited from a parent process); False where the C
    library has no ``prctl`` or the kernel refuses.

    Once a region of a process is advised for huge pages (numpy advises every array of 4 MiB
    or more), the kernel's khugepaged scans the whole address space now and then, holding its
    lock for reading, at the lowest CPU priority.  On a busy machine a scan held it for
    seconds: a thread that grew a malloc arena or made a thread stack (``mprotect``,
    ``mmap``) waited in the kernel, a thread holding the GIL waited for that one, and the
    server froze for 10-23 s (its health probes timed out).  Opted out, khugepaged leaves the
    process alone; memory is mapped in 4 KiB pages.
    """
    if _prctl is None:
        return False
    return _prctl(PR_SET_THP_DISABLE, int(disabled), 0, 0, 0) == 0


def transparent_hugepages_disabled() -> bool | None:
    """Whether this process opted out of transparent huge pages (None: cannot tell)."""
    if _prctl is None:
        return None
    state = _prctl(PR_GET_THP_DISABLE, 0, 0, 0, 0)
    return None if state < 0 else bool(state)


_malloc = _libc_function("malloc", [ctypes.c_size_t], ctypes.c_void_p)
_free = _libc_function("free", [ctypes.c_void_p], None)
_release_lock = threading.Lock()
#: Over glibc's FASTBIN_CONSOLIDATION_THRESHOLD (64 KiB): freeing a block this large makes
#: glibc consider trimming the arena's top.
_PROBE_BYTES = 128 << 10
#: The trim threshold while :func:`release_thread_arena` frees its block (glibc's default).
_LOW_THRESHOLD = 128 << 10


def release_thread_arena() -> bool:
    """Give the free top of the calling thread's malloc arena back to the OS (see the module
    docstring); False, doing nothing, unless :func:`tune_malloc` raised the trim threshold."""
    block = hold_arena_block()
    return block is not None and free_arena_block(block)


def hold_arena_block() -> int | None:
    """A block of the calling thread's malloc arena, for :func:`free_arena_block` to trim
    that arena's top later from any thread (glibc frees a block into the arena it came
    from); None, allocating nothing, unless :func:`tune_malloc` raised the trim threshold."""
    if _tuned_threshold is None or _malloc is None or _free is None:
        return None
    return _malloc(_PROBE_BYTES) or None


def free_arena_block(block: int) -> bool:
    """Free a :func:`hold_arena_block` block under glibc's default trim threshold: its
    arena's free top goes back to the OS."""
    # one thread at a time: another's restore must not land between this lower and free
    with _release_lock:
        _mallopt(M_TRIM_THRESHOLD, _LOW_THRESHOLD)
        try:
            _free(block)
        finally:
            _mallopt(M_TRIM_THRESHOLD, _tuned_threshold)
    return True


#: Requests at least this large give the memory they used back to the OS when done.
LARGE_ROWS = 8192
LARGE_BODY = 16 << 20


class Trimmer:
    """Hands freed heap memory back to the OS (glibc ``malloc_trim``) in a thread, at most
    once per ``interval`` seconds, after large requests (see the module docstring)."""

    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        self.trims = 0
        self._trim = _libc_function("malloc_trim", [ctypes.c_size_t], ctypes.c_int)
        self._lock = threading.Lock()
        self._pending = False
        self._last = 0.0
        self._held: list[int] = []  # blocks of inference threads' arenas (hold_arena_block)

    def after_request(self, inputs: dict, body_bytes: int) -> None:
        """:meth:`after` for a request's decoded ``inputs`` (its longest first dimension)."""
        rows = max((a.shape[0] for a in inputs.values() if getattr(a, "ndim", 0)), default=0)
        self.after(rows, body_bytes)

    def after_batch(self, rows: int) -> None:
        """Call on the thread that just ran a batch of ``rows`` rows: after a large one, that
        thread's arena gives its free top back now (:func:`release_thread_arena`) and again
        at the trim, once the request's outputs, freed after the response into that arena's
        top, are gone too."""
        if rows < LARGE_ROWS or self._trim is None:
            return
        release_thread_arena()
        block = hold_arena_block()
        if block is not None:
            with self._lock:
                self._held.append(block)
        self.after(rows, 0)

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
        with self._lock:
            held, self._held = self._held, []
        for block in held:
            free_arena_block(block)
        self._last = time.monotonic()
        self.trims += 1


#: The server's trimmer.
trimmer = Trimmer()
