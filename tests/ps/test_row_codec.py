"""The compact row layouts (tierserve.ps.row_codec): round-trip error bounds, layout bytes
against an independent numpy reading of docs/formats.md, and refused values."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tierserve.core.errors import InvalidInputError
from tierserve.ps.row_codec import (
    FP16_MAX,
    INT8_MAX_SPAN,
    RowCodec,
    StorageDtype,
    quantize_int8,
    storage_dtype,
)

F16_MIN_NORMAL = 2.0**-14


def _rows(max_dim: int = 40, elements=None):
    if elements is None:
        elements = st.floats(-1e4, 1e4, width=32, allow_nan=False)
    shape = st.tuples(st.integers(0, 12), st.integers(1, max_dim))
    return hnp.arrays(np.float32, shape, elements=elements)


def _magnitudes():
    """Finite float32 values from subnormal to near the type's limit, both signs."""
    big = float(np.float32(3e38))
    return st.floats(-big, big, width=32, allow_nan=False, allow_infinity=False)


# --- float16 ---------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(_rows(elements=st.floats(-FP16_MAX, FP16_MAX, width=32)))
def test_float16_round_trip_is_within_half_an_ulp(x):
    codec = RowCodec("float16", x.shape[1])
    y = codec.decode(codec.encode(x))
    assert y.dtype == np.float32 and y.shape == x.shape
    err = np.abs(y.astype(np.float64) - x)
    # relative 2^-11 in float16's normal range, absolute 2^-25 (half its smallest step) below
    bound = np.maximum(np.abs(x.astype(np.float64)) * 2.0**-11, 2.0**-25)
    assert (err <= bound).all()
    # and exactly numpy's own float16 rounding (an independent implementation)
    np.testing.assert_array_equal(y, x.astype(np.float16).astype(np.float32))


def test_float16_decodes_subnormals_zeros_and_signs_exactly():
    halves = np.arange(0, 2**16, dtype=np.uint16)
    finite = halves[np.isfinite(halves.view(np.float16))]
    codec = RowCodec("float16", 2)
    words = finite[: finite.size // 2 * 2].reshape(-1, 2).view(np.float32)
    got = codec.decode(np.ascontiguousarray(words))
    want = finite[: finite.size // 2 * 2].view(np.float16).astype(np.float32).reshape(-1, 2)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))  # -0.0 too


def test_float16_refuses_values_beyond_its_range():
    codec = RowCodec("float16", 4)
    x = np.array([[1.0, -70000.0, 0.0, 2.0]], np.float32)
    with pytest.raises(InvalidInputError, match=r"magnitude 70000.*float16"):
        codec.encode(x)
    ok = np.array([[FP16_MAX, -FP16_MAX, F16_MIN_NORMAL, 0.0]], np.float32)
    np.testing.assert_array_equal(codec.decode(codec.encode(ok)), ok)


# --- int8 ------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(_rows(elements=_magnitudes()))
def test_int8_round_trip_is_within_half_a_step(x):
    codec = RowCodec("int8", x.shape[1])
    span = x.max(axis=1, initial=0).astype(np.float64) - x.min(axis=1, initial=0)
    if x.size and (span > INT8_MAX_SPAN).any():
        with pytest.raises(InvalidInputError, match="range beyond float32"):
            codec.encode(x)
        return
    words = codec.encode(x)
    y = codec.decode(words)
    assert np.isfinite(y).all()
    _, scale, _ = _read_int8(words, x.shape[1])
    err = np.abs(y.astype(np.float64) - x)
    # scale / 2 per element, plus the float32 rounding of q * scale + bias
    slack = 4 * np.spacing(np.abs(x).max(axis=1, initial=0).astype(np.float32)).astype(np.float64)
    assert (err <= scale.astype(np.float64)[:, None] / 2 * (1 + 1e-6) + slack[:, None]).all()


@pytest.mark.parametrize("value", [0.0, -0.0, 1.0, -3.5, 1e-30, 3e38, -3e38])
def test_int8_stores_constant_and_zero_rows_exactly(value):
    x = np.full((3, 7), value, np.float32)
    codec = RowCodec("int8", 7)
    words = codec.encode(x)
    q, scale, bias = _read_int8(words, 7)
    assert (scale == 0).all() and (q == 0).all()
    np.testing.assert_array_equal(codec.decode(words), x)


def test_int8_layout_is_scale_bias_then_bytes():
    """float32 scale, float32 bias, dim bytes of q, zero padding: read back with numpy."""
    x = np.array([[-1.0, 0.0, 0.5, 1.0, 2.0]], np.float32)
    codec = RowCodec("int8", 5)
    assert codec.row_bytes == 13 and codec.words == 4
    raw = codec.encode(x).view(np.uint8)[0]
    scale, bias = np.frombuffer(raw[:8].tobytes(), "<f4")
    assert bias == -1.0 and scale == np.float32(3.0 / 255)
    np.testing.assert_array_equal(raw[8:13], np.rint((x[0] - bias) / np.float64(scale)))
    assert raw[13:].tolist() == [0, 0, 0]


def test_int8_quantizes_every_level_once_on_a_ramp():
    x = np.arange(256, dtype=np.float32)[None, :] * 0.25 - 7.0
    q, scale, bias = quantize_int8(x)
    np.testing.assert_array_equal(q[0], np.arange(256))
    assert bias[0] == -7.0 and scale[0] == np.float32(0.25)


def test_int8_refuses_a_range_beyond_float32():
    x = np.array([[-3.4e38, 3.4e38]], np.float32)
    with pytest.raises(InvalidInputError, match="range beyond float32"):
        RowCodec("int8", 2).encode(x)


# --- both ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float16", "int8"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values_are_refused_naming_row_and_column(dtype, bad):
    x = np.zeros((3, 4), np.float32)
    x[2, 1] = bad
    with pytest.raises(InvalidInputError, match=rf"row 2 holds .* at column 1; storage_dtype {dtype}"):
        RowCodec(dtype, 4).encode(x, "update")


def test_float32_rows_are_stored_as_they_are():
    x = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    codec = RowCodec("float32", 3)
    assert codec.encode(x) is x and codec.decode(x) is x and codec.words == 3


@pytest.mark.parametrize(("dtype", "dim", "words"), [
    ("float32", 16, 16), ("float16", 16, 8), ("int8", 16, 6),
    ("float32", 128, 128), ("float16", 128, 64), ("int8", 128, 34),
    ("float16", 3, 2), ("int8", 3, 3),
])  # fmt: skip
def test_row_sizes(dtype, dim, words):
    assert RowCodec(dtype, dim).words == words


def test_encode_checks_the_shape():
    with pytest.raises(InvalidInputError, match=r"must have shape \[n, 4\], got \[2, 3\]"):
        RowCodec("int8", 4).encode(np.zeros((2, 3), np.float32))


def test_unknown_dtype_is_refused_naming_it():
    with pytest.raises(InvalidInputError, match="storage_dtype 'bfloat16' is not one of float32, "
                       "float16, int8"):  # fmt: skip
        storage_dtype("bfloat16")
    assert storage_dtype("int8") is StorageDtype.int8


def _read_int8(words: np.ndarray, dim: int):
    b = np.ascontiguousarray(words).view(np.uint8)
    sb = np.ascontiguousarray(b[:, :8]).view("<f4")
    return b[:, 8 : 8 + dim], sb[:, 0], sb[:, 1]
