"""Which set of the cache a key lives in.

``set_of`` mixes the key's 64 bits with two multiply steps (the constants of MurmurHash3's
64-bit finalizer), takes the top 32 bits and maps them onto ``num_sets`` with Lemire's
multiply-shift range reduction, so ``num_sets`` can be any positive integer below 2**32::

    h = key * 0xFF51AFD7ED558CCD            (mod 2**64)
    h = (h ^ (h >> 32)) * 0xC4CEB9FE1A85EC53 (mod 2**64)
    set = ((h >> 32) * num_sets) >> 32

The mixing steps are those of the parameter server hash map's slot hash
(``tierserve.ps.hash_table``); ``cuda/embedding_cache.cu`` computes exactly this function, so
the numpy, cupy and CUDA paths agree key for key.  One multiply alone (Fibonacci hashing)
is not enough: keys that are themselves multiples of a golden-ratio constant then crowd into
a third of the sets.  The splitmix64 partition mixer (``tierserve.ps.partition``) would do,
but costs nine array passes where this costs six.

Written against ``xp``: the arrays passed in (numpy or cupy) decide which.
"""

from __future__ import annotations

import numpy as np

from tierserve.ps.partition import FMIX_C1, FMIX_C2

C1 = FMIX_C1
C2 = FMIX_C2
_C1 = np.uint64(C1)
_C2 = np.uint64(C2)
_U32 = np.uint64(32)
MAX_SETS = 2**32 - 1


def set_of(keys, num_sets: int):
    """The set (int64, ``0 .. num_sets-1``) of each int64 key in ``keys`` (numpy or cupy)."""
    if not 0 < num_sets <= MAX_SETS:
        raise ValueError(f"num_sets must be in 1 .. {MAX_SETS}, got {num_sets}")
    h = keys.view(np.uint64) * _C1
    h ^= h >> _U32
    h *= _C2
    h >>= _U32
    h *= np.uint64(num_sets)
    h >>= _U32
    return h.view(np.int64)
