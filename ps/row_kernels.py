"""Compiled (numba) decoding of compact rows (see :mod:`tierserve.ps.row_codec`).

:func:`emit_row` decodes one stored row into a float32 output row; the lookup kernels of the
hash map (:mod:`tierserve.ps.hash_kernels`) and of the embedding cache
(:mod:`tierserve.cache.cpu_kernels`) inline it in place of their row copy, so a compact
lookup touches each output row once, as a float32 lookup does.  :func:`decode_rows` runs it
over whole arrays.  The layout is one branch per row (the same for every row of a call, so
the branch predicts).  Each case decodes 16 values at a time with one vector load, a few
vector operations and one vector store (:func:`half16` and :func:`byte16`; the loop left to
LLVM vectorises too, but checks at run time per row that the rows do not overlap the output
and keeps scalar remainder loops, which cost a dim-16 row about as much as its decoding);
the values past the last whole 16 run as a scalar loop.
"""

from __future__ import annotations

import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

#: Layout codes of the kernels (``RowCodec.layout``).
LAYOUT_FLOAT32, LAYOUT_FLOAT16, LAYOUT_INT8 = 0, 1, 2

_F16_RESCALE = np.float32(2.0**112)  # float16's exponent bias 15 -> float32's 127
_LANES = 16


def item_pointer(context, builder, aryty, ary, inds, indtys):
    """The address of ``ary[inds]`` (LLVM values of numba types ``indtys``), unchecked."""
    array = context.make_array(aryty)(context, builder, ary)
    inds = [context.cast(builder, v, t, types.intp) for v, t in zip(inds, indtys, strict=True)]
    return cgutils.get_item_pointer2(
        context, builder, data=array.data, shape=cgutils.unpack_tuple(builder, array.shape),
        strides=cgutils.unpack_tuple(builder, array.strides), layout=aryty.layout, inds=inds,
        wraparound=False, boundscheck=False,
    )  # fmt: skip


