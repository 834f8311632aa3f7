"""The embedding training cache (trainer/hugectr/etc.py): a model trained a keyset at a time through
a Staged (hash map) or Cached (RocksDB + bounded host cache) parameter server ends exactly
where the same model trained with whole tables in memory ends; the full tables are saved to
``sparse_models`` and load back (incremental training); epoch-mode ``set_source`` with keysets
trains each file list with its keyset; memory stays bounded for a table 4x the budget; bad
settings are refused naming them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hugectr_layout import keyset_bytes, parse_keyset
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from keyset_data import keyset_parts

import tierserve.trainer as hugectr
from tierserve.core.errors import ConfigError
from tierserve.ps.sparse_file import read_sparse_model
from tierserve.trainer.hugectr.etc import read_keyset, write_keyset

REPOSITORY = Path(__file__).resolve().parents[2]

SLOTS = 4
DIM = 8


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Two Norm file lists (different seeds, overlapping keys) and their keyset files."""
    return keyset_parts(tmp_path_factory.mktemp("etc_data"), SLOTS)


def _model(source, etc=None, optimizer="Adam", update="Local", workspace_mb=1, i64=True):
    solver = hugectr.CreateSolver(batchsize=128, batchsize_eval=128, lr=0.01,
                                  repeat_dataset=False, i64_input_key=i64, seed=5)
    reader = hugectr.DataReaderParams(data_reader_type=hugectr.DataReaderType_t.Norm,
                                      source=[source], check_type=hugectr.Check_t.Sum)
    opt = hugectr.CreateOptimizer(optimizer_type=getattr(hugectr.Optimizer_t, optimizer),
                                  update_type=getattr(hugectr.Update_t, update),
                                  initial_accu_value=0.01)
    model = hugectr.Model(solver, reader, opt, etc)
    model.add(hugectr.Input(label_dim=1, label_name="label", dense_dim=3, dense_name="dense",
                            data_reader_sparse_param_array=[
                                hugectr.DataReaderSparseParam("s", 1, True, SLOTS)]))
    model.add(hugectr.SparseEmbedding(
        embedding_type=hugectr.Embedding_t.LocalizedSlotSparseEmbeddingHash,
        workspace_size_per_gpu_in_mb=workspace_mb, embedding_vec_size=DIM, combiner="sum",
        sparse_embedding_name="emb", bottom_name="s", optimizer=opt))
    model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.Reshape, bottom_names=["emb"],
                                 top_names=["flat"], leading_dim=SLOTS * DIM))
    model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.Concat,
                                 bottom_names=["flat", "dense"], top_names=["cat"]))
    model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.InnerProduct, bottom_names=["cat"],
                                 top_names=["fc"], num_output=1))
    model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.BinaryCrossEntropyLoss,
                                 bottom_names=["fc", "label"], top_names=["loss"]))
    model.compile()
    return model


def _train_source(model, source):
    model.get_data_reader_train().set_source(source)
    steps = 0
    while model.train():
        steps += 1
    return steps


def _etc(kind, tmp_path, n_tables=1):
    types = [getattr(hugectr.TrainPSType_t, kind)] * n_tables
    models = [str(tmp_path / f"etc_table{i}.model") for i in range(n_tables)]
    if kind == "Staged":
        return hugectr.CreateETC(ps_types=types, sparse_models=models)
    return hugectr.CreateETC(ps_types=types, sparse_models=models,
                             local_paths=[str(tmp_path / "ssd")],
                             hmem_cache_configs=[hugectr.CreateHMemCache(1, block_size_mb=0.01)])


def _whole_table(model):
    t = model.tables[0].export()
    order = np.argsort(t.keys)
    state = {k: v[order] for k, v in model.tables[0].export_optimizer_state().items()}
    return t.keys[order], t.embeddings[order], t.slot_ids[order], state


@pytest.mark.parametrize("kind", ["Staged", "Cached"])
@pytest.mark.parametrize("optimizer,update", [("Adam", "Local"), ("Adam", "LazyGlobal"),
                                              ("AdaGrad", "Local")])
