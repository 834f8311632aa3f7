import numpy as np
import pytest

from tierserve.ps.aligned import LINE, cache_aligned


@pytest.mark.parametrize("shape", [(1, 16), (1000, 16), (4097, 3), (0, 16)])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_starts_on_a_cache_line_with_the_shape_asked(shape, dtype):
    a = cache_aligned(shape, dtype)
    assert a.shape == shape and a.dtype == dtype and a.flags.c_contiguous
    # An empty array has no first byte to place (numpy may point it anywhere).
    assert a.size == 0 or a.ctypes.data % LINE == 0


def test_zeros_are_zero_and_arrays_are_independent():
    a = cache_aligned((513, 16), np.float32, zeros=True)
    b = cache_aligned((513, 16), np.float32, zeros=True)
    assert not a.any()
    a[...] = 1.0
    assert not b.any()
