import copy
import json
from pathlib import Path

import pytest

from tierserve.core.errors import ConfigError
from tierserve.ps.config import load_ps_config, parse_ps_config
from tierserve.ps.config_base import (
    UNBOUNDED,
    DatabaseOverflowPolicy_t,
    DatabaseType_t,
    default_num_partitions,
)
from tierserve.ps.hash_map import HashMapConfig, ParallelHashMapConfig
from tierserve.ps.kafka_source import KafkaUpdateSourceConfig
from tierserve.ps.redis_tier import RedisClusterConfig
from tierserve.ps.rocksdb_tier import RocksDBConfig

EXAMPLE = Path(__file__).parent / "data" / "ps.json"


def example() -> dict:
    return json.loads(EXAMPLE.read_text())


def test_hugectr_style_file_parses(tmp_path):
    config = load_ps_config(EXAMPLE)
    vdb = config.volatile_db
    assert isinstance(vdb, RedisClusterConfig)
    assert vdb.num_partitions == 8  # HugeCTR's two batch sizes stay two settings
    assert (vdb.max_get_batch_size, vdb.max_set_batch_size) == (100000, 100000)
    assert vdb.overflow_policy is DatabaseOverflowPolicy_t.evict_oldest
    assert vdb.cache_missed_embeddings is True
    assert isinstance(config.persistent_db, RocksDBConfig)
    assert config.persistent_db.path == str(EXAMPLE.parent.resolve() / "rocksdb")
    assert isinstance(config.update_source, KafkaUpdateSourceConfig)
    model = config.model("wdl")
    assert model.num_tables == 2
    assert model.embedding_table_names == ["sparse_embedding2", "sparse_embedding1"]
    assert model.sparse_files[0] == str(EXAMPLE.parent.resolve() / "wdl/1/wdl0_sparse_2000.model")


def test_defaults_are_hugectrs():
    config = parse_ps_config({})
    assert config.supportlonglong is True
    assert isinstance(config.volatile_db, ParallelHashMapConfig)
    assert config.volatile_db.num_partitions == default_num_partitions()
    assert config.volatile_db.overflow_margin == UNBOUNDED
    assert config.volatile_db.overflow_resolution_target == 0.8
    assert config.volatile_db.update_filters == [".+"]
    assert config.persistent_db.type is DatabaseType_t.disabled
    assert config.update_source.type.value == "null"
    rocks = RocksDBConfig()
    assert (rocks.path, rocks.num_threads, rocks.read_only, rocks.max_batch_size) == (
        "/tmp/rocksdb",
        16,
        False,
        10000,
    )
    kafka = KafkaUpdateSourceConfig()
    assert (
        kafka.brokers,
        kafka.poll_timeout_ms,
        kafka.receive_buffer_size,
        kafka.max_batch_size,
        kafka.failure_backoff_ms,
    ) == ("127.0.0.1:9092", 500, 2000, 1000, 50)


def test_defaults_per_table_filled():
    m = parse_ps_config(
        {
            "models": [
                {
                    "model": "m",
                    "sparse_files": ["a", "b"],
                    "embedding_vecsize_per_table": [4, 8],
                    "maxnum_catfeature_query_per_table_per_sample": [1, 2],
                }
            ]
        }
    ).models[0]
    assert m.default_value_for_each_table == [0.0, 0.0]
    assert m.embedding_table_names == ["sparse_embedding1", "sparse_embedding2"]
    assert m.storage_dtype == ["float32", "float32"]


def test_storage_dtype_for_all_tables_or_one_per_table():
    data = example()
    data["models"][0]["storage_dtype"] = "int8"
    m = parse_ps_config(data).models[0]
    assert m.storage_dtype == ["int8"] * m.num_tables
    data["models"][0]["storage_dtype"] = ["float16", "int8"][: m.num_tables] + ["float32"] * (
        m.num_tables - 2
    )
    assert parse_ps_config(data).models[0].storage_dtype[:2] == ["float16", "int8"]