def _splat(builder, value, elem):
    vec = ir.VectorType(elem, _LANES)
    one = builder.insert_element(ir.Constant(vec, ir.Undefined), value, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(one, ir.Constant(vec, ir.Undefined),
                                  ir.Constant(ir.VectorType(ir.IntType(32), _LANES), [0] * _LANES))  # fmt: skip


@intrinsic
def half16(typingctx, out, i, c, src16, s, h):
    """``out[i, c : c + 16]`` = the 16 finite halves ``src16[s, h : h + 16]`` as float32,
    by :func:`emit_row`'s float16 arithmetic (sign, exponent and mantissa shifted into
    place, one multiply by 2^112) on 16 lanes at once."""
    sig = types.void(out, i, c, src16, s, h)

    def codegen(context, builder, signature, args):
        o, oi, oc, src, si, sh = args
        at = item_pointer(context, builder, signature.args[3], src, [si, sh], signature.args[4:6])
        to = item_pointer(context, builder, signature.args[0], o, [oi, oc], signature.args[1:3])
        i32 = ir.VectorType(ir.IntType(32), _LANES)
        half = builder.load(builder.bitcast(at, ir.VectorType(ir.IntType(16), _LANES).as_pointer()),
                            align=2)  # fmt: skip
        word = builder.zext(half, i32)
        mag = builder.shl(builder.and_(word, ir.Constant(i32, [0x7FFF] * _LANES)),
                          ir.Constant(i32, [13] * _LANES))  # fmt: skip
        sign = builder.shl(builder.and_(word, ir.Constant(i32, [0x8000] * _LANES)),
                           ir.Constant(i32, [16] * _LANES))  # fmt: skip
        f32 = ir.VectorType(ir.FloatType(), _LANES)
        value = builder.fmul(builder.bitcast(builder.or_(mag, sign), f32),
                             ir.Constant(f32, [float(_F16_RESCALE)] * _LANES))  # fmt: skip
        builder.store(value, builder.bitcast(to, f32.as_pointer()), align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def byte16(typingctx, out, i, c, src8, s, q, scale, bias):
    """``out[i, c : c + 16]`` = ``src8[s, q : q + 16] * scale + bias`` (uint8 to float32,
    a multiply, then an add: :func:`emit_row`'s int8 arithmetic) on 16 lanes at once."""
    sig = types.void(out, i, c, src8, s, q, scale, bias)

    def codegen(context, builder, signature, args):
        o, oi, oc, src, si, sq, sc, bi = args
        at = item_pointer(context, builder, signature.args[3], src, [si, sq], signature.args[4:6])
        to = item_pointer(context, builder, signature.args[0], o, [oi, oc], signature.args[1:3])
        f32 = ir.VectorType(ir.FloatType(), _LANES)
        q8 = builder.load(builder.bitcast(at, ir.VectorType(ir.IntType(8), _LANES).as_pointer()),
                          align=1)  # fmt: skip
        sc = context.cast(builder, sc, signature.args[6], types.float32)
        bi = context.cast(builder, bi, signature.args[7], types.float32)
        value = builder.fmul(builder.uitofp(q8, f32), _splat(builder, sc, ir.FloatType()))
        value = builder.fadd(value, _splat(builder, bi, ir.FloatType()))
        builder.store(value, builder.bitcast(to, f32.as_pointer()), align=4)
        return context.get_dummy_value()

    return sig, codegen


@nb.njit(inline="always")
def emit_row(src, src16, src8, s, first, out, out32, i, layout, dim):
    """Decode the row stored in ``src[s]`` (float32 words) from word ``first`` on into
    ``out[i]`` (float32, ``dim`` values: ``out.shape[1]``, passed as a compile-time constant
    where the caller has one, so that the loops unroll).  ``src16`` / ``src8`` are ``src``
    viewed as uint16 / uint8 and ``out32`` is ``out`` viewed as uint32 (made once per call
    by :func:`views`: a view per row costs more than a short row's decoding).

    float32: the words are the values.  float16: ``dim`` halves, finite: each half's sign,
    exponent and mantissa shifted into a float32's places read as a float32 2^112 times too
    small (exact, subnormal halves and signed zeros included); one multiply rescales it.  int8:
    words ``first`` and ``first + 1`` are the row's scale and bias, the ``dim`` bytes after
    them its ``q``; a value is ``q * scale + bias``.
    """
    whole = dim - dim % _LANES
    if layout == LAYOUT_FLOAT32:
        for c in range(dim):
            out[i, c] = src[s, first + c]
    elif layout == LAYOUT_FLOAT16:
        h0 = 2 * first
        for c in range(0, whole, _LANES):
            half16(out, i, c, src16, s, h0 + c)
        for c in range(whole, dim):
            h = np.uint32(src16[s, h0 + c])
            out32[i, c] = ((h & np.uint32(0x7FFF)) << np.uint32(13)) | (
                (h & np.uint32(0x8000)) << np.uint32(16)
            )
            out[i, c] *= _F16_RESCALE
    else:
        scale = src[s, first]
        bias = src[s, first + 1]
        q0 = 4 * first + 8
        for c in range(0, whole, _LANES):
            byte16(out, i, c, src8, s, q0 + c, scale, bias)
        for c in range(whole, dim):
            out[i, c] = np.float32(src8[s, q0 + c]) * scale + bias


@nb.njit(inline="always")
def stored_words(layout, dim):
    """Words of a stored row of ``dim`` values (``RowCodec.words``)."""
    if layout == LAYOUT_FLOAT32:
        return dim
    if layout == LAYOUT_FLOAT16:
        return (2 * dim + 3) // 4
    return (dim + 8 + 3) // 4


@nb.njit(inline="always")
def views(src, out):
    """``(src16, src8, out32)`` for :func:`emit_row` (both arrays 2-D, C-contiguous)."""
    return src.view(np.uint16), src.view(np.uint8), out.view(np.uint32)


@nb.njit(nogil=True, cache=True)
def decode_rows(words, layout, out):
    """Every row of ``words`` (float32 ``[n, words]``, C-contiguous) decoded into ``out``."""
    src16, src8, out32 = views(words, out)
    for i in range(words.shape[0]):
        emit_row(words, src16, src8, i, 0, out, out32, i, layout, out.shape[1])
