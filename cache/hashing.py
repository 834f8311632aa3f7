"""Which set of the cache a key lives in.

``set_of(key) = ((key * 0x9E3779B97F4A7C15 mod 2**64) >> 32) * num_sets >> 32``: Fibonacci
(multiply-shift) hashing, then Lemire's multiply-shift range reduction, so ``num_sets`` can be
any positive integer below 2**32.  It is the home-slot function of the parameter server's
hash map (``tierserve.ps.hash_table.home_slots``) and the one ``cuda/embedding_cache.cu``
computes, so the numpy, cupy and CUDA paths agree key for key.  It is *not* the splitmix64
partition mixer of ``tierserve.ps.partition``: that costs nine array passes where this costs
four, and a cache hit is only a few passes long.

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
