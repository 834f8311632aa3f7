"""model/blas.py: MKL's GEMM against numpy's products, and how it is selected."""

from __future__ import annotations

import numpy as np
import pytest

from tierserve.core.errors import ConfigError
from tierserve.model import blas
from tierserve.trainer.blas_threads import get_blas_threads, set_blas_threads

from .test_layer_gradients import _check_layer

needs_mkl = pytest.mark.skipif(not blas.mkl_available(),
                               reason="MKL (the mkl extra) is not installed")


@pytest.fixture
def select(monkeypatch):
    """Set TIERSERVE_BLAS for one test; the choice is made again afterwards."""

    def choose(value: str) -> None:
        monkeypatch.setenv("TIERSERVE_BLAS", value)
        blas.blas_threads_changed()

    yield choose
    monkeypatch.delenv("TIERSERVE_BLAS", raising=False)
    blas.blas_threads_changed()


@needs_mkl
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(7, 5, 3), (300, 13, 64), (1, 4, 1), (2, 1, 9)])
@pytest.mark.parametrize("orders", ["CC", "CF", "FC", "FF"])
def test_mkl_products_equal_float64_numpy(select, dtype, shape, orders):
    select("mkl")
    assert blas.uses_mkl()
    m, k, n = shape
    rng = np.random.default_rng(m * 100 + k)
    a64, b64 = rng.normal(size=(m, k)), rng.normal(size=(k, n))
    a = np.asarray(a64.astype(dtype), order=orders[0])
    b = np.asarray(b64.astype(dtype), order=orders[1])
    c = blas.matmul(a, b)
    assert c.dtype == dtype and c.shape == (m, n) and c.flags.c_contiguous
    tol = 1e-5 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(c, a64 @ b64, rtol=tol, atol=tol * k)


@needs_mkl
def test_transposed_views_and_strided_operands(select):
    select("mkl")
    rng = np.random.default_rng(3)
    x = rng.normal(size=(40, 9)).astype(np.float32)
    g = rng.normal(size=(40, 6)).astype(np.float32)
    w = np.asfortranarray(rng.normal(size=(9, 6)).astype(np.float32))
    ref = x.astype(np.float64)
    np.testing.assert_allclose(blas.matmul(g.T, x), g.T.astype(np.float64) @ ref, rtol=1e-5,
                               atol=1e-4)
    np.testing.assert_allclose(blas.matmul(g, w.T), g @ w.T.astype(np.float64), rtol=1e-5,
                               atol=1e-4)
    strided = x[::2]  # neither C- nor Fortran-contiguous: numpy's product
    np.testing.assert_allclose(blas.matmul(strided, w), strided @ w, rtol=1e-6)


@needs_mkl
@pytest.mark.parametrize("case", [
    ({"type": "InnerProduct", "fc_param": {"num_output": 4}}, [(5,)]),
    ({"type": "InnerProduct", "fc_param": {"num_output": 3}}, [(2, 4)]),
    ({"type": "FusedInnerProduct", "fc_param": {"num_output": 6}}, [(7,)]),
    ({"type": "FusedInnerProduct", "fc_param": {"num_output": 1}, "activation": "Non"}, [(3,)]),
])
@pytest.mark.parametrize("batch", [1, 5])
def test_dense_layer_gradients_under_mkl(select, case, batch):
    select("mkl")
    config, shapes = case
    _check_layer(config, shapes, batch, seed=batch)


def test_a_bad_setting_is_refused_by_name(select):
    select("openblas-please")
    with pytest.raises(ConfigError, match="TIERSERVE_BLAS='openblas-please'"):
        blas.uses_mkl()


def test_numpy_setting_never_uses_mkl(select):
    select("numpy")
    assert not blas.uses_mkl()
    a = np.ones((3, 2), dtype=np.float32)
    np.testing.assert_array_equal(blas.matmul(a, a.T), a @ a.T)


def test_auto_follows_numpy_blas_thread_count(select):
    before = get_blas_threads()
    if before is None:
        pytest.skip("numpy's BLAS is not OpenBLAS: its thread count cannot be set")
    select("auto")
    try:
        set_blas_threads(2)
        assert not blas.uses_mkl()
        set_blas_threads(1)
        assert blas.uses_mkl() == blas.mkl_available()
    finally:
        set_blas_threads(before)
