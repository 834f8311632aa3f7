"""Compiled (numba) decoding of compact rows (see :mod:`tierserve.ps.row_codec`).

:func:`emit_row` decodes one stored row into a float32 output row; the lookup kernels of the
hash map (:mod:`tierserve.ps.hash_kernels`) and of the embedding cache
(:mod:`tierserve.cache.cpu_kernels`) inline it in place of their row copy, so a compact
lookup touches each output row once, as a float32 lookup does.  :func:`decode_rows` runs it
over whole arrays.  The layout is one branch per row (the same for every row of a call, so
the branch predicts), and each case's element loop vectorises.
"""

from __future__ import annotations

import numba as nb
import numpy as np

#: Layout codes of the kernels (``RowCodec.layout``).
LAYOUT_FLOAT32, LAYOUT_FLOAT16, LAYOUT_INT8 = 0, 1, 2

_F16_RESCALE = np.float32(2.0**112)  # float16's exponent bias 15 -> float32's 127


@nb.njit(inline="always")
def emit_row(src, src16, src8, s, first, out, out32, i, layout):
    """Decode the row stored in ``src[s]`` (float32 words) from word ``first`` on into
    ``out[i]`` (float32, ``dim = out.shape[1]`` values).  ``src16`` / ``src8`` are ``src``
    viewed as uint16 / uint8 and ``out32`` is ``out`` viewed as uint32 (made once per call
    by :func:`views`: a view per row costs more than a short row's decoding).

    float32: the words are the values.  float16: ``dim`` halves, finite: each half's sign,
    exponent and mantissa shifted into a float32's places read as a float32 2^112 times too
    small (exact, subnormal halves and signed zeros included); one multiply rescales it.  int8:
    words ``first`` and ``first + 1`` are the row's scale and bias, the ``dim`` bytes after
    them its ``q``; a value is ``q * scale + bias``.
    """
    dim = out.shape[1]
    if layout == LAYOUT_FLOAT32:
        for c in range(dim):
            out[i, c] = src[s, first + c]
    elif layout == LAYOUT_FLOAT16:
        h0 = 2 * first
        for c in range(dim):
            h = np.uint32(src16[s, h0 + c])
            out32[i, c] = ((h & np.uint32(0x7FFF)) << np.uint32(13)) | (
                (h & np.uint32(0x8000)) << np.uint32(16)
            )
        for c in range(dim):
            out[i, c] *= _F16_RESCALE
    else:
        scale = src[s, first]
        bias = src[s, first + 1]
        q0 = 4 * first + 8
        for c in range(dim):
            out[i, c] = np.float32(src8[s, q0 + c]) * scale + bias


@nb.njit(inline="always")
def views(src, out):
    """``(src16, src8, out32)`` for :func:`emit_row` (both arrays 2-D, C-contiguous)."""
    return src.view(np.uint16), src.view(np.uint8), out.view(np.uint32)


@nb.njit(nogil=True, cache=True)
def decode_rows(words, layout, out):
    """Every row of ``words`` (float32 ``[n, words]``, C-contiguous) decoded into ``out``."""
    src16, src8, out32 = views(words, out)
    for i in range(words.shape[0]):
        emit_row(words, src16, src8, i, 0, out, out32, i, layout)
