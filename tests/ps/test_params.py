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
from tierserve.ps.config import (
    HashMapConfig,
    KafkaUpdateSourceConfig,
    RedisClusterConfig,
    RocksDBConfig,
)


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
