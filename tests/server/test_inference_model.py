"""InferenceModel against the trainer that produced the model (same rows, same answers)."""

import gc
import json
import tracemalloc

import numpy as np
import pytest

from tierserve.clients.demo_model import train_demo_model
from tierserve.core.errors import ConfigError, CorruptModelFileError
from tierserve.ps.config import load_ps_config
from tierserve.server.inference_model import InferenceParams
from tierserve.server.runtime.loader import RepositoryLoader
from tierserve.trainer.evaluation import auc, logloss
from tierserve.trainer.hugectr.inference_data import epoch_batches, wrapped_batches
from tierserve.trainer.hugectr.inference_model import InferenceModel, InferenceSession


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return train_demo_model(tmp_path_factory.mktemp("im"), iterations=40, batch_size=256)


def _params(demo, **kw):
    values = dict(
        model_name="dlrm", max_batchsize=128, hit_rate_threshold=0.9,
        dense_model_file=str(demo.dense_file),
        sparse_model_files=[str(f) for f in demo.sparse_files],
        use_gpu_embedding_cache=kw.pop("cache", False), cache_size_percentage=0.5,
        i64_input_key=True, volatile_db={"type": "hash_map"},
    )  # fmt: skip
    values.update(kw)
    return InferenceParams(**values)


@pytest.mark.parametrize("cache", [False, True])
def test_predict_equals_trainer_and_wraps_around(demo, cache):
    model = InferenceModel(str(demo.graph), _params(demo, cache=cache))
    try:
        preds = model.predict(3, demo.data_source, "Norm", "Sum")
        assert preds.shape == (384, 1)
        batches = list(wrapped_batches(model.graph, demo.data_source, "Norm", "Sum", None, 128, 3))
        trainer = np.concatenate([demo.model.predict_batch(b) for b in batches])
        assert np.abs(preds - trainer).max() <= 1e-5
        if cache:
            assert set(model.stats()["cache_hit_rate"]) == {"sparse_embedding1"}
            # The dense network runs where the cache is (numpy here, cupy on a GPU).
            assert model.xp is model.cache.xp
            assert {type(w) for layer in model.network.params for w in layer} == {
                model.xp.ndarray
            }
        else:
            assert model.xp is np
    finally:
        model.close()


def test_predict_wraps_past_the_end_of_the_dataset(demo, tmp_path):
    model = InferenceModel(str(demo.graph), _params(demo))
    try:
        rows = sum(
            b.batch_size for b in epoch_batches(model.graph, demo.eval_source, "Norm", "Sum")
        )
        num_batches = rows // 128 + 3  # past the end: starts over
        preds = model.predict(num_batches, demo.eval_source, "Norm", "Sum")
        assert preds.shape == (128 * num_batches, 1)
        np.testing.assert_allclose(preds[rows:], preds[: 128 * num_batches - rows], atol=1e-6)
        value = model.evaluate(8, demo.eval_source, "Norm", "Sum")
        assert 0.5 < value <= 1.0
    finally:
        model.close()


def test_auc_and_logloss():
    labels = np.array([0, 0, 1, 1], dtype=np.float32)
    assert auc(labels, np.array([0.1, 0.4, 0.35, 0.8])) == pytest.approx(0.75)
    assert logloss(labels, np.array([0.0, 0.0, 1.0, 1.0])) < 1e-6


def test_inference_session_old_api(demo, tmp_path):
    graph = json.loads(demo.graph.read_text())
    graph["inference"] = {
        "dense_model_file": str(demo.dense_file),
        "sparse_model_file": [str(f) for f in demo.sparse_files],
    }
    config = tmp_path / "inference.json"
    config.write_text(json.dumps(graph))
    session = InferenceSession(str(config), 0, None)
    batch = next(iter(wrapped_batches(session.model.graph, demo.data_source, "Norm", "Sum",
                                      None, 2, 1)))  # fmt: skip
    out = session.predict(
        batch.dense.reshape(-1).tolist(),
        batch.sparse[0].keys.tolist(),
        batch.sparse[0].row_offsets.tolist(),
    )
    np.testing.assert_allclose(out, demo.model.predict_batch(batch).reshape(-1), atol=1e-5)
    session.model.close()


def test_bad_files_are_clear_errors(demo, tmp_path):
    broken = tmp_path / "dense.model"
    broken.write_bytes(b"\0" * 12)
    with pytest.raises(CorruptModelFileError, match="holds 3 float32 values"):
        InferenceModel(str(demo.graph), _params(demo, dense_model_file=str(broken)))
    with pytest.raises(ConfigError, match="sparse model files"):
        InferenceModel(str(demo.graph), _params(demo, sparse_model_files=[]))
    with pytest.raises(ConfigError, match="max_batchsize"):
        InferenceParams("m", 0, 0.9, "d", ["s"], False, 0.5, True)


