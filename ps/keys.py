"""The one rule for embedding keys, used by the tiers, the cache, the trainer and the readers.

Every tier, the cache and the sparse model files hold keys as int64.  A model has a key
width: 64 bits (HugeCTR's ``i64_input_key=True``, ps.json ``supportlonglong: true``; keys are
``long long``) or 32 bits (HugeCTR's default ``i64_input_key=False``; keys are ``unsigned
int``, 0 .. 2**32-1, and are stored widened to int64 as HugeCTR stores them).

:func:`as_keys` turns what a caller hands in into that int64 form:

- 64-bit keys: any integer array; values keep their value (int32 -1 stays -1); uint64 keys
  keep their 64 bits (values above 2**63-1 read as the negative int64 with the same bits,
  as C++'s cast does).
- 32-bit keys: uint32 arrays keep their values; int32 arrays are read as the unsigned 32 bits
  they hold (int32 -1 is key 4294967295), the same key a uint32 Norm file or a Triton
  ``UINT32`` tensor gives; wider arrays must hold values in 0 .. 2**32-1, anything else is an
  :class:`InvalidInputError` naming ``what``.

Floats, bools and strings are refused whatever the width.
"""

from __future__ import annotations

import numpy as np

from tierserve.core.errors import InvalidInputError

#: The largest 32-bit key (HugeCTR's ``unsigned int``).
MAX_KEY32 = 2**32 - 1

KEY_BITS = (32, 64)


def key_bits_of(i64_input_key: bool) -> int:
    """The key width of HugeCTR's ``i64_input_key`` / ``supportlonglong`` flag."""
    return 64 if i64_input_key else 32


def check_key_bits(key_bits: int) -> int:
    """``key_bits`` if it is 32 or 64, else :class:`ValueError` naming it."""
    if key_bits not in KEY_BITS:
        raise ValueError(f"key_bits must be 32 or 64, got {key_bits!r}")
    return int(key_bits)


def as_keys(keys, key_bits: int = 64, what: str = "keys") -> np.ndarray:
    """``keys`` as a contiguous 1-D int64 array by the module's rule (no copy when they
    already are one and ``key_bits`` is 64)."""
    if (type(keys) is np.ndarray and keys.dtype == np.int64 and key_bits == 64
            and keys.ndim == 1 and keys.flags.c_contiguous):
        return keys  # the usual case, without the checks below
    keys = np.asarray(keys)
    kind = keys.dtype.kind
    if kind not in "iu":
        if keys.size == 0:
            return np.zeros(0, dtype=np.int64)
        raise InvalidInputError(f"{what} must be integers, got dtype {keys.dtype}")
    keys = keys.reshape(-1)
    if key_bits == 64:
        if keys.dtype == np.uint64:
            keys = keys.view(np.int64)
        return np.ascontiguousarray(keys, dtype=np.int64)
    check_key_bits(key_bits)
    if keys.dtype.itemsize <= 4:
        if kind == "i":  # the unsigned bits a 32-bit key holds
            keys = keys.astype(np.int32, copy=False).view(np.uint32)
        return keys.astype(np.int64)
    if keys.size:
        low, high = keys.min(), keys.max()
        if low < 0 or high > MAX_KEY32:
            bad = low if low < 0 else high
            raise InvalidInputError(
                f"{what}: {int(bad)} is not a 32-bit key (0 .. {MAX_KEY32}); the model has "
                "32-bit keys (i64_input_key / supportlonglong false)"
            )
    if keys.dtype == np.uint64:
        keys = keys.view(np.int64)
    return np.ascontiguousarray(keys, dtype=np.int64)


def narrow_keys(keys: np.ndarray, key_bits: int) -> np.ndarray:
    """Stored int64 ``keys`` in the dtype a model of ``key_bits`` uses on the wire: int64, or
    uint32 for 32-bit models (:class:`InvalidInputError` when one does not fit)."""
    if check_key_bits(key_bits) == 64:
        return as_keys(keys)
    return as_keys(keys, 32).astype(np.uint32)
