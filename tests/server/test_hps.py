"""HugeCTR's HPS Python API (``hugectr.inference.HPS``), as its hps_demo notebook uses it:
``ParameterServerConfig`` or a ps.json, ``lookup(keys, model_name, table_id)`` and
``lookup_fromdlpack`` over the parameter server's tiers and the embedding cache."""

import json
import warnings

import numpy as np
import pytest

from tierserve.core.compat import HugeCTRCompatibilityWarning
from tierserve.core.errors import ConfigError, InvalidInputError, NotFoundError
from tierserve.ps.params import PersistentDatabaseParams, VolatileDatabaseParams
from tierserve.trainer.hugectr.inference import HPS, InferenceParams, ParameterServerConfig

DIMS = (16, 32)


def _write_sparse_folder(folder, keys, vectors):
    """A sparse model folder as HugeCTR writes it (and its notebook's converter does):
    ``key`` (int64) and ``emb_vector`` (float32), raw little-endian."""
    folder.mkdir()
    np.asarray(keys, "<i8").tofile(folder / "key")
    np.asarray(vectors, "<f4").tofile(folder / "emb_vector")


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    root = tmp_path_factory.mktemp("hps")
    rng = np.random.default_rng(3)
    out = []
    for i, dim in enumerate(DIMS):
        keys = rng.choice(40000, size=3000, replace=False).astype(np.int64) + 20000 * i
        vectors = rng.standard_normal((keys.size, dim)).astype(np.float32)
        folder = root / f"hps_demo{i}_sparse_1000.model"
        _write_sparse_folder(folder, keys, vectors)
        out.append((folder, dict(zip(keys.tolist(), vectors))))
    return out


def _params(tables, cache, **kw):
    values = dict(model_name="hps_demo", max_batchsize=64, hit_rate_threshold=1.0,
                  dense_model_file="", sparse_model_files=[str(f) for f, _ in tables],
                  deployed_devices=[0], use_gpu_embedding_cache=cache,
                  cache_size_percentage=0.5, i64_input_key=True,
                  default_value_for_each_table=[0.25, -1.0])
    values.update(kw)
    return InferenceParams(**values)


def _config(tables, cache, **kw):
    return ParameterServerConfig(
        emb_table_name={"hps_demo": ["sparse_embedding1", "sparse_embedding2"]},
        embedding_vec_size={"hps_demo": list(DIMS)},
        max_feature_num_per_sample_per_emb_table={"hps_demo": [2, 2]},
        inference_params_array=[_params(tables, cache)], **kw)


def _expected(rows, keys, dim, default):
    return np.stack([rows.get(int(k), np.full(dim, default, np.float32)) for k in keys])


@pytest.fixture(params=[False, True], ids=["tiers", "cache"])
def hps(request, tables):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HugeCTRCompatibilityWarning)  # no GPU: host cache
        with HPS(_config(tables, request.param)) as h:
            yield h


def test_lookup_returns_each_tables_rows_and_defaults(hps, tables):
    rng = np.random.default_rng(5)
    for table_id, ((_, rows), dim, default) in enumerate(zip(tables, DIMS, (0.25, -1.0))):
        known = np.array(list(rows))[rng.integers(0, len(rows), 100)]
        keys = np.concatenate([known, [10**9, 10**9 + 1]]).astype(np.int64)  # two unknown
        for _ in range(2):  # the second time from the cache, when there is one
            got = hps.lookup(keys, "hps_demo", table_id)
            assert got.shape == (keys.size, dim) and got.dtype == np.float32
            np.testing.assert_array_equal(got, _expected(rows, keys, dim, default))
    assert ("hps_demo" in hps.caches) == bool(hps.config.model("hps_demo").gpucache)


def test_lookup_checks_its_arguments(hps):
    keys = np.arange(4, dtype=np.int64)
    with pytest.raises(NotFoundError, match="other"):
        hps.lookup(keys, "other", 0)
    with pytest.raises(NotFoundError, match="table_id 2"):
        hps.lookup(keys, "hps_demo", 2)
    with pytest.raises(ConfigError, match="device_id 1"):
        hps.lookup(keys, "hps_demo", 0, device_id=1)
    with pytest.raises(InvalidInputError, match="one dimension"):
        hps.lookup(keys.reshape(2, 2), "hps_demo", 0)
    with pytest.raises(InvalidInputError, match="at most .* = 128"):  # 2 per sample x 64
        hps.lookup(np.arange(129, dtype=np.int64), "hps_demo", 0)


