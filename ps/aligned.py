"""Numpy arrays that start on a CPU cache line."""

from __future__ import annotations

import math

import numpy as np

#: Bytes in a CPU cache line.
LINE = 64


def cache_aligned(shape: tuple, dtype, zeros: bool = False) -> np.ndarray:
    """An array of ``shape`` whose first byte starts a cache line (zero-filled with ``zeros``).

    numpy's large buffers start 16 bytes into a page, so every 64-byte row (dim 16) would
    straddle two lines: two misses per row read, and a line shared by the rows two threads
    write.
    """
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize  # np.prod costs ~9 us a call
    buf = (np.zeros if zeros else np.empty)(nbytes + LINE, dtype=np.uint8)
    start = -buf.ctypes.data % LINE
    return buf[start : start + nbytes].view(dtype).reshape(shape)