@pytest.mark.parametrize("value", ["bfloat16", "fp16", "INT8", ["int8", "int4"], 8])
def test_unknown_storage_dtype_is_refused_naming_it(value):
    """Refused with the values it takes (before, the field itself was unknown)."""
    data = example()
    data["models"][0]["storage_dtype"] = value
    with pytest.raises(ConfigError, match=r"models\.0\.storage_dtype: .* is not a storage_dtype: "
                       r"give one of float32, float16, int8 \(default float32\)"):  # fmt: skip
        parse_ps_config(data)


def _mutate(path, value):
    data = example()
    node = data
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return data


@pytest.mark.parametrize(
    "path, value, message",
    [
        (
            ("volatile_db", "overflow_margn"),
            10,
            r"volatile_db\.redis_cluster\.overflow_margn: unknown field",
        ),
        (("persistent_db", "pth"), "x", r"persistent_db\.rocks_db\.pth: unknown field"),
        (("models", 0, "dense_fle"), "x", r"models\.0\.dense_fle: unknown field"),
        (("supportlonglng",), True, r"supportlonglng: unknown field"),
        (("volatile_db", "overflow_resolution_target"), 1.0, "overflow_resolution_target"),
        (("volatile_db", "overflow_resolution_target"), 0.0, "overflow_resolution_target"),
        (("volatile_db", "num_partitions"), -1, "num_partitions"),
        (("volatile_db", "overflow_margin"), 0, "overflow_margin"),
        (("volatile_db", "overflow_policy"), "evict_newest", "overflow_policy"),
        (("volatile_db", "initial_cache_rate"), 1.5, "initial_cache_rate"),
        (("volatile_db", "address"), "localhost", "address"),
        (("volatile_db", "update_filters"), ["("], "update_filters"),
        (("volatile_db", "type"), "memcached", "volatile_db"),
        (("persistent_db", "max_batch_size"), 0, "max_batch_size"),
        (("update_source", "poll_timeout_ms"), -5, "poll_timeout_ms"),
        (("models", 0, "model"), "../etc", r"models\.0\.model"),
        (("models", 0, "embedding_table_names"), ["ok", "bad name"], "embedding_table_names"),
        (("models", 0, "embedding_vecsize_per_table"), [16], "embedding_vecsize_per_table has 1"),
        (("models", 0, "default_value_for_each_table"), [0.0], "default_value_for_each_table"),
        (("models", 0, "storage_dtype"), ["int8"] * 9, "storage_dtype has 9 entries"),
        (("models", 0, "sparse_files"), [], "sparse_files"),
        (("models", 0, "gpucacheper"), 2.0, "gpucacheper"),
        # a default key limit no INT32 ROWINDEX can reach, and a request size nobody means
        (("models", 0, "maxnum_catfeature_query_per_table_per_sample"), [2**62, 1],
         r"models\.0: .*maxnum_catfeature_query_per_table_per_sample .* over 2147483647"),
        (("models", 0, "maxnum_catfeature_query_per_table_per_sample"), [2**21, 1],
         "maxnum_catfeature_query_per_table_per_sample"),
    ],
)
def test_invalid_field_named(path, value, message):
    with pytest.raises(ConfigError, match=message):
        parse_ps_config(_mutate(path, value))


def test_duplicate_models_rejected():
    data = example()
    data["models"].append(copy.deepcopy(data["models"][0]))
    with pytest.raises(ConfigError, match="repeated: \\['wdl'\\]"):
        parse_ps_config(data)


def test_hash_map_has_one_partition():
    with pytest.raises(ConfigError, match="num_partitions"):
        parse_ps_config({"volatile_db": {"type": "hash_map", "num_partitions": 4}})
    assert isinstance(
        parse_ps_config({"volatile_db": {"type": "hash_map"}}).volatile_db, HashMapConfig
    )


def test_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_ps_config(tmp_path / "ps.json")
    (tmp_path / "ps.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_ps_config(tmp_path / "ps.json")
    (tmp_path / "ps.json").write_text("[]")
    with pytest.raises(ConfigError, match="top level must be a JSON object"):
        load_ps_config(tmp_path / "ps.json")


def test_unknown_model_lookup():
    with pytest.raises(ConfigError, match="no model 'x'"):
        load_ps_config(EXAMPLE).model("x")
