"""HugeCTR's inference parameters as its own scripts pass them: ``device_id``, a RocksDB path
on the default (disabled) persistent tier, ``backend=``, fractional refresh intervals and
``InferenceSession.refresh_embedding_cache``."""

import warnings

import numpy as np
import pytest

from tierserve.clients.demo_model import train_demo_model
from tierserve.core.compat import HugeCTRCompatibilityWarning, reset_warnings
from tierserve.core.errors import ConfigError
from tierserve.ps.config_base import DisabledConfig
from tierserve.ps.params import PersistentDatabaseParams, VolatileDatabaseParams
from tierserve.ps.rocksdb_tier import RocksDBConfig
from tierserve.server.inference_model import InferenceModel, InferenceParams
from tierserve.trainer.hugectr.inference import CreateInferenceSession
from tierserve.trainer.hugectr.inference_data import wrapped_batches


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return train_demo_model(tmp_path_factory.mktemp("ip"), iterations=20, batch_size=256)


def _params(demo, **kw):
    values = dict(
        model_name="dlrm", max_batchsize=64, hit_rate_threshold=0.9,
        dense_model_file=str(demo.dense_file),
        sparse_model_files=[str(f) for f in demo.sparse_files],
        use_gpu_embedding_cache=True, cache_size_percentage=0.5, i64_input_key=True,
        volatile_db=VolatileDatabaseParams(type="hash_map"),
    )  # fmt: skip
    values.update(kw)
    return InferenceParams(**values)


def test_device_id_is_a_field_and_places_the_session(demo):
    params = _params(demo, device_id=3)
    assert params.device_id == 3
    assert InferenceParams(**{**params.model_dump(exclude={"device_id"})}).device_id == 0
    model = InferenceModel(str(demo.graph), params)  # only device_id given: it is the device
    try:
        assert model.model_config.deployed_device_list == [3]
    finally:
        model.close()
    # With both, the model serves deployed_devices and the session device_id, as HugeCTR.
    both = _params(demo, device_id=2, deployed_devices=[5])
    model = InferenceModel(str(demo.graph), both)
    try:
        assert model.model_config.deployed_device_list == [5]
    finally:
        model.close()
    session = CreateInferenceSession(str(demo.graph), both)
    try:
        assert session.model.model_config.deployed_device_list == [2]
    finally:
        session.model.close()
    with pytest.raises(ConfigError, match="device_id"):
        _params(demo, device_id=-1)


def test_disabled_persistent_tier_takes_a_path_and_warns():
    """HugeCTR's wdl_multitable_test sets a RocksDB path on the default, disabled, tier."""
    reset_warnings()
    params = PersistentDatabaseParams(path="/somewhere/rocksdb")
    with pytest.warns(HugeCTRCompatibilityWarning, match="PersistentDatabaseParams.path"):
        config = params.to_config()
    assert isinstance(config, DisabledConfig)
    # The binding's keyword for the type is ``backend``; an enabled tier uses the path.
    rocks = PersistentDatabaseParams(backend="rocks_db", path="/somewhere/rocksdb")
    assert isinstance(rocks.to_config(), RocksDBConfig)
    assert rocks.to_config().path == "/somewhere/rocksdb"
    with pytest.raises(ConfigError, match="once"):
        PersistentDatabaseParams(backend="rocks_db", type="rocks_db")


def test_a_fractional_refresh_interval_reaches_the_cache(demo):
    """0.5 s is not 0 (never): it arrives as 0.5 at the embedding cache that refreshes."""
    model = InferenceModel(str(demo.graph), _params(demo, refresh_interval=0.5,
                                                    refresh_delay=0.25))
    try:
        assert model.model_config.refresh_interval == 0.5
        caches = [model.cache.cache(i) for i in range(len(model.tables))]
        assert [(c.refresh_interval, c.refresh_delay) for c in caches] == [(0.5, 0.25)] * len(
            caches)
    finally:
        model.close()