def test_training_through_the_cache_equals_whole_tables(kind, optimizer, update, sources,
                                                        tmp_path):
    plain = _model(sources[0][0], optimizer=optimizer, update=update)
    cached = _model(sources[0][0], _etc(kind, tmp_path), optimizer, update)
    etc = cached.get_embedding_training_cache()
    for source, keyset in [*sources, *sources]:  # two rounds: rows come back from the server
        _train_source(plain, source)
        etc.update(keyset)
        _train_source(cached, source)
        assert cached.tables[0].num_rows == len(np.fromfile(keyset, "<i8"))  # the working set
    np.testing.assert_allclose(cached.dense_parameters()[0], plain.dense_parameters()[0],
                               rtol=1e-6)
    cached.save_params_to_files(str(tmp_path / "m"), 4)
    saved = read_sparse_model(tmp_path / "etc_table0.model", DIM)
    keys, vectors, slots, state = _whole_table(plain)
    np.testing.assert_array_equal(saved.keys, keys)
    np.testing.assert_allclose(saved.embeddings, vectors, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(saved.slot_ids, slots)
    name = type(plain.tables[0].optimizer).__name__
    for k, v in state.items():
        dtype = np.int64 if v.dtype == np.int64 else np.float32
        got = np.fromfile(tmp_path / "etc_table0.model" / f"{name}.{k}", dtype).reshape(v.shape)
        np.testing.assert_allclose(got, v, rtol=1e-6, atol=1e-7)
    assert (tmp_path / "m_dense_4.model").is_file()


def test_a_saved_cache_table_is_trained_on_incrementally(sources, tmp_path):
    plain = _model(sources[0][0])
    first = _model(sources[0][0], _etc("Staged", tmp_path))
    for source, keyset in sources:
        _train_source(plain, source)
        first.get_embedding_training_cache().update(keyset)
        _train_source(first, source)
    first.save_params_to_files(str(tmp_path / "m"), 1)
    # a new model finds etc_table0.model and continues from it
    second = _model(sources[0][0], _etc("Staged", tmp_path))
    second.load_dense_weights(str(tmp_path / "m_dense_1.model"))
    second.load_dense_optimizer_states(str(tmp_path / "m_opt_dense_1.model"))
    second.engine.step = first.engine.step
    source, keyset = sources[0]
    _train_source(plain, source)
    second.get_embedding_training_cache().update(keyset)
    _train_source(second, source)
    second.get_embedding_training_cache().flush()
    keys, vectors, _, _ = _whole_table(plain)
    second.save_params_to_files(str(tmp_path / "m"), 2)
    saved = read_sparse_model(tmp_path / "etc_table0.model", DIM)
    np.testing.assert_array_equal(saved.keys, keys)
    np.testing.assert_allclose(saved.embeddings, vectors, rtol=1e-6, atol=1e-7)


def test_fit_trains_each_file_list_with_its_keyset(sources, tmp_path):
    plain = _model(sources[0][0])
    for source, _ in sources:
        _train_source(plain, source)
    model = _model(sources[0][0], _etc("Cached", tmp_path))
    model.set_source(source=[s for s, _ in sources], keyset=[k for _, k in sources])
    model.fit(num_epochs=1, display=1000, eval_interval=0, snapshot=0)
    np.testing.assert_allclose(model.dense_parameters()[0], plain.dense_parameters()[0],
                               rtol=1e-6)
    assert model.tables[0].num_rows == len(np.fromfile(sources[1][1], "<i8"))


def test_bad_cache_settings_are_refused(tmp_path, sources):
    with pytest.raises(ConfigError, match="2 ps_types for 1 sparse_models"):
        hugectr.CreateETC(ps_types=[hugectr.TrainPSType_t.Staged] * 2, sparse_models=["a"])
    with pytest.raises(ConfigError, match="Cached table needs local_paths"):
        hugectr.CreateETC(ps_types=[hugectr.TrainPSType_t.Cached], sparse_models=["a"],
                          hmem_cache_configs=[hugectr.CreateHMemCache(1)])
    with pytest.raises(ConfigError, match="target_hit_rate must be in"):
        hugectr.CreateHMemCache(2, 2.0)
    with pytest.raises(ConfigError, match="ps_types entries must be"):
        hugectr.CreateETC(ps_types=["SSD"], sparse_models=["a"])
    model = _model(sources[0][0], _etc("Staged", tmp_path))
    etc = model.get_embedding_training_cache()
    with pytest.raises(ConfigError, match="2 keyset files for 1 embedding tables"):
        etc.update([sources[0][1], sources[1][1]])
    with pytest.raises(ConfigError, match="keyset file .*missing.keyset does not exist"):
        etc.update(str(tmp_path / "missing.keyset"))
    (tmp_path / "odd.keyset").write_bytes(b"123")
    with pytest.raises(ConfigError, match="not a whole number of int64 keys"):
        etc.update(str(tmp_path / "odd.keyset"))
    with pytest.raises(ConfigError, match="no embedding training cache"):
        _model(sources[0][0]).get_embedding_training_cache()
    with pytest.raises(ConfigError, match="takes what hugectr.CreateETC returns"):
        _model(sources[0][0], etc={"ps_types": ["Staged"]})


# A table of 4x the memory budget trained through a Cached server, one keyset at a time, in
# a process of its own so the peak RSS (VmHWM) is this run's: bench/trainer/etc.py, small.
@pytest.mark.slow
def test_a_table_four_times_the_budget_trains_in_bounded_memory():
    workspace_mb, cache_mb = 24.0, 8.0
    done = subprocess.run(
        [sys.executable, "-m", "bench.trainer.etc", "--workspace-mb", str(workspace_mb),
         "--cache-mb", str(cache_mb), "--passes", "6", "--json"], capture_output=True,
        text=True, timeout=300, cwd=REPOSITORY,
        env={**os.environ, "TIERSERVE_FORCE_CPU": "1", "OPENBLAS_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(done.stdout.strip().splitlines()[-1])
    budget, table, growth = r["budget_bytes"], r["table_bytes"], r["peak_growth_bytes"]
    print(f"table {table / 2**20:.0f} MB = {table / budget:.1f}x the budget "
          f"{budget / 2**20:.0f} MB; peak RSS growth {growth / 2**20:.0f} MB "
          f"({growth / budget:.2f}x the budget)")
    assert table >= 4 * budget
    # beyond the budget (RocksDB's memtables and block cache are inside it): the working
    # table's key index (about 10 MB here) and one batch's temporaries (about 17 MB)
    fixed = 48 << 20
    assert growth <= 1.5 * budget + r["dense_bytes"] + fixed
    assert growth < table  # the table does not sit in memory


def test_key_index_reserve_sizes_the_index_once():
    from tierserve.trainer.embedding import KeyIndex

    index = KeyIndex()
    index.insert(np.array([7, 3], dtype=np.int64))
    index.reserve(5000)
    slots, row_keys = index._slots, index._row_keys
    keys = np.arange(100, 5098, dtype=np.int64)
    rows = index.insert(keys)
    assert index._slots is slots and index._row_keys is row_keys  # nothing regrown
    np.testing.assert_array_equal(index.lookup(np.array([7, 3], dtype=np.int64)), [0, 1])
    np.testing.assert_array_equal(index.lookup(keys), rows)
    np.testing.assert_array_equal(rows, np.arange(2, 5000))


def test_flush_writes_the_working_set_back_without_reloading_it(sources, tmp_path):
    model = _model(sources[0][0], _etc("Cached", tmp_path))
    etc = model.get_embedding_training_cache()
    source, keyset = sources[0]
    etc.update(keyset)
    _train_source(model, source)
    working = model.tables[0]
    before = working.export()
    etc.flush()
    assert model.tables[0] is working  # not emptied and filled again from the server
    assert etc.total_rows(0) == working.num_rows
    rows, found = etc.servers[0].get(np.asarray(before.keys, dtype=np.int64))
    assert found.all()
    np.testing.assert_array_equal(rows[:, :DIM], before.embeddings)


def test_rocksdb_memory_is_counted_in_the_host_cache_budget(tmp_path):
    from tierserve.trainer.hugectr.etc import TableServer, TrainPSType_t, rocksdb_memory

    model = _model("unused.txt")
    from tierserve.trainer.hugectr.etc import _RowLayout

    layout = _RowLayout(model.tables[0])
    for mb in (0.5, 8, 32, 256):
        config = hugectr.CreateHMemCache(1, block_size_mb=mb)
        server = TableServer("t", TrainPSType_t.Cached, layout, str(tmp_path / f"db{mb}"),
                             config)
        try:
            write_buffer, block_cache = rocksdb_memory(config.capacity_bytes)
            # RocksDB's two memtables and its block cache, and the cached rows at their worst
            # (the hash map's fill and an eviction's second copy), fit the configured cache
            rows = server.cache_rows * (4 * layout.width + 8) / 0.7 * 2
            assert 2 * write_buffer + block_cache + rows <= config.capacity_bytes
            assert server.cache_rows >= 1
        finally:
            server.close()


#: Measures update's transient memory with tracemalloc in a process of its own: tracemalloc
#: counts the allocations of every thread, and in a whole-suite run threads other tests
#: left running (consumers, servers, producers) allocate during the update, the more so
#: on a loaded machine, where the update takes longer.
TRANSIENT = """
import sys, tracemalloc
from pathlib import Path
import numpy as np
sys.path[:0] = sys.argv[2:]
from test_etc import _etc, _model
tmp = Path(sys.argv[1])
keys = np.arange(10**6, 10**6 + 400_000, dtype="<i8")
keys.tofile(tmp / "keyset")
model = _model("unused.txt", _etc("Staged", tmp), workspace_mb=40)
etc = model.get_embedding_training_cache()
tracemalloc.start()
etc.update(str(tmp / "keyset"))
current, peak = tracemalloc.get_traced_memory()
print(peak - current, keys.nbytes)
"""


def test_update_streams_the_keyset_instead_of_reading_it_whole(tmp_path):
    """The transient memory of update (beyond the working table it fills) stays below the
    keyset's own size: the keys are read a chunk at a time, not whole and then sorted."""
    here = Path(__file__).resolve().parent
    done = subprocess.run(
        [sys.executable, "-c", TRANSIENT, str(tmp_path), str(here), str(here.parent)],
        capture_output=True, text=True, timeout=300, cwd=REPOSITORY,
        env={**os.environ, "TIERSERVE_FORCE_CPU": "1"})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    transient, keyset = map(int, done.stdout.split()[-2:])
    assert transient < keyset  # 3.2 MB


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(i64=st.booleans(), n=st.integers(1, 200), seed=st.integers(0, 2**32 - 1))
def test_keyset_files_in_the_model_key_width_both_ways(tmp_path, i64, n, seed):
    """A keyset is the keys, raw, in the model's key type (HugeCTR's load_keyset_from_file
    reads sizeof(TypeKey) bytes a key; criteo2hugectr writes uint32)."""
    keys = np.random.default_rng(seed).choice(2**62 if i64 else 2**32, n, replace=False)
    path = tmp_path / f"{seed}.keyset"
    path.write_bytes(keyset_bytes(keys.tolist(), i64))
    assert read_keyset(path, i64).tolist() == keys.tolist()
    write_keyset(path, keys, i64)
    assert path.read_bytes() == keyset_bytes(keys.tolist(), i64)
    assert parse_keyset(path.read_bytes(), i64) == keys.tolist()


def test_a_32_bit_model_trains_with_uint32_keysets(tmp_path):
    """A model with i64_input_key=False (HugeCTR's default) reads its keysets as uint32 keys,
    as HugeCTR writes them; they were read as int64, pairing keys up."""
    pairs = keyset_parts(tmp_path / "data", SLOTS, parts=1, i64_input_key=False)
    source, keyset = pairs[0]
    keys = np.frombuffer(Path(keyset).read_bytes(), "<u4")
    model = _model(source, _etc("Staged", tmp_path), i64=False)
    etc = model.get_embedding_training_cache()
    for _ in range(2):  # the second time the keyset's rows come back from the server
        etc.update(keyset)
        assert _train_source(model, source) == 1024 // 128
    etc.update(keyset)
    assert model.tables[0].num_rows == keys.size
    assert np.array_equal(np.sort(model.tables[0].export().keys), np.sort(keys))
    wide = tmp_path / "wide.keyset"
    keys.astype("<i8").tofile(wide)
    with pytest.raises(ConfigError, match="holds int64 keys .* i64_input_key=False"):
        model.get_embedding_training_cache().update(str(wide))
    with pytest.raises(ConfigError, match="does not fit a uint32 key"):
        write_keyset(tmp_path / "x.keyset", [2**32], i64_input_key=False)
