"""The compiled decoding of compact rows (ps/row_kernels.py) in each kernel that runs it:
the whole-array decode, the hash map's lookup and the embedding cache's gather, bit for bit
against a straightforward numpy reading of the stored words (docs/formats.md, 10), for dims
with and without whole 16-value vectors."""

from __future__ import annotations

import numpy as np
import pytest

from tierserve.cache import cpu_kernels
from tierserve.ps import row_kernels
from tierserve.ps.hash_map import HashMapConfig
from tierserve.ps.row_codec import RowCodec
from tierserve.ps.tier_registry import create_tier

DIMS = [1, 15, 16, 17, 33, 128]
ROWS = 300


def _words(dtype: str, dim: int, rng) -> np.ndarray:
    """Stored words of ``ROWS`` rows: every finite half (subnormals, both zeros) over the
    float16 rows; random bytes, scales and biases (zero, negative, tiny, huge) for int8."""
    codec = RowCodec(dtype, dim)
    raw = np.zeros((ROWS, codec.words * 4), np.uint8)
    if dtype == "float16":
        halves = np.arange(2**16, dtype=np.uint16)
        halves = halves[np.isfinite(halves.view(np.float16))]
        raw[:, : 2 * dim] = rng.choice(halves, (ROWS, dim)).view(np.uint8)
    else:
        scale = rng.choice(np.array([0.0, 1e-38, 0.003, 1.5, 1e30], np.float32), ROWS)
        bias = rng.standard_normal(ROWS).astype(np.float32) * rng.choice([1e-3, 1.0, 1e6], ROWS)
        raw[:, :8] = np.stack([scale, bias], axis=1).astype("<f4").view(np.uint8)
        raw[:, 8 : 8 + dim] = rng.integers(0, 256, (ROWS, dim), dtype=np.uint8)
    return raw.view(np.float32)


def _reference(dtype: str, dim: int, words: np.ndarray) -> np.ndarray:
    raw = words.view(np.uint8)
    if dtype == "float16":
        return np.ascontiguousarray(raw[:, : 2 * dim]).view("<f2").astype(np.float32)
    scale_bias = np.ascontiguousarray(raw[:, :8]).view("<f4")
    q = raw[:, 8 : 8 + dim].astype(np.float32)
    return q * scale_bias[:, :1] + scale_bias[:, 1:2]  # float32 multiply, then add


@pytest.fixture(params=["float16", "int8"])
def dtype(request):
    return request.param


@pytest.mark.parametrize("dim", DIMS)
def test_decode_rows_matches_numpy(dtype, dim):
    words = _words(dtype, dim, np.random.default_rng(dim))
    out = np.empty((ROWS, dim), np.float32)
    row_kernels.decode_rows(words, RowCodec(dtype, dim).layout, out)
    want = _reference(dtype, dim, words)
    np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))  # -0.0 too


@pytest.mark.parametrize("dim", DIMS)
def test_hash_map_lookup_decodes_as_numpy(dtype, dim):
    rng = np.random.default_rng(dim)
    words = _words(dtype, dim, rng)
    codec = RowCodec(dtype, dim)
    keys = rng.permutation(10 * ROWS)[:ROWS].astype(np.int64)
    tier = create_tier(HashMapConfig())
    tier.create_table("t", codec.words)
    tier.load_table("t", keys, words)
    order = rng.permutation(ROWS)
    probe = np.concatenate([keys[order], [-7]])  # and one key it does not hold
    got, found = tier.lookup_decoded("t", probe, codec)
    assert found.tolist() == [True] * ROWS + [False]
    want = _reference(dtype, dim, words)[order]
    np.testing.assert_array_equal(got[:ROWS].view(np.uint32), want.view(np.uint32))
    np.testing.assert_array_equal(got[ROWS], 0.0)
    tier.close()


@pytest.mark.parametrize("dim", DIMS)
def test_cache_gather_decodes_hits_as_numpy(dtype, dim):
    rng = np.random.default_rng(dim)
    words = _words(dtype, dim, rng)
    slots = rng.integers(0, ROWS, 2 * ROWS).astype(np.int64)
    hit = rng.random(slots.size) < 0.8
    out = np.full((slots.size, dim), 7.0, np.float32)
    ticks = np.zeros(ROWS, np.uint32)
    cpu_kernels.gather(words, ticks, slots, hit, out, 3, RowCodec(dtype, dim).layout)
    want = _reference(dtype, dim, words)[slots]
    np.testing.assert_array_equal(out[hit].view(np.uint32), want[hit].view(np.uint32))
    np.testing.assert_array_equal(out[~hit], 7.0)  # misses left untouched
    assert (ticks[slots[hit]] == 3).all()
