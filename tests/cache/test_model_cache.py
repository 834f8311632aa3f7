"""CreateEmbeddingCache from a ps.json, against the real parameter server."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cache_helpers import DIM, MODEL, TABLE, make_ps_config, vectors_for

from tierserve.cache import CreateEmbeddingCache, EmbeddingCache, ModelEmbeddingCache
from tierserve.cache.device import to_host
from tierserve.core.errors import CapacityExceededError, CorruptModelFileError, NotFoundError
from tierserve.ps.config import dump_ps_config
from tierserve.ps.hierarchy import HierarchicalParameterServer


def _ps_json(tmp_path, **model_fields):
    config = make_ps_config(tmp_path, rows=1000, **model_fields)
    path = tmp_path / "ps.json"
    path.write_text(json.dumps(dump_ps_config(config)))
    return config, path


def test_create_from_ps_json_sizes_each_table_by_percentage(tmp_path, use_gpu):
    config, path = _ps_json(tmp_path, gpucacheper=0.25, hit_rate_threshold=0.7)
    with HierarchicalParameterServer(config) as ps, CreateEmbeddingCache(
        ps, 0, use_gpu, None, path, MODEL, True
    ) as caches:
        assert isinstance(caches, ModelEmbeddingCache) and caches.tables == [TABLE]
        cache = caches[TABLE]
        assert isinstance(cache, EmbeddingCache) and cache is caches[0]
        assert cache.capacity == 250  # 125 sets of 2 ways
        assert cache.hit_rate_threshold == 0.7
        keys = np.arange(0, 1000, 7, dtype=np.int64)
        np.testing.assert_array_equal(to_host(caches.lookup(0, keys)), ps.lookup(MODEL, TABLE, keys))
        ps.insert(MODEL, TABLE, keys[:3], vectors_for(keys[:3], 9))
        got = to_host(caches.query(TABLE, keys))
        assert (got[:3, 1] == 9).all()
        assert [m.table for m in caches.metrics()] == [TABLE]
        with pytest.raises(NotFoundError):
            caches.query("nope", keys)


def test_explicit_percentage_and_capacities(tmp_path):
    config, path = _ps_json(tmp_path)
    with HierarchicalParameterServer(config) as ps:
        with CreateEmbeddingCache(ps, 0, False, 0.1, config, MODEL) as caches:
            assert caches[0].capacity == 100
        with CreateEmbeddingCache(ps, 0, False, None, config.models[0], MODEL, capacities=[40]) as caches:
            assert caches[0].capacity == 40


def test_cache_percentage_follows_one_rule_on_every_path(tmp_path):
    """HugeCTR's meaning: a cache percentage is in [0, 1], and 0 is the smallest cache.  The
    ps.json field (gpucacheper), InferenceParams.cache_size_percentage and
    CreateEmbeddingCache's argument are checked by the same ModelConfig field, with the same
    message; a model whose ps.json says 0 loads and serves through its cache."""
    from tierserve.core.errors import ConfigError
    from tierserve.ps.config import parse_ps_config
    from tierserve.server.inference_model import InferenceParams

    config, path = _ps_json(tmp_path, gpucacheper=0.0)
    assert config.models[0].gpucacheper == 0.0
    keys = np.arange(0, 1000, 7, dtype=np.int64)
    with HierarchicalParameterServer(config) as ps:
        for source, pct in ((path, None), (config, 0.0)):
            with CreateEmbeddingCache(ps, 0, False, pct, source, MODEL) as caches:
                assert caches[0].capacity == 1  # the smallest cache: one row
                got = to_host(caches.lookup(0, keys))
                np.testing.assert_array_equal(got, ps.lookup(MODEL, TABLE, keys))
        refused = "less than or equal to 1"
        with pytest.raises(ConfigError, match=rf"CreateEmbeddingCache: cache_size_percentage: .*{refused}"):
            CreateEmbeddingCache(ps, 0, False, 1.5, config, MODEL)
    data = dump_ps_config(config)
    data["models"][0]["gpucacheper"] = 1.5
    with pytest.raises(ConfigError, match=rf"models.0.gpucacheper: .*{refused}"):
        parse_ps_config(data)
    with pytest.raises(ConfigError, match=rf"cache_size_percentage: .*{refused}"):
        InferenceParams(model_name="m", max_batchsize=1, hit_rate_threshold=0.9,
                        dense_model_file="d", sparse_model_files=["s"],
                        use_gpu_embedding_cache=False, cache_size_percentage=1.5,
                        i64_input_key=True)


def test_static_cache_from_config(tmp_path):
    config, path = _ps_json(tmp_path, embedding_cache_type="static", gpucacheper=1.0)
    with HierarchicalParameterServer(config) as ps:
        with CreateEmbeddingCache(ps, 0, False, None, path, MODEL) as caches:
            m = caches.metrics()[0]
            assert (m.cache_type, m.size, m.capacity) == ("static", 1000, 1000)
            keys = np.arange(0, 1000, 3, dtype=np.int64)
            np.testing.assert_array_equal(to_host(caches.query(0, keys)), ps.lookup(MODEL, TABLE, keys))
            assert caches.metrics()[0].misses == 0
        with pytest.raises(CapacityExceededError, match="gpucacheper"):
            CreateEmbeddingCache(ps, 0, False, 0.5, path, MODEL)


def test_missing_sparse_file_is_a_clear_error(tmp_path):
    config, path = _ps_json(tmp_path)
    with HierarchicalParameterServer(config) as ps:
        (tmp_path / "m0_sparse_0.model" / "key").unlink()
        with pytest.raises(CorruptModelFileError, match="table_rows"):
            CreateEmbeddingCache(ps, 0, False, None, path, MODEL)
        with CreateEmbeddingCache(ps, 0, False, 0.5, path, MODEL, table_rows_per_table=[10]) as c:
            assert c[0].capacity == 4  # 5 rounded down to whole 2-way sets
            assert c[0].dim == DIM
