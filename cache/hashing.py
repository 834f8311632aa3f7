"""Which set of the cache a key lives in.

``set_of(key) = ((key * 0x9E3779B97F4A7C15 mod 2**64) >> 32) * num_sets >> 32``: Fibonacci
(multiply-shift) hashing, then Lemire's multiply-shift range reduction, so ``num_sets`` can be
any positive integer below 2**32.  ``cuda/embedding_cache.cu`` computes the same function,
so the numpy, cupy and CUDA paths agree key for key.  It is deliberately not the splitmix64
partition mixer of ``tierserve.ps.partition``: that costs nine array passes where this costs
four, and a cache hit is only about a dozen passes long.  The top bits of a Fibonacci product
depend on every key bit, which spreads sequential and strided keys evenly (tested).

Written against ``xp`` (numpy or cupy): the arrays passed in decide which.
"""

from __future__ import annotations

import numpy as np

FIBONACCI = 0x9E3779B97F4A7C15  # 2**64 / golden ratio
_FIB = np.uint64(FIBONACCI)
_U32 = np.uint64(32)
MAX_SETS = 2**32 - 1


def set_of(keys, num_sets: int):
    """The set (int64, ``0 .. num_sets-1``) of each int64 key in ``keys`` (numpy or cupy)."""
    if not 0 < num_sets <= MAX_SETS:
        raise ValueError(f"num_sets must be in 1 .. {MAX_SETS}, got {num_sets}")
    h = keys.view(np.uint64) * _FIB
    h >>= _U32
    h *= np.uint64(num_sets)
    h >>= _U32
    return h.view(np.int64)
