"""Compiled (numba) decoding of compact rows (see :mod:`tierserve.ps.row_codec`).

Decoding runs on every lookup of an ``int8`` table, so it is one fused pass: each row's
scale and bias are read once and the row's bytes are widened, scaled and shifted in a loop
LLVM vectorises.  The kernels release the GIL and are cached on disk.
"""

from __future__ import annotations

import numba as nb
import numpy as np


@nb.njit(nogil=True, cache=True)
def dequantize_int8(b, dim, out):
    """Rows of FBGEMM's fused 8-bit layout (``b``: uint8 ``[n, >= dim + 8]``: ``dim`` bytes,
    float32 scale, float32 bias) into float32 ``out[n, dim]``."""
    n = b.shape[0]
    sb = np.empty(2, np.float32)
    sbb = sb.view(np.uint8)
    for i in range(n):
        for j in range(8):
            sbb[j] = b[i, dim + j]
        scale = sb[0]
        bias = sb[1]
        for c in range(dim):
            out[i, c] = np.float32(b[i, c]) * scale + bias


_F16_RESCALE = np.float32(2.0**112)  # float16's exponent bias 15 -> float32's 127


@nb.njit(nogil=True, cache=True)
def widen_float16(u, dim, out):
    """IEEE half values (``u``: uint16 ``[n, >= dim]``, finite) into float32 ``out[n, dim]``.

    Per row: the half's exponent and mantissa shifted into a float32's places read as a
    float32 2^112 times too small (exact, subnormal halves included), so one multiply
    rescales it; then the sign bit.  Three loops over the row (in L1), each vectorised.
    """
    ou = out.view(np.uint32)
    n = u.shape[0]
    for i in range(n):
        for c in range(dim):
            ou[i, c] = (np.uint32(u[i, c]) & np.uint32(0x7FFF)) << np.uint32(13)
        for c in range(dim):
            out[i, c] *= _F16_RESCALE
        for c in range(dim):
            ou[i, c] |= (np.uint32(u[i, c]) & np.uint32(0x8000)) << np.uint32(16)
