"""Embedding tables: pooling, gradients, updates, capacity, files and the hash index."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierserve.core.errors import CapacityExceededError, CorruptModelFileError, InvalidInputError
from tierserve.model.batch import SparseInput
from tierserve.ps.sparse_file import read_sparse_model, sparse_optimizer_name, write_sparse_model
from tierserve.trainer.embedding import (
    CsrLayout,
    Embedding_t,
    EmbeddingTable,
    KeyIndex,
    combine,
    embedding_gradients,
    key_uniform,
    max_rows_for_workspace,
)
from tierserve.trainer.embedding import table as table_module
from tierserve.trainer.optimizers import CreateOptimizer, Optimizer_t, Update_t

DIST = Embedding_t.DistributedSlotSparseEmbeddingHash
LOCAL = Embedding_t.LocalizedSlotSparseEmbeddingHash
ONE_HOT = Embedding_t.LocalizedSlotSparseEmbeddingOneHot
SGD = CreateOptimizer(optimizer_type=Optimizer_t.SGD)


def _csr(rows_of_keys: list[list[int]], slot_num: int, dtype=np.int64) -> SparseInput:
    keys = np.array([k for row in rows_of_keys for k in row], dtype=dtype)
    offsets = np.r_[0, np.cumsum([len(r) for r in rows_of_keys])].astype(np.int64)
    return SparseInput(keys, offsets, slot_num)


def _random_csr(rng, batch, slot_num, max_hot, key_range, dtype=np.int64):
    rows = [list(rng.integers(0, key_range, rng.integers(0, max_hot + 1)))
            for _ in range(batch * slot_num)]
    return rows, _csr(rows, slot_num, dtype)


def _table(kind=DIST, dim=4, mb=1, opt=SGD, **kw):
    return EmbeddingTable(kind, dim, mb, opt, **kw)


def _vector_of(table: EmbeddingTable) -> dict[int, np.ndarray]:
    exported = table.export()
    return {int(k): exported.embeddings[i] for i, k in enumerate(exported.keys)}


# ---- forward ---------------------------------------------------------------------------


@pytest.mark.parametrize("combiner", ["sum", "mean"])
@pytest.mark.parametrize("max_hot", [1, 3])
def test_forward_matches_naive_per_row_pooling(combiner, max_hot):
    rng = np.random.default_rng(0)
    rows, batch = _random_csr(rng, batch=7, slot_num=3, max_hot=max_hot, key_range=20)
    table = _table(combiner=combiner)
    out = table.forward(batch)
    assert out.shape == (7, 3, 4) and out.dtype == np.float32
    vec = _vector_of(table)
    for r, keys in enumerate(rows):
        expected = np.zeros(4, np.float32)
        for k in keys:
            expected += vec[int(k)]
        if combiner == "mean" and keys:
            expected /= len(keys)
        np.testing.assert_allclose(out[r // 3, r % 3], expected, rtol=1e-6, atol=1e-7)


def test_one_hot_and_fixed_width_batches_take_the_fast_paths():
    one = _csr([[1], [2], [3], [1]], slot_num=2)
    fixed = _csr([[1, 2], [2, 3], [3, 3], [1, 4]], slot_num=2)
    assert CsrLayout(one.row_offsets, 4).kind == "one_hot"
    assert CsrLayout(fixed.row_offsets, 8).kind == "fixed"
    table = _table(combiner="mean")
    vec_out = table.forward(fixed)
    vec = _vector_of(table)
    np.testing.assert_allclose(vec_out[1, 1], (vec[1] + vec[4]) / 2, rtol=1e-6)
    np.testing.assert_allclose(table.forward(one)[1, 1], vec[1], rtol=1e-6)


def test_empty_rows_give_zeros_and_empty_batches_work():
    table = _table()
    out = table.forward(_csr([[], [5], [], []], slot_num=2))
    np.testing.assert_array_equal(out[0, 0], 0)
    np.testing.assert_array_equal(out[1], 0)
    assert np.abs(out[0, 1]).sum() > 0
    empty = table.forward(_csr([[], []], slot_num=1))
    np.testing.assert_array_equal(empty, np.zeros((2, 1, 4), np.float32))
    table.backward(np.ones((2, 1, 4), np.float32), 0.1, 1)


def test_combine_is_a_free_function_for_inference():
    emb = np.arange(12, dtype=np.float32).reshape(4, 3)  # 4 keys, dim 3
    offsets = np.array([0, 1, 1, 4])  # batch 3, slot_num 1; the middle row is empty
    out = combine(emb, offsets, 1, "mean")
    np.testing.assert_allclose(out[:, 0], [[0, 1, 2], [0, 0, 0], [6, 7, 8]])
    with pytest.raises(InvalidInputError, match="combiner"):
        combine(emb, offsets, 1, "max")
    with pytest.raises(InvalidInputError, match="row_offsets"):
        combine(emb, np.array([0, 1, 3]), 1, "sum")


def test_bad_csr_is_rejected():
    table = _table()
    with pytest.raises(InvalidInputError, match="multiple of slot_num"):
        table.forward(SparseInput(np.array([1, 2, 3]), np.array([0, 1, 2, 3]), 2))
    with pytest.raises(InvalidInputError, match="decrease"):
        table.forward(SparseInput(np.array([1, 2, 3]), np.array([0, 2, 1, 3]), 1))
    with pytest.raises(InvalidInputError, match="integers"):
        table.forward(SparseInput(np.array([1.0]), np.array([0, 1]), 1))


# ---- gradients -------------------------------------------------------------------------


@pytest.mark.parametrize("combiner", ["sum", "mean"])
@pytest.mark.parametrize("max_hot", [1, 2, 4])
def test_gradient_aggregation_matches_finite_differences(combiner, max_hot):
    """loss = sum(W * combine(table[rows])); d loss / d table by central differences."""
    rng = np.random.default_rng(max_hot)
    slot_num, dim = 3, 2
    rows_of_keys, batch = _random_csr(rng, 5, slot_num, max_hot, key_range=6)  # many repeats
    keys = batch.keys
    n_rows = 6
    values = rng.standard_normal((n_rows, dim)).astype(np.float32)
    weight = rng.standard_normal((5, slot_num, dim)).astype(np.float32)
    layout = CsrLayout(batch.row_offsets, len(keys))

    def loss(v):
        pooled = combine(np.take(v, keys, axis=0).reshape(-1, dim), batch.row_offsets,
                         slot_num, combiner)
        return float((pooled.astype(np.float64) * weight).sum())

    stamp = np.zeros(n_rows, np.int64)
    rows, grads = embedding_gradients(keys, weight, layout, combiner, stamp)
    assert len(np.unique(rows)) == len(rows)
    analytic = np.zeros_like(values)
    analytic[rows] = grads
    eps = 0.5  # the loss is linear in the table: any step is exact up to rounding
    numeric = np.zeros_like(values)
    for i in range(n_rows):
        for d in range(dim):
            up, down = values.copy(), values.copy()
            up[i, d] += eps
            down[i, d] -= eps
            numeric[i, d] = (loss(up) - loss(down)) / (2 * eps)
    np.testing.assert_allclose(analytic, numeric, rtol=1e-4, atol=1e-4)
    untouched = np.setdiff1d(np.arange(n_rows), keys)
    np.testing.assert_array_equal(analytic[untouched], 0)


def test_repeated_keys_in_a_batch_sum_their_gradients_in_one_sgd_step():
    table = _table(combiner="sum")
    batch = _csr([[7], [7], [8, 7], [7]], slot_num=2)
    table.forward(batch)
    before = _vector_of(table)
    grad = np.zeros((2, 2, 4), np.float32)
    grad[0, 0], grad[0, 1], grad[1, 0], grad[1, 1] = 1.0, 2.0, 3.0, 4.0
    table.backward(grad, lr=0.1, step=1)
    after = _vector_of(table)
    np.testing.assert_allclose(after[7], before[7] - 0.1 * (1 + 2 + 3 + 4), rtol=1e-6)
    np.testing.assert_allclose(after[8], before[8] - 0.1 * 3, rtol=1e-6)


def test_mean_gradient_divides_by_the_row_count():
    table = _table(combiner="mean")
    table.forward(_csr([[1, 2, 3], [1]], slot_num=1))
    before = _vector_of(table)
    table.backward(np.ones((2, 1, 4), np.float32), lr=1.0, step=1)
    after = _vector_of(table)
    np.testing.assert_allclose(after[2], before[2] - 1 / 3, rtol=1e-6)
    np.testing.assert_allclose(after[1], before[1] - (1 / 3 + 1), rtol=1e-6)


def test_backward_applies_the_tables_optimizer_to_hit_rows_only():
    adam = CreateOptimizer(update_type=Update_t.Local)
    table = _table(opt=adam)
    table.forward(_csr([[1], [2]], slot_num=1))
    table.backward(np.ones((2, 1, 4), np.float32), lr=0.01, step=1)
    table.forward(_csr([[3], [2]], slot_num=1))
    before = _vector_of(table)
    table.backward(np.ones((2, 1, 4), np.float32), lr=0.01, step=2)
    after = _vector_of(table)
    np.testing.assert_array_equal(after[1], before[1])  # Local: row 1 not hit, not moved
    assert not np.allclose(after[2], before[2])
    # a fresh row's first Local Adam step, at global step 2 (HugeCTR's bias correction)
    step = 0.01 * np.sqrt(1 - 0.999**2) / (1 - 0.9**2) * 0.1 / (np.sqrt(0.001) + 1e-7)
    np.testing.assert_allclose(after[3], before[3] - step, rtol=1e-4)


def test_global_adam_moves_untouched_rows_and_reports_them_changed():
    table = _table(opt=CreateOptimizer(update_type=Update_t.Global))
    table.forward(_csr([[1], [2]], slot_num=1))
    table.backward(np.ones((2, 1, 4), np.float32), lr=0.01, step=1)
    table.incremental()
    table.forward(_csr([[3]], slot_num=1))
    before = _vector_of(table)
    table.backward(np.ones((1, 1, 4), np.float32), lr=0.01, step=2)
    after = _vector_of(table)
    assert not np.allclose(after[1], before[1])
    keys, _ = table.incremental()
    assert sorted(keys.tolist()) == [1, 2, 3]


def test_frozen_table_does_not_change_but_still_learns_keys():
    table = _table()
    table.freeze()
    out = table.forward(_csr([[1], [2]], slot_num=1))
    before = table.export().embeddings.copy()
    table.backward(np.ones_like(out), 0.5, 1)
    np.testing.assert_array_equal(table.export().embeddings, before)
    assert table.num_rows == 2 and table.incremental()[0].size == 0
    table.unfreeze()
    table.forward(_csr([[1], [2]], slot_num=1))
    table.backward(np.ones_like(out), 0.5, 2)
    assert not np.array_equal(table.export().embeddings, before)


def test_backward_without_forward_is_an_error():
    table = _table()
    with pytest.raises(InvalidInputError, match="forward"):
        table.backward(np.zeros((1, 1, 4), np.float32), 0.1, 1)
    table.forward(_csr([[1]], slot_num=1))
    with pytest.raises(InvalidInputError, match="shape"):
        table.backward(np.zeros((2, 1, 4), np.float32), 0.1, 1)


# ---- keys, initialisation, capacity ------------------------------------------------------


def test_hash_keys_beyond_any_dense_range_and_int32_keys():
    table = _table()
    huge = _csr([[2**62, -(2**63)], [2**62 + 1], [-5, 2**63 - 1]], slot_num=1)
    table.forward(huge)
    assert sorted(table.export().keys.tolist()) == sorted(
        [2**62, -(2**63), 2**62 + 1, -5, 2**63 - 1])
    small = _table(seed=3)
    out32 = small.forward(_csr([[1], [2**31 - 1]], slot_num=1, dtype=np.int32))
    out64 = _table(seed=3).forward(_csr([[1], [2**31 - 1]], slot_num=1))
    np.testing.assert_array_equal(out32, out64)
    assert small.export().keys.dtype == np.int64


def test_initialisation_is_a_function_of_seed_and_key_within_hugectrs_bound():
    a = _table(mb=2, seed=7)
    b = _table(mb=2, seed=7)
    a.forward(_csr([[1], [2], [3]], slot_num=1))
    b.forward(_csr([[3], [2], [1]], slot_num=1))  # other order, other rows
    va, vb = _vector_of(a), _vector_of(b)
    for k in (1, 2, 3):
        np.testing.assert_array_equal(va[k], vb[k])
    assert all(np.abs(v).max() <= 0.05 for v in va.values())  # HugeCTR's uniform(-0.05, 0.05)
    assert max(np.abs(v).max() for v in va.values()) > 0.01
    c = _table(mb=2, seed=8)
    c.forward(_csr([[1]], slot_num=1))
    assert not np.array_equal(_vector_of(c)[1], va[1])
    u = key_uniform(np.arange(20000), 0, 8)
    assert -1 <= u.min() < -0.99 and 0.99 < u.max() < 1 and abs(u.mean()) < 0.01


def test_localized_tables_record_slots_and_use_per_slot_bounds():
    table = _table(kind=LOCAL, slot_size_array=[4, 10000])
    table.forward(_csr([[1], [7, 9], [1], [9]], slot_num=2))  # 1 in slot 0; 7, 9 in slot 1
    exported = table.export()
    slots = dict(zip(exported.keys.tolist(), exported.slot_ids.tolist()))
    assert slots == {1: 0, 7: 1, 9: 1}
    vec = _vector_of(table)
    assert np.abs(vec[7]).max() <= np.sqrt(1 / 10000)
    assert np.abs(vec[1]).max() > 0.05  # slot 0's bound is sqrt(1/4) = 0.5
    plain = _table(kind=LOCAL)  # no slot sizes: HugeCTR's uniform(-0.05, 0.05)
    plain.forward(_csr([[1], [7]], slot_num=2))
    assert np.abs(plain.export().embeddings).max() <= 0.05
    with pytest.raises(InvalidInputError, match="slot_size_array"):
        table.forward(_csr([[1]], slot_num=1))


def test_one_hot_keys_are_rows_and_are_validated(monkeypatch):
    monkeypatch.setattr(table_module, "_INIT_CHUNK", 2)  # initialised chunk by chunk
    table = _table(kind=ONE_HOT, slot_size_array=[3, 2])
    assert table.num_rows == 5
    bounds = np.sqrt(1 / np.array([3, 3, 3, 2, 2], np.float32))
    np.testing.assert_allclose(table.export().embeddings,
                               key_uniform(np.arange(5), 0, 4) * bounds[:, None], rtol=1e-6)
    out = table.forward(_csr([[0], [4], [2], [3]], slot_num=2))
    vec = table.export()
    np.testing.assert_array_equal(vec.keys, np.arange(5))
    np.testing.assert_array_equal(vec.slot_ids, [0, 0, 0, 1, 1])
    np.testing.assert_array_equal(out[0, 1], vec.embeddings[4])
    with pytest.raises(InvalidInputError, match=r"\[0, 5\)"):
        table.forward(_csr([[5], [0]], slot_num=2))
    with pytest.raises(InvalidInputError, match="slot_size_array"):
        _table(kind=ONE_HOT)


def test_capacity_formula_and_error():
    assert max_rows_for_workspace(1, 16, 2) == (1 << 20) // (3 * 4 * 16)
    lazy = _table(dim=16, mb=1, opt=CreateOptimizer(update_type=Update_t.LazyGlobal))
    assert lazy.max_rows == (1 << 20) // (4 * 4 * 16)
    table = _table(dim=256, mb=1, opt=SGD, name="deep_emb")  # 1024 rows
    assert table.max_rows == 1024
    table.forward(SparseInput(np.arange(1000), np.arange(1001), 1))
    with pytest.raises(CapacityExceededError, match=r"'deep_emb'.*1030.*1024"):
        table.forward(SparseInput(np.arange(990, 1030), np.arange(41), 1))
    assert table.num_rows == 1000  # the failed batch added nothing
    with pytest.raises(CapacityExceededError):
        _table(kind=ONE_HOT, dim=256, mb=1, slot_size_array=[1000, 100])


# ---- files, incremental ------------------------------------------------------------------


@pytest.mark.parametrize("kind", [DIST, LOCAL])
def test_export_load_round_trip_through_the_sparse_model_folder(tmp_path, kind):
    kw = {"slot_size_array": [50, 50]} if kind is LOCAL else {}
    table = _table(kind=kind, opt=CreateOptimizer(), **kw)
    batch = _csr([[1, 2], [30], [2**40], [3, 1]], slot_num=2)
    out = table.forward(batch)
    table.backward(np.ones_like(out), 0.1, 1)
    folder = table.save(tmp_path / "m0_sparse_0.model")
    read = read_sparse_model(folder, 4)
    assert (read.slot_ids is not None) == (kind is LOCAL)
    fresh = _table(kind=kind, opt=CreateOptimizer(), seed=99, **kw)
    fresh.load(read)
    np.testing.assert_array_equal(fresh.forward(batch), table.forward(batch))
    if kind is LOCAL:
        np.testing.assert_array_equal(fresh.export().slot_ids, table.export().slot_ids)
    # optimizer state through its own file, and training continues identically
    opt_path = tmp_path / sparse_optimizer_name("m", 0, 0)
    table.save_optimizer_state(opt_path)
    fresh.load_optimizer_state_file(opt_path)
    for t in (table, fresh):
        o = t.forward(batch)
        t.backward(np.full_like(o, 0.5), 0.1, 2)
    np.testing.assert_array_equal(fresh.export().embeddings, table.export().embeddings)


def test_load_into_a_table_with_other_keys_and_bad_files(tmp_path):
    table = _table()
    table.forward(_csr([[5], [6]], slot_num=1))
    keys = np.array([6, 100], np.int64)
    emb = np.arange(8, dtype=np.float32).reshape(2, 4)
    write_sparse_model(tmp_path / "s", keys, emb)
    table.load(read_sparse_model(tmp_path / "s"))
    vec = _vector_of(table)
    np.testing.assert_array_equal(vec[6], emb[0])
    np.testing.assert_array_equal(vec[100], emb[1])
    assert table.num_rows == 3
    with pytest.raises(InvalidInputError, match="embedding_vec_size"):
        _table(dim=3).load(read_sparse_model(tmp_path / "s"))
    (tmp_path / "bad_opt").write_bytes(b"\0" * 13)
    with pytest.raises(CorruptModelFileError, match="bad_opt"):
        _table(opt=CreateOptimizer()).load_optimizer_state_file(tmp_path / "bad_opt")


def test_optimizer_state_file_layout(tmp_path):
    table = _table(opt=CreateOptimizer(update_type=Update_t.LazyGlobal), dim=2)
    out = table.forward(_csr([[11], [12]], slot_num=1))
    table.backward(np.ones_like(out), 0.1, 3)
    path = table.save_optimizer_state(tmp_path / "opt")
    raw = path.read_bytes()
    n, dim = 2, 2
    assert len(raw) == n * 8 + 2 * n * dim * 4 + n * 8
    keys = np.frombuffer(raw[:16], "<i8")
    np.testing.assert_array_equal(keys, [11, 12])
    m = np.frombuffer(raw[16:32], "<f4").reshape(2, 2)
    np.testing.assert_allclose(m, 0.1)  # (1 - beta1) * g
    prev = np.frombuffer(raw[-16:], "<i8")
    np.testing.assert_array_equal(prev, [3, 3])


def test_incremental_returns_rows_changed_since_last_call():
    table = _table()
    out = table.forward(_csr([[1], [2]], slot_num=1))
    table.backward(np.ones_like(out), 0.1, 1)
    keys, emb = table.incremental()
    assert sorted(keys.tolist()) == [1, 2] and emb.shape == (2, 4)
    assert table.incremental()[0].size == 0
    table.forward(_csr([[2], [3]], slot_num=1))
    table.backward(np.ones_like(out), 0.1, 2)
    keys, emb = table.incremental()
    assert sorted(keys.tolist()) == [2, 3]
    vec = _vector_of(table)
    for k, e in zip(keys, emb):
        np.testing.assert_array_equal(vec[int(k)], e)
    assert keys.dtype == np.int64 and emb.dtype == np.float32


# ---- the hash index ----------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(-(2**63), 2**63 - 1) | st.integers(0, 50), max_size=60),
                min_size=1, max_size=6))
def test_key_index_is_a_map_in_insertion_order(batches):
    index = KeyIndex()
    reference: dict[int, int] = {}
    for batch in batches:
        keys = np.array(batch, dtype=np.int64)
        rows, new_keys, first = index.lookup_or_insert(keys)
        for k in batch:
            reference.setdefault(k, len(reference))
        assert [reference[k] for k in batch] == rows.tolist()
        np.testing.assert_array_equal(keys[first], new_keys)
    assert index.keys.tolist() == list(reference)
    assert index.lookup(np.array([123456789012345], np.int64)).tolist() == (
        [reference.get(123456789012345, -1)])


def test_key_index_grows_through_many_rehashes():
    rng = np.random.default_rng(0)
    index = KeyIndex()
    keys = np.unique(rng.integers(-(2**62), 2**62, 200_000))
    rng.shuffle(keys)
    for chunk in np.array_split(keys, 7):
        index.lookup_or_insert(chunk)
    np.testing.assert_array_equal(index.lookup(keys), np.arange(len(keys)))
    assert (index.lookup(keys + 1) == -1).mean() > 0.99


def test_key_index_survives_long_probe_chains_and_wrap_around(monkeypatch):
    """Every key hashes to one of the last two slots: chains wrap and span many windows."""
    index = KeyIndex()

    def crowded_home(keys):
        return (index._mask - (keys & 1)).astype(np.int64)

    monkeypatch.setattr(index, "_home", crowded_home)
    keys = np.arange(0, 3000, 7, dtype=np.int64)
    for chunk in np.array_split(keys, 5):
        index.lookup_or_insert(chunk)
    np.testing.assert_array_equal(index.lookup(keys), np.arange(len(keys)))
    assert (index.lookup(keys + 1) == -1).all()


def _cupy_or_skip():
    cp = pytest.importorskip("cupy")
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("needs a CUDA device")
    except Exception:
        pytest.skip("needs a CUDA device")
    return cp


@pytest.mark.gpu
@pytest.mark.parametrize("update", [Update_t.Local, Update_t.Global, Update_t.LazyGlobal])
@pytest.mark.parametrize("max_hot", [1, 3])
def test_cupy_tables_train_like_numpy_tables(update, max_hot):
    cp = _cupy_or_skip()
    rng = np.random.default_rng(5)
    tables = {xp: _table(dim=8, opt=CreateOptimizer(update_type=update), combiner="mean", xp=xp)
              for xp in (np, cp)}
    for step in range(1, 5):
        _, batch = _random_csr(rng, 16, 3, max_hot, key_range=2**40)
        grad = rng.standard_normal((16, 3, 8)).astype(np.float32)
        outs = {}
        for xp, table in tables.items():
            out = table.forward(batch)
            outs[xp] = out.get() if xp is cp else out
            table.backward(xp.asarray(grad), 0.01, step)
        np.testing.assert_allclose(outs[cp], outs[np], rtol=1e-5, atol=1e-6)
    a, b = tables[np].export(), tables[cp].export()
    np.testing.assert_array_equal(a.keys, b.keys)
    np.testing.assert_allclose(a.embeddings, b.embeddings, rtol=1e-4, atol=1e-6)
    keys_np, _ = tables[np].incremental()
    keys_cp, _ = tables[cp].incremental()
    assert sorted(keys_np.tolist()) == sorted(keys_cp.tolist())