def test_parquet_with_slot_sizes_equals_norm(demo, tmp_path):
    """The same generated rows as Norm (global keys) and Parquet (slot-local keys plus
    slot_size_array) predict the same."""
    import tierserve.trainer as hugectr
    from tierserve.clients.demo_model import DENSE_DIM, SLOT_SIZES

    outs = {}
    for fmt in ("Norm", "Parquet"):
        params = hugectr.DataGeneratorParams(
            format=getattr(hugectr.DataReaderType_t, fmt), label_dim=1, dense_dim=DENSE_DIM,
            num_slot=len(SLOT_SIZES), i64_input_key=True,
            source=str(tmp_path / fmt / "train" / "_file_list.txt"),
            eval_source=str(tmp_path / fmt / "eval" / "_file_list.txt"),
            slot_size_array=SLOT_SIZES, nnz_array=[1] * len(SLOT_SIZES), num_files=1,
            eval_num_files=1, num_samples_per_file=1024, num_samples=1024,
            eval_num_samples=512, seed=3,
        )  # fmt: skip
        source = hugectr.DataGenerator(params).generate().eval.source
        model = InferenceModel(str(demo.graph), _params(demo))
        try:
            slots = SLOT_SIZES if fmt == "Parquet" else None
            check = "Sum" if fmt == "Norm" else "Non"
            outs[fmt] = model.predict(3, source, fmt, check, slots)
        finally:
            model.close()
    np.testing.assert_array_equal(outs["Norm"], outs["Parquet"])


def test_tiers_in_the_params_warn_when_a_parameter_server_is_given(demo):
    """InferenceModel(graph, params, parameter_server) reads that server's tiers: the
    params' own tier settings, unused, warn naming themselves (none is accepted silently)."""
    from tierserve.core.compat import HugeCTRCompatibilityWarning, reset_warnings

    own = InferenceModel(str(demo.graph), _params(demo))
    try:
        reset_warnings()
        with pytest.warns(HugeCTRCompatibilityWarning, match="InferenceParams.volatile_db"):
            other = InferenceModel(str(demo.graph), _params(demo, model_name="dlrm2"),
                                   parameter_server=own.parameter_server)  # fmt: skip
        other.close()
    finally:
        own.close()


def _held_bytes(run) -> int:
    """Bytes of Python and numpy memory still allocated after ``run()`` returned."""
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    run()
    gc.collect()
    return tracemalloc.get_traced_memory()[0] - before


def test_a_served_model_holds_no_memory_of_a_batch_it_answered(tiny_repository):
    """A model as the server loads it (RepositoryLoader: ``InferenceModel.from_config``)
    keeps none of a batch's tensors once it answered: a 4,096-row batch's intermediate
    tensors (7.3 MiB here) stayed resident until the next batch replaced them, so one
    large request kept the server at its peak memory.  check_out_tensor refuses there."""
    repo = tiny_repository(max_batch_size=4096)
    loader = RepositoryLoader()
    servable = loader("dlrm", "1", repo / "dlrm" / "1", load_ps_config(repo / "ps.json"))
    rng = np.random.default_rng(0)

    def batch(rows: int) -> dict:
        return {"DES": rng.random((rows, 13), dtype=np.float32),
                "CATCOLUMN": rng.integers(0, 5000, (rows, 8)).astype(np.int64)}  # fmt: skip

    large, small = batch(4096), batch(1)
    tracemalloc.start()
    try:
        servable.execute(servable.prepare(large))  # the caches take in its keys
        servable.execute(servable.prepare(small))
        held = _held_bytes(lambda: servable.execute(servable.prepare(large)))
        assert held < 256 << 10, f"{held / 2**20:.1f} MiB held after a 4,096-row batch"
        with pytest.raises(ConfigError, match="keeps no tensors"):
            servable.model.check_out_tensor(servable.model.table_names[0])
    finally:
        tracemalloc.stop()
        servable.discard()
        servable.close()
        loader.close()


@pytest.mark.parametrize("distinct", [False, True])
@pytest.mark.parametrize("combiner", ["sum", "mean"])
def test_embeddings_of_ragged_rows_pool_each_rows_own_keys(demo, combiner, distinct):
    """Rows of 0, 1, 2 and 3 keys: each table's pooled embeddings against the straightforward
    sum / mean of the looked-up vectors per row; with repeated keys, and with sorted distinct
    ones (whose inverse is the identity and is not gathered)."""
    import dataclasses

    from tierserve.model.batch import SparseInput

    model = InferenceModel(str(demo.graph), _params(demo))
    try:
        batch = next(iter(wrapped_batches(model.graph, demo.data_source, "Norm", "Sum", None, 8, 1)))
        sparse = batch.sparse[0]
        rows = len(sparse.row_offsets) - 1
        counts = np.arange(rows) % 4  # ragged: 0 .. 3 keys per row
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        keys = np.resize(sparse.keys, int(offsets[-1])).astype(sparse.keys.dtype)
        if distinct:
            keys = np.sort(sparse.keys)[0] + np.arange(keys.size, dtype=keys.dtype)
        ragged = SparseInput(keys, offsets, sparse.slot_num)
        batch = dataclasses.replace(batch, sparse=(ragged, *batch.sparse[1:]))
        for i in range(len(model.tables)):
            model.tables[i] = dataclasses.replace(model.tables[i], combiner=combiner)
        got = model.embeddings(batch)
        table = model._table_input.index(0)
        vectors = model.lookup(table, keys)
        want = np.zeros((rows, vectors.shape[1]), np.float32)
        for r in range(rows):
            row = vectors[offsets[r] : offsets[r + 1]]
            if row.size:
                want[r] = row.sum(axis=0) if combiner == "sum" else row.mean(axis=0)
        np.testing.assert_allclose(
            np.asarray(got[table]).reshape(rows, -1), want, rtol=1e-6, atol=1e-6)
    finally:
        model.close()
