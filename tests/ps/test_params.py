import pytest

from tierserve.core.errors import ConfigError
from tierserve.ps import (
    DatabaseOverflowPolicy_t,
    DatabaseType_t,
    PersistentDatabaseParams,
    UpdateSourceParams,
    UpdateSourceType_t,
    VolatileDatabaseParams,
)
from tierserve.ps.hash_map import HashMapConfig
from tierserve.ps.kafka_source import KafkaUpdateSourceConfig
from tierserve.ps.redis_tier import RedisClusterConfig
from tierserve.ps.rocksdb_tier import RocksDBConfig


def test_hugectr_attribute_style():
    params = VolatileDatabaseParams()
    assert params.type is DatabaseType_t.parallel_hash_map
    assert params.overflow_policy is DatabaseOverflowPolicy_t.evict_oldest
    params.type = DatabaseType_t.hash_map
    params.overflow_margin = 1000
    params.overflow_policy = DatabaseOverflowPolicy_t.evict_least_used
    config = params.to_config()
    assert isinstance(config, HashMapConfig)
    assert config.overflow_margin == 1000
    assert config.overflow_policy is DatabaseOverflowPolicy_t.evict_least_used


def test_redis_cluster_keywords():
    config = VolatileDatabaseParams(
        type="redis_cluster", address="127.0.0.1:7000;127.0.0.1:7001", num_partitions=4
    ).to_config()
    assert isinstance(config, RedisClusterConfig) and config.num_partitions == 4


def test_assignment_is_validated_at_once():
    params = VolatileDatabaseParams()
    with pytest.raises(ConfigError, match="overflow_resolution_target"):
        params.overflow_resolution_target = 1.5
    with pytest.raises(ConfigError, match="num_threads"):
        PersistentDatabaseParams(num_threads=0)
    with pytest.raises(ConfigError, match="brokerz: unknown field"):
        UpdateSourceParams(brokerz="x")


def test_field_that_the_type_does_not_use():
    params = VolatileDatabaseParams(type=DatabaseType_t.hash_map, address="10.0.0.1:7000")
    with pytest.raises(ConfigError, match="hash_map.address: unknown field"):
        params.to_config()


def test_persistent_and_update_source():
    rocks = PersistentDatabaseParams(
        type=DatabaseType_t.rocks_db, path="/data/rocks", read_only=True
    )
    assert isinstance(rocks.to_config(), RocksDBConfig) and rocks.to_config().read_only
    assert PersistentDatabaseParams().to_config().type is DatabaseType_t.disabled
    kafka = UpdateSourceParams()
    kafka.type = UpdateSourceType_t.kafka_message_queue
    kafka.brokers = "127.0.0.1:9093"
    assert isinstance(kafka.to_config(), KafkaUpdateSourceConfig)
    assert kafka.to_config().brokers == "127.0.0.1:9093"


def test_positional_arguments_follow_field_order():
    params = VolatileDatabaseParams(DatabaseType_t.hash_map, "127.0.0.1:7000")
    assert params.type is DatabaseType_t.hash_map and params.address == "127.0.0.1:7000"
    with pytest.raises(ConfigError, match="type given twice"):
        VolatileDatabaseParams(DatabaseType_t.hash_map, type=DatabaseType_t.redis_cluster)
    with pytest.raises(ConfigError, match="at most"):
        UpdateSourceParams(*range(20))


def test_defaults_are_the_config_models_and_each_refused_value_is_named_once():
    """The parameter objects declare no default of their own: what they read back is the
    config model's for the chosen type (a standalone redis' address is not a cluster's)."""
    from tierserve.ps.redis_tier import RedisConfig

    params = VolatileDatabaseParams()
    for name in VolatileDatabaseParams.FIELDS:
        if name not in ("type", "address", "num_partitions"):
            default = getattr(params, name)
            owner = next(c for c in (HashMapConfig, RedisClusterConfig) if name in c.model_fields)
            assert default == owner.model_fields[name].get_default(call_default_factory=True)
    assert params.address == RedisClusterConfig().address
    assert VolatileDatabaseParams(type="redis").address == RedisConfig().address
    assert UpdateSourceParams().max_receive_buffer_size == KafkaUpdateSourceConfig().receive_buffer_size
    with pytest.raises(ConfigError) as refused:
        VolatileDatabaseParams(type="rocks_db", overflow_resolution_target=2, brokers="x")
    lines = str(refused.value).splitlines()[1:]
    assert len(lines) == 3 and "volatile_db type" in lines[0]
    assert lines[1].lstrip().startswith("overflow_resolution_target:")
    assert lines[2].strip() == "brokers: unknown field"


def test_fields_may_be_set_before_the_type_that_uses_them():
    params = VolatileDatabaseParams()
    params.address = "10.0.0.1:7000,10.0.0.2:7000"
    params.num_partitions = 6
    params.type = DatabaseType_t.redis_cluster
    config = params.to_config()
    assert isinstance(config, RedisClusterConfig)
    assert (config.address, config.num_partitions) == ("10.0.0.1:7000,10.0.0.2:7000", 6)