def test_lookup_fromdlpack_writes_into_the_callers_tensor(hps, tables):
    rows = tables[1][1]
    keys = np.array(list(rows)[:50] + [10**9], dtype=np.int64)
    out = np.zeros((1, keys.size * DIMS[1]), dtype=np.float32)
    key_capsule, out_capsule = keys.__dlpack__(), out.__dlpack__()
    hps.lookup_fromdlpack(key_capsule, out_capsule, "hps_demo", 1)
    np.testing.assert_array_equal(out.reshape(keys.size, DIMS[1]),
                                  _expected(rows, keys, DIMS[1], -1.0))
    np.testing.assert_array_equal(np.from_dlpack(_Capsule(out_capsule)), out)  # not consumed
    small = np.zeros(10, dtype=np.float32)
    with pytest.raises(InvalidInputError, match="holds 10 values"):
        hps.lookup_fromdlpack(keys.__dlpack__(), small.__dlpack__(), "hps_demo", 1)
    with pytest.raises(InvalidInputError, match="float32"):
        hps.lookup_fromdlpack(keys.__dlpack__(), out.astype(np.float64).__dlpack__(),
                              "hps_demo", 1)
    with pytest.raises(InvalidInputError, match="DLPack capsule"):
        hps.lookup_fromdlpack(keys, out.__dlpack__(), "hps_demo", 1)


class _Capsule:
    """An object whose ``__dlpack__`` hands over an existing capsule (for np.from_dlpack)."""

    def __init__(self, capsule):
        self.capsule = capsule

    def __dlpack__(self, **kw):
        return self.capsule

    def __dlpack_device__(self):
        return (1, 0)


def test_hps_from_a_ps_json_with_a_rocksdb_tier(tables, tmp_path):
    """HPS("ps.json"): HugeCTR's JSON layout; rows come from RocksDB when the volatile tier
    holds none of them (initial_cache_rate 0)."""
    ps_json = tmp_path / "hps_demo.json"
    ps_json.write_text(json.dumps({
        "supportlonglong": True,
        "volatile_db": {"type": "hash_map", "initial_cache_rate": 0.0},
        "persistent_db": {"type": "rocks_db", "path": str(tmp_path / "rocksdb")},
        "models": [{
            "model": "hps_demo", "sparse_files": [str(f) for f, _ in tables],
            "embedding_table_names": ["sparse_embedding1", "sparse_embedding2"],
            "embedding_vecsize_per_table": list(DIMS),
            "maxnum_catfeature_query_per_table_per_sample": [2, 2],
            "default_value_for_each_table": [0.0, 0.0], "deployed_device_list": [0],
            "max_batch_size": 64, "hit_rate_threshold": 1.0, "gpucacheper": 0.5,
            "gpucache": False,
        }],
    }))
    with HPS(str(ps_json)) as hps:
        rows = tables[0][1]
        keys = np.array(list(rows)[:20], dtype=np.int64)
        np.testing.assert_array_equal(hps.lookup(keys, "hps_demo", 0),
                                      _expected(rows, keys, DIMS[0], 0.0))
        assert hps.parameter_server.volatile.size(
            hps.parameter_server.model("hps_demo").table("sparse_embedding1").storage) == 0


def test_parameter_server_config_tiers_and_checks(tables, tmp_path):
    config = _config(tables, False,
                     volatile_db=VolatileDatabaseParams(type="hash_map"),
                     persistent_db=PersistentDatabaseParams(backend="rocks_db",
                                                            path=str(tmp_path / "r")))
    assert config.config.volatile_db.type.value == "hash_map"
    assert config.config.persistent_db.type.value == "rocks_db"
    assert config.config.model("hps_demo").embedding_vecsize_per_table == list(DIMS)
    assert config.config.model("hps_demo").default_value_for_each_table == [0.25, -1.0]
    with pytest.raises(ConfigError, match="embedding_vec_size has no entry for model"):
        ParameterServerConfig({"hps_demo": ["a", "b"]}, {"x": [1, 2]}, {"hps_demo": [1, 1]},
                              [_params(tables, False)])
    with pytest.raises(ConfigError, match=r"emb_table_name\['hps_demo'\] has 1 tables"):
        ParameterServerConfig({"hps_demo": ["a"]}, {"hps_demo": [16]}, {"hps_demo": [1]},
                              [_params(tables, False)])
