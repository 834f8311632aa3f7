import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tierserve.core.errors import MalformedMessageError
from tierserve.ps.update_message import MAGIC, decode_update, encode_update


@st.composite
def updates(draw):
    dim = draw(st.sampled_from([1, 3, 16, 512]))
    n = draw(st.integers(0, 30))
    key_dtype = draw(st.sampled_from([np.int32, np.int64]))
    keys = draw(hnp.arrays(key_dtype, n))
    emb = draw(
        hnp.arrays(
            np.float32,
            (n, dim),
            elements=st.floats(allow_nan=False, allow_infinity=False, width=32),
        )
    )
    return keys, emb


@settings(max_examples=80, deadline=None)
@given(updates())
def test_round_trip(update):
    keys, emb = update
    value = encode_update(keys, emb)
    assert len(value) == 8 + len(keys) * (8 + 4 * emb.shape[1])
    back_keys, back_emb = decode_update(value, expected_dim=emb.shape[1])
    assert back_keys.dtype == np.int64 and back_emb.dtype == np.float32
    np.testing.assert_array_equal(back_keys, keys.astype(np.int64))
    np.testing.assert_array_equal(back_emb, emb)


def test_wire_layout_matches_the_spec():
    keys = np.array([1, -2], dtype=np.int64)
    emb = np.array([[0.5, 1.5], [2.5, 3.5]], dtype=np.float32)
    expected = MAGIC + struct.pack("<I", 8)
    for k, row in zip(keys, emb):
        expected += struct.pack("<q2f", int(k), *row)
    assert encode_update(keys, emb) == expected


def _headed(value_size: int, body: bytes) -> bytes:
    return MAGIC + struct.pack("<I", value_size) + body


# Arbitrary bytes rarely start with the magic: most examples are built around a real header
# with any u32 value_size (the one that matters most: 2**32 - 4) and any body.
values = st.one_of(
    st.binary(max_size=200),
    st.builds(
        _headed,
        st.one_of(
            st.integers(0, 2**32 - 1),
            st.sampled_from([2**32 - 4, 2**31, 2**31 - 4, 2**30, 4, 8]),
        ),
        st.binary(max_size=120),
    ),
)


@settings(max_examples=300, deadline=None)
@given(values)
def test_any_bytes_decode_or_raise_malformed(data):
    # Every failure is a MalformedMessageError (the consumer counts and skips those); never
    # ValueError, MemoryError or garbage.
    try:
        keys, emb = decode_update(data)
    except MalformedMessageError:
        return
    if keys.size:  # whatever decodes must re-encode to the very same bytes
        assert encode_update(keys, emb) == data
    else:
        assert len(data) == 8
    assert emb.shape == (keys.size, struct.unpack_from("<I", data, 4)[0] // 4)


@pytest.mark.parametrize("value_size", [2**32 - 4, 2**31, 2**31 - 4])
def test_a_huge_value_size_with_no_record_is_an_empty_update(value_size):
    # numpy raised ValueError building a record dtype this large, which
    # killed the consumer threads.
    keys, emb = decode_update(_headed(value_size, b""))
    assert keys.shape == (0,) and emb.shape == (0, value_size // 4)
    with pytest.raises(MalformedMessageError, match="whole number of"):
        decode_update(_headed(value_size, b"\0" * 16))


VALID = encode_update(np.arange(3), np.ones((3, 4), np.float32))


@pytest.mark.parametrize(
    "value, message",
    [
        (b"", "shorter than its 8-byte header"),
        (VALID[:5], "shorter than its 8-byte header"),
        (b"XXXX" + VALID[4:], "expected b'HCTR'"),
        (MAGIC + struct.pack("<I", 0), "not a positive multiple of 4"),
        (MAGIC + struct.pack("<I", 6) + b"\0" * 14, "not a positive multiple of 4"),
        (VALID[:-1], "not a whole number of 24-byte records"),
        (VALID + b"\0", "not a whole number of 24-byte records"),
    ],
)
def test_malformed(value, message):
    with pytest.raises(MalformedMessageError, match=message):
        decode_update(value)


def test_wrong_dim_and_non_finite():
    with pytest.raises(MalformedMessageError, match="dim 4, the table has dim 8"):
        decode_update(VALID, expected_dim=8)
    bad = encode_update(np.arange(1), np.array([[np.nan]], np.float32))
    with pytest.raises(MalformedMessageError, match="NaN"):
        decode_update(bad)


@pytest.mark.parametrize("value", [None, "HCTR\x04\0\0\0", 12345])
def test_a_value_that_is_not_bytes_is_malformed(value):
    with pytest.raises(MalformedMessageError, match="no value|not bytes"):
        decode_update(value)
