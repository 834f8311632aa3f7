"""How many threads numpy's BLAS (OpenBLAS) uses, read and set at run time.

OpenBLAS threads busy-wait; on a machine with few cores shared with other work (data reader
threads, other processes) small matrix products run faster on one thread.  Benchmarks also
use this to give numpy and a peer framework the same thread count.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable, Iterator

import numpy as np

_PREFIXES = ("scipy_openblas_", "openblas_")
_SUFFIXES = ("64_", "")
_listeners: list[Callable[[], None]] = []


def on_blas_threads_changed(listener: Callable[[], None]) -> None:
    """Call ``listener()`` after each :func:`set_blas_threads` (model.blas re-decides its
    library then)."""
    _listeners.append(listener)


def _openblas() -> tuple[ctypes.CDLL, str, str] | None:
    np.ones(1) @ np.ones(1)  # make sure the BLAS library is loaded
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower()}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix in _PREFIXES:
            for suffix in _SUFFIXES:
                if hasattr(lib, f"{prefix}set_num_threads{suffix}"):
                    return lib, prefix, suffix
    return None


def get_blas_threads() -> int | None:
    """numpy's BLAS thread count, or None when it is not OpenBLAS (or not found)."""
    found = _openblas()
    if found is None:
        return None
    lib, prefix, suffix = found
    fn = getattr(lib, f"{prefix}get_num_threads{suffix}")
    fn.restype = ctypes.c_int
    return int(fn())


def set_blas_threads(n: int) -> bool:
    """Set numpy's BLAS thread count; False when that cannot be done here."""
    found = _openblas()
    if found is None:
        return False
    lib, prefix, suffix = found
    getattr(lib, f"{prefix}set_num_threads{suffix}")(ctypes.c_int(int(n)))
    for listener in _listeners:
        listener()
    return True


@contextlib.contextmanager
def blas_threads(n: int) -> Iterator[None]:
    """Run a block with ``n`` BLAS threads, restoring the count afterwards."""
    before = get_blas_threads()
    set_blas_threads(n)
    try:
        yield
    finally:
        if before is not None:
            set_blas_threads(before)
