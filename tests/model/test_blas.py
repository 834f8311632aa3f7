"""model/blas.py: MKL's GEMM against numpy's products, and how it is selected."""

from __future__ import annotations

import numpy as np
import pytest

from tierserve.core.errors import ConfigError
from tierserve.model import blas
from tierserve.model.blas_threads import get_blas_threads, set_blas_threads

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


def _train_small_dlrm(steps: int) -> tuple[list[float], list[np.ndarray]]:
    """A small DLRM (bench.trainer.run's layers, narrower), same seed and batches: losses
    and final dense weights."""
    import tierserve.trainer as hugectr
    from tierserve.model.batch import Batch, SparseInput

    slots, dim, batch = 4, 8, 64
    solver = hugectr.CreateSolver(batchsize=batch, lr=0.01, i64_input_key=True, seed=3)
    reader = hugectr.DataReaderParams(data_reader_type=hugectr.DataReaderType_t.Norm,
                                      source=["unused.txt"])
    opt = hugectr.CreateOptimizer(optimizer_type=hugectr.Optimizer_t.AdaGrad,
                                  update_type=hugectr.Update_t.Local, epsilon=1e-7)
    model = hugectr.Model(solver, reader, opt)
    model.add(hugectr.Input(label_dim=1, label_name="label", dense_dim=5, dense_name="dense",
                            data_reader_sparse_param_array=[
                                hugectr.DataReaderSparseParam("s", 1, True, slots)]))
    model.add(hugectr.SparseEmbedding(
        embedding_type=hugectr.Embedding_t.DistributedSlotSparseEmbeddingHash,
        workspace_size_per_gpu_in_mb=1, embedding_vec_size=dim, combiner="sum",
        sparse_embedding_name="emb", bottom_name="s"))
    fc = hugectr.Layer_t.FusedInnerProduct
    model.add(hugectr.DenseLayer(layer_type=fc, bottom_names=["dense"], top_names=["b0"],
                                 num_output=32))
    model.add(hugectr.DenseLayer(layer_type=fc, bottom_names=["b0"], top_names=["b1"],
                                 num_output=dim))
    model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.Interaction,
                                 bottom_names=["b1", "emb"], top_names=["inter"]))
    model.add(hugectr.DenseLayer(layer_type=fc, bottom_names=["inter"], top_names=["t0"],
                                 num_output=16))
    model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.InnerProduct, bottom_names=["t0"],
                                 top_names=["t1"], num_output=1))
    model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.BinaryCrossEntropyLoss,
                                 bottom_names=["t1", "label"], top_names=["loss"]))
    model.compile()
    rng = np.random.default_rng(11)
    losses = []
    for _ in range(steps):
        keys = rng.integers(0, 200, size=batch * slots).astype(np.int64)
        losses.append(model.train_on_batch(Batch(
            label=(rng.random((batch, 1)) < 0.3).astype(np.float32),
            dense=rng.normal(size=(batch, 5)).astype(np.float32),
            sparse=(SparseInput(keys, np.arange(batch * slots + 1), slots),))))
    return losses, [np.array(p) for p in model.dense_parameters()]


@needs_mkl
def test_training_under_mkl_follows_numpy_blas(select):
    """The model's column-major weights and their gradients take MKL's path the same way as
    numpy's: a few training steps end in the same weights up to float32 rounding."""
    runs = {}
    for choice in ("numpy", "mkl"):
        select(choice)
        runs[choice] = _train_small_dlrm(steps=6)
    np.testing.assert_allclose(runs["mkl"][0], runs["numpy"][0], rtol=1e-4)
    for got, want in zip(runs["mkl"][1], runs["numpy"][1]):
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-5)
    assert not np.allclose(runs["numpy"][1][0], _train_small_dlrm(steps=1)[1][0])