def test_refresh_embedding_cache_rereads_changed_rows(demo):
    session = CreateInferenceSession(str(demo.graph), _params(demo))
    model = session.model
    try:
        batch = next(iter(wrapped_batches(model.graph, demo.data_source, "Norm", "Sum", None,
                                          8, 1)))  # fmt: skip
        args = (batch.dense.reshape(-1).tolist(), batch.sparse[0].keys.tolist(),
                batch.sparse[0].row_offsets.tolist())
        before = np.asarray(session.predict(*args))
        keys = np.unique(batch.sparse[0].keys)
        table = model.table_names[0]
        dim = model.tables[0].embedding_vec_size
        assert session.refresh_embedding_cache() >= keys.size  # the cached rows, unchanged
        np.testing.assert_allclose(session.predict(*args), before, atol=1e-6)
        # Change the rows in the parameter server's tiers only (not through the cache).
        ps = model.parameter_server
        ps.tiers["volatile"].insert(model.version.table(table).storage, keys,
                                    np.full((keys.size, dim), 0.75, np.float32))
        np.testing.assert_allclose(session.predict(*args), before, atol=1e-6)  # still cached
        assert session.refresh_embedding_cache() >= keys.size
        np.testing.assert_array_equal(model.cache.lookup(0, keys),
                                      np.full((keys.size, dim), 0.75, np.float32))
        assert np.abs(np.asarray(session.predict(*args)) - before).max() > 1e-4
    finally:
        model.close()


def test_refresh_embedding_cache_without_a_cache_is_a_no_op(demo):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HugeCTRCompatibilityWarning)
        session = CreateInferenceSession(str(demo.graph),
                                         _params(demo, use_gpu_embedding_cache=False))
    try:
        assert session.refresh_embedding_cache() == 0
    finally:
        session.model.close()


def test_check_out_tensor_gives_the_last_predicted_batchs_tensors(demo):
    model = InferenceModel(str(demo.graph), _params(demo, use_gpu_embedding_cache=False))
    try:
        with pytest.raises(ConfigError, match="nothing has been predicted"):
            model.check_out_tensor(model.table_names[0])
        batch = next(iter(wrapped_batches(model.graph, demo.data_source, "Norm", "Sum", None,
                                          16, 1)))  # fmt: skip
        model.predict_batch(batch)
        got = model.check_out_tensor(model.table_names[0])
        np.testing.assert_array_equal(got, model.embeddings(batch)[0])
        with pytest.raises(ConfigError, match="no tensor 'nope'"):
            model.check_out_tensor("nope")
    finally:
        model.close()


def test_the_session_predicts_a_dataset_too(demo):
    """HugeCTR's second overload: predict(num_batches, source, data_reader_type, check_type)."""
    session = CreateInferenceSession(str(demo.graph), _params(demo, use_gpu_embedding_cache=False))
    try:
        preds = session.predict(num_batches=2, source=demo.data_source, data_reader_type="Norm",
                                check_type="Sum")
        np.testing.assert_array_equal(preds, session.model.predict(2, demo.data_source, "Norm",
                                                                   "Sum").reshape(-1))
        assert preds.shape == (128,)  # one label: flat, as HugeCTR's session (v3.5 .. v4.1)
        np.testing.assert_array_equal(session.predict(2, demo.data_source, "Norm", "Sum", [], 0),
                                      preds)
        assert 0.0 <= session.evaluate(2, demo.data_source, "Norm", "Sum") <= 1.0
        batch = next(iter(wrapped_batches(session.model.graph, demo.data_source, "Norm", "Sum",
                                          None, 4, 1)))  # fmt: skip
        flat = session.predict(dense_feature=batch.dense.reshape(-1).tolist(),
                               embeddingcolumns=batch.sparse[0].keys.tolist(),
                               row_ptrs=batch.sparse[0].row_offsets.tolist())
        np.testing.assert_allclose(flat, preds[:4], atol=1e-6)
    finally:
        session.model.close()
