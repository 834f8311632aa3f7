"""Every setting arrives, unchanged, at the object that uses it.

For every field of every ``ps.json`` config model (the top level, each tier's, the update
source's, the models') and every field of HugeCTR's ``VolatileDatabaseParams``,
``PersistentDatabaseParams`` and ``UpdateSourceParams``, a route below gives a value other
than the default and reads back what arrived at the object that uses it (a tier, its Redis
client, the parameter server, a Kafka consumer, an embedding cache, the served model), in the
unit that object works in: 500 ms arrives as 0.5 s.  Tier and source values go in through
both paths that set them (a ``ps.json`` dict and the HugeCTR parameter object); model values
through ``ps.json`` and, where they carry them, HugeCTR's ``InferenceParams`` and the older
inference JSON.  A route may instead say that the value is refused (a ``TierserveError``
naming the field) or warned about (a ``HugeCTRCompatibilityWarning`` naming it): no setting
is accepted and ignored.  A field without a route fails the test.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from tierserve.cache import CreateEmbeddingCache
from tierserve.cache.device import to_host
from tierserve.core.compat import HugeCTRCompatibilityWarning, reset_warnings
from tierserve.core.errors import InvalidInputError, TierserveError
from tierserve.ps.config import ModelConfig, PSConfig, parse_ps_config
from tierserve.ps.hash_map import HashMapConfig, ParallelHashMapConfig
from tierserve.ps.hierarchy import HierarchicalParameterServer
from tierserve.ps.inference_json import CLAUSE_FIELDS, model_config_from_inference_json
from tierserve.ps.kafka_apply import UpdateConsumer
from tierserve.ps.kafka_source import KafkaUpdateSourceConfig
from tierserve.ps.params import (
    PersistentDatabaseParams,
    UpdateSourceParams,
    VolatileDatabaseParams,
)
from tierserve.ps.redis_client import connection_kwargs
from tierserve.ps.redis_tier import RedisClusterConfig, RedisConfig
from tierserve.ps.rocksdb_tier import RocksDBConfig
from tierserve.ps.shm_hash_map import MultiProcessHashMapConfig
from tierserve.ps.sparse_file import read_sparse_model, write_sparse_model
from tierserve.ps.tier_registry import create_tier
from tierserve.server.inference_params import MODEL_FIELDS, InferenceParams, read_params

REFUSED, WARNS = "refused", "warns"


@dataclass
class Route:
    """``value`` for the field (a callable: computed from the test's :class:`Env`);
    ``target``: the object that uses it, or REFUSED / WARNS; ``read(obj, env)``: what
    arrived; ``expect``: what should (None: the value itself; a callable: from the env);
    ``extra``: other fields the check needs."""

    value: Any
    target: str
    read: Callable[[Any, Any], Any] | None = None
    expect: Any = None
    extra: dict = field(default_factory=dict)


R = Route


def _kind(obj, env):
    return obj.kind


# --- the tiers -------------------------------------------------------------------------------

VOLATILE = {
    "type": R(None, "tier", _kind),  # None: the config model's own type
    "overflow_margin": R(1000, "tier", lambda t, e: t.overflow_margin),
    "overflow_policy": R("evict_random", "tier", lambda t, e: type(t.policy).__name__,
                         "EvictRandom"),
    "overflow_resolution_target": R(0.5, "tier", lambda t, e: t.resolution_target, 500,
                                    {"overflow_margin": 1000}),
    "initialize_after_startup": R(False, "ps", lambda ps, e: ps._attach, True),
    # with a persistent tier behind it, the volatile tier is loaded with that share of rows
    "initial_cache_rate": R(0.5, "ps", lambda ps, e: e.volatile_share(ps)),
    # a key the persistent tier alone holds is copied up into the volatile tier when read
    "cache_missed_embeddings": R(True, "ps", lambda ps, e: e.copied_up(ps), True,
                                 {"initial_cache_rate": 0.5}),
    "refresh_time_after_fetch": R(True, "tier", lambda t, e: t.refresh_after_fetch),
    "update_filters": R(["^m32$"], "ps", lambda ps, e: ps.update_filters("volatile")),
}
IN_PROCESS = {
    **VOLATILE,
    "max_batch_size": R(7, WARNS),
    "max_get_batch_size": R(7, WARNS),
    "max_set_batch_size": R(7, WARNS),
    "algorithm": R("stl", REFUSED),  # "phm" is the one implementation
}
REDIS = {
    **VOLATILE,
    "num_partitions": R(5, "tier", lambda t, e: t.num_partitions),
    "max_batch_size": R(9, "tier", lambda t, e: (t.max_get_batch_size, t.max_batch_size),
                        (9, 9)),
    "max_get_batch_size": R(9, "tier", lambda t, e: t.max_get_batch_size),
    "max_set_batch_size": R(9, "tier", lambda t, e: t.max_batch_size),  # writes
    # None: the test's own server or cluster (every tier here is given one)
    "address": R(None, "tier", lambda t, e: e.reaches_given_nodes(t), True),
    # what the Redis client is given ("client": the connection settings the tier opens it with)
    "user_name": R("reader", "client", lambda kw, e: kw["username"],
                   extra={"password": "secret"}),
    "password": R("secret", "client", lambda kw, e: kw["password"]),
    "enable_tls": R(True, "client", lambda kw, e: kw["ssl"]),
    "tls_ca_certificate": R("ca.crt", "client", lambda kw, e: kw["ssl_ca_certs"],
                            extra={"enable_tls": True}),
    "tls_client_certificate": R("c.pem", "client", lambda kw, e: kw["ssl_certfile"],
                                extra={"enable_tls": True}),
    "tls_client_key": R("c.key", "client", lambda kw, e: kw["ssl_keyfile"],
                        extra={"enable_tls": True}),
    "tls_server_name_identification": R("other", WARNS, extra={"enable_tls": True}),
    "socket_timeout_ms": R(1500, "tier", lambda t, e: e.client_kwargs(t)["socket_timeout"],
                           1.5),
    "connect_timeout_ms": R(700, "tier",
                            lambda t, e: e.client_kwargs(t)["socket_connect_timeout"], 0.7),
    "max_retries": R(4, "tier", lambda t, e: t.max_retries),
    "failure_threshold": R(6, "tier", lambda t, e: t.breakers.threshold),
    "failure_backoff_ms": R(700, "tier", lambda t, e: t.breakers.backoff.base, 0.7),
    "max_failure_backoff_ms": R(9000, "tier", lambda t, e: t.breakers.backoff.cap, 9.0),
    "refill_interval_ms": R(700, "ps", lambda ps, e: ps._refill.interval_s, 0.7),
}
TIER_ROUTES: dict[type, dict[str, Route]] = {
    HashMapConfig: {**IN_PROCESS, "num_partitions": R(2, REFUSED)},
    ParallelHashMapConfig: {**IN_PROCESS,
                            "num_partitions": R(3, "tier", lambda t, e: t.num_partitions)},
    MultiProcessHashMapConfig: {
        **IN_PROCESS,
        "initialize_after_startup": R(False, REFUSED),
        "num_partitions": R(3, "tier", lambda t, e: t.num_partitions),
        "shared_memory_size": R(1 << 28, "tier", lambda t, e: t.limit),
        "shared_memory_name": R(lambda e: e.shm_name(), "tier", lambda t, e: t.folder.name),
        "auto_remove": R(False, "tier", lambda t, e: t.auto_remove),
    },
    RedisConfig: REDIS,
    RedisClusterConfig: {
        **REDIS,
        "num_partitions": R(7, "tier", lambda t, e: t.num_partitions),
        "topology_refresh_ms": R(800, "tier", lambda t, e: t._topology.interval_s, 0.8),
    },
    RocksDBConfig: {
        "type": R(None, "tier", _kind),
        "path": R(lambda e: str(e.tmp / "other_rocksdb"), "tier", lambda t, e: t.path),
        "num_threads": R(3, "tier", lambda t, e: t.num_threads),
        "read_only": R(True, "ps", lambda ps, e: (ps.persistent.read_only, ps._attach),
                       (True, True)),
        "max_batch_size": R(11, "tier", lambda t, e: (t.max_get_batch_size, t.max_batch_size),
                            (11, 11)),
        "max_get_batch_size": R(11, "tier", lambda t, e: t.max_get_batch_size),
        "max_set_batch_size": R(11, "tier", lambda t, e: t.max_batch_size),
        "update_filters": R(["^m32$"], "ps", lambda ps, e: ps.update_filters("persistent")),
    },
}

# --- the update source -------------------------------------------------------------------------

SOURCE_ROUTES = {
    "type": R(None, "consumer", lambda c, e: c.role, "apply"),
    "brokers": R("127.0.0.1:1;127.0.0.1:2", "consumer",
                 lambda c, e: c._settings["bootstrap.servers"], "127.0.0.1:1,127.0.0.1:2"),
    "metadata_refresh_interval_ms": R(
        1500, "consumer",
        lambda c, e: (c.metadata_refresh_s, c._settings["topic.metadata.refresh.interval.ms"]),
        (1.5, 1500)),
    "poll_timeout_ms": R(250, "consumer", lambda c, e: c.poll_timeout_s, 0.25),
    "receive_buffer_size": R(77, "consumer", lambda c, e: c.receive_buffer_rows),
    "max_batch_size": R(333, "consumer", lambda c, e: c.max_batch_keys),
    "failure_backoff_ms": R(500, "consumer", lambda c, e: (c.failure_backoff_s, c.backoff.base),
                            (0.5, 0.5)),
    "max_commit_interval": R(7, "consumer", lambda c, e: c.max_commit_interval),
}

# --- the models (the test model's graph: one table "emb" of dim 4, 4 slots, 3 dense) ---------

MODEL_ROUTES = {
    "model": R("other", "ps", lambda ps, e: ps.models(), ["other"]),
    "sparse_files": R(lambda e: [e.half_sparse], "ps", lambda ps, e: e.volatile_rows(ps),
                      lambda e: e.rows // 2),
    "dense_file": R(lambda e: str(e.tmp / "missing_dense.model"), REFUSED),
    "network_file": R(lambda e: str(e.tmp / "missing_graph.json"), REFUSED),
    "max_batch_size": R(17, "server", lambda m, e: m.max_batchsize),
    "deployed_device_list": R([0, 1], WARNS),
    "default_value_for_each_table": R([-2.5], "ps", lambda ps, e: [e.missing_key_value(ps)]),
    "maxnum_des_feature_per_sample": R(1, REFUSED),  # the graph has 3 dense features
    "maxnum_catfeature_query_per_table_per_sample": R([2], REFUSED),  # it needs 4
    "embedding_vecsize_per_table": R([8], REFUSED),  # the files and the graph hold 4
    "embedding_table_names": R(["table0"], "ps", lambda ps, e: list(ps.model("m32").tables)),
    "hit_rate_threshold": R(0.7, "cache", lambda c, e: c.hit_rate_threshold),
    "gpucache": R(False, "server", lambda m, e: m.cache is not None),
    "gpucacheper": R(0.25, "cache", lambda c, e: abs(c.capacity - 0.25 * e.rows) <= 2, True),
    "embedding_cache_type": R("static", "cache", lambda c, e: c.cache_type,
                              extra={"gpucacheper": 1.0}),
    "use_static_table": R(True, "cache", lambda c, e: c.cache_type, "static",
                          {"gpucacheper": 1.0}),
    "cache_refresh_percentage_per_iteration": R(0.5, WARNS),
    "refresh_interval": R(0.5, "cache", lambda c, e: c.refresh_interval),
    "refresh_delay": R(0.25, "cache", lambda c, e: c.refresh_delay),
    "num_of_worker_buffer_in_pool": R(4, WARNS),
    "num_of_refresher_buffer_in_pool": R(3, WARNS),
    "use_context_stream": R(False, WARNS),
    "fuse_embedding_table": R(True, WARNS),
    "use_mixed_precision": R(True, WARNS),
    "label_dim": R(2, REFUSED),  # the graph's label is 1 wide
    "slot_num": R(5, REFUSED),  # the graph has 4 slots
    "storage_dtype": R(["int8"], "ps",
                       lambda ps, e: [s.codec.dtype.value for s in ps.model("m32").tables.values()]),
    "ttl_seconds": R([30.0], "ps", lambda ps, e: [ps.tiers["volatile"]._ttl.get(s.storage)
                                                  for s in ps.model("m32").tables.values()]),
    "min_update_count": R([3], "ps", lambda ps, e: [_admission(ps).min_update_count]),
    "admission_sketch_width": R(4096, "ps", lambda ps, e: _admission(ps, 3).sketch.width),
}


def _admission(ps, count=None):
    """The admission rule of model m32's first table, made by an update of a new id (with a
    ``min_update_count`` of ``count`` when the route does not set one)."""
    served = ps.model("m32")
    if count is not None:
        served.config.min_update_count = [count] * len(served.tables)
    spec = next(iter(served.tables.values()))
    ps.apply_update(spec.tag, [2**40], np.zeros((1, spec.dim), np.float32))
    return next(rule for (storage, _), rule in ps._admission.items() if storage == spec.storage)
PS_ROUTES = {
    "supportlonglong": R(False, "ps", lambda ps, e: e.refuses_wide_keys(ps), True),
    # the containers: each field of what they hold has its routes above
    "volatile_db": R(None, "walked"),
    "persistent_db": R(None, "walked"),
    "update_source": R(None, "walked"),
    "models": R(None, "walked"),
}

#: InferenceParams fields that are a model entry's field (under HugeCTR's name): they take
#: that field's route (MODEL_ROUTES), through InferenceParams.
INFERENCE_PARAMS = MODEL_FIELDS


def _model_of(params_, env):
    """The served model of HugeCTR's ``InferenceModel(graph, params)``: its own parameter
    server, built from the params' tiers."""
    from tierserve.server.inference_model import InferenceModel

    model = InferenceModel(str(env.m32.graph), params_)
    env.keep(model)
    return model


def _kafka_source(env):
    return UpdateSourceParams(type="kafka_message_queue",
                              brokers=env.request.getfixturevalue("kafka_broker").bootstrap)


#: The other InferenceParams fields (the parameter server's, the facade's own), each with its
#: route: "model": the ``InferenceModel`` built from the params; "config": the model entry
#: the params convert into.
INFERENCE_ROUTES = {
    "device_id": R(1, "config", lambda c, e: c.deployed_device_list, [1]),
    "i64_input_key": R(True, "model", lambda m, e: (m.i64_input_key,
                                                    m.parameter_server.config.supportlonglong),
                       (True, True)),
    "scaler": R(2.0, WARNS),
    "use_algorithm_search": R(False, WARNS),
    "use_cuda_graph": R(False, WARNS),
    "thread_pool_size": R(4, WARNS),
    "volatile_db": R(lambda e: VolatileDatabaseParams(type="parallel_hash_map", num_partitions=3),
                     "model", lambda m, e: (m.parameter_server.volatile.kind,
                                            m.parameter_server.volatile.num_partitions),
                     ("parallel_hash_map", 3)),
    "persistent_db": R(lambda e: PersistentDatabaseParams(type="rocks_db",
                                                          path=str(e.tmp / "params_rocksdb")),
                       "model", lambda m, e: m.parameter_server.persistent.path,
                       lambda e: str(e.tmp / "params_rocksdb")),
    "update_source": R(_kafka_source, "model",
                       lambda m, e: [c._settings["bootstrap.servers"] for c in m.update_consumers],
                       lambda e: [e.request.getfixturevalue("kafka_broker").bootstrap]),
    "non_trainable_params_file": R(lambda e: str(e.tmp / "missing_non_trainable.model"),
                                   REFUSED),
}  # fmt: skip

PARAMS = {
    "max_batchsize": "max_batch_size", "hit_rate_threshold": "hit_rate_threshold",
    "use_gpu_embedding_cache": "gpucache", "cache_size_percentage": "gpucacheper",
    "cache_refresh_percentage_per_iteration": "cache_refresh_percentage_per_iteration",
    "refresh_interval": "refresh_interval", "refresh_delay": "refresh_delay",
    "deployed_devices": "deployed_device_list", "use_mixed_precision": "use_mixed_precision",
    "number_of_worker_buffers_in_pool": "num_of_worker_buffer_in_pool",
    "number_of_refresh_buffers_in_pool": "num_of_refresher_buffer_in_pool",
    "default_value_for_each_table": "default_value_for_each_table",
}  # fmt: skip

#: Where a path takes a field otherwise than ps.json does: HugeCTR's InferenceParams repeat
#: the graph's table names (they must agree with it); ps.json's rename the tables.
PATH_ROUTES = {
    ("embedding_table_names", "InferenceParams"): R(["table0"], REFUSED),
}

PARAMS = {"volatile": VolatileDatabaseParams, "persistent": PersistentDatabaseParams}
ALL_ROUTES = {**TIER_ROUTES, KafkaUpdateSourceConfig: SOURCE_ROUTES, ModelConfig: MODEL_ROUTES,
              PSConfig: PS_ROUTES}  # fmt: skip


# --- the environment of one check ----------------------------------------------------------------


@pytest.fixture(scope="module")
def m32(tmp_path_factory):
    from model32 import train_model32

    return train_model32(tmp_path_factory.mktemp("m32"))


class Env:
    """The services and files one check builds its objects from."""

    def __init__(self, request, tmp_path, m32) -> None:
        self.request, self.tmp, self.m32 = request, tmp_path, m32
        self.table = read_sparse_model(m32.sparse, 4)
        self.rows = self.table.keys.size
        self._stack = contextlib.ExitStack()

    def close(self) -> None:
        self._stack.close()

    def keep(self, obj):
        """Close ``obj`` when the check ends."""
        self._stack.callback(obj.close)
        return obj

    # the services
    def redis(self, cluster: bool):
        name = "redis_cluster" if cluster else "redis_server"
        return self.request.getfixturevalue(name)

    def base_tier(self, cls) -> dict:
        """The fields a tier of ``cls`` needs here (a server, a folder)."""
        if cls is RedisConfig:
            return {"address": self.redis(False).url}
        if cls is RedisClusterConfig:
            return {"address": self.redis(True).addresses}
        if cls is MultiProcessHashMapConfig:
            return {"shared_memory_name": self.shm_name()}
        if cls is RocksDBConfig:
            return {"path": str(self.tmp / "rocksdb")}
        return {}

    # the model
    def model_entry(self, **fields) -> dict:
        m = self.m32
        entry = {"model": "m32", "sparse_files": [str(m.sparse)], "dense_file": str(m.dense),
                 "network_file": str(m.graph), "embedding_vecsize_per_table": [4],
                 "maxnum_catfeature_query_per_table_per_sample": [4],
                 "embedding_table_names": ["emb"]}  # fmt: skip
        return {**entry, **fields}

    @property
    def half_sparse(self) -> str:
        folder = self.tmp / "half_sparse.model"
        if not folder.exists():
            n = self.rows // 2
            write_sparse_model(folder, self.table.keys[:n], self.table.embeddings[:n])
        return str(folder)

    def storage(self, ps) -> str:
        model = ps.model(ps.models()[0])
        return next(iter(model.tables.values())).storage

    def volatile_rows(self, ps) -> int:
        return ps.volatile.size(self.storage(ps))

    def volatile_share(self, ps) -> float:
        return self.volatile_rows(ps) / self.rows

    def copied_up(self, ps) -> bool:
        stored = ps.volatile.list_keys(self.storage(ps))
        key = np.setdiff1d(self.table.keys, stored)[:1]
        ps.lookup(ps.models()[0], "emb", key)
        return bool(np.isin(key, ps.volatile.list_keys(self.storage(ps))).all())

    def missing_key_value(self, ps) -> float:
        return float(ps.lookup(ps.models()[0], "emb", [10**12])[0, 0])

    def refuses_wide_keys(self, ps) -> bool:
        try:
            ps.lookup("m32", "emb", np.array([2**40], np.int64))
        except InvalidInputError:
            return True
        return False

    def shm_name(self) -> str:
        """A fresh folder name under /dev/shm, removed when the check ends."""
        from tierserve.ps.shm_hash_map import SHM_ROOT

        name = f"ts-paths-{uuid.uuid4().hex[:8]}"
        self._stack.callback(shutil.rmtree, SHM_ROOT / name, True)
        return name

    # Redis
    def reaches_given_nodes(self, tier) -> bool:
        """Whether the tier's client talks to the nodes its ``address`` names (a cluster's
        other nodes may be replicas: the client's primaries are among them)."""
        given = {int(a.rpartition(":")[2].split("/")[0])
                 for a in tier.config.address.replace("redis://", "").split(",")}  # fmt: skip
        client = tier._client
        if hasattr(client, "get_nodes"):
            used = {node.port for node in client.get_nodes() if node.server_type == "primary"}
        else:
            used = {client.connection_pool.connection_kwargs["port"]}
        return bool(used) and used <= given

    def client_kwargs(self, tier) -> dict:
        client = tier._client
        if hasattr(client, "get_nodes"):
            client = client.get_redis_connection(client.get_default_node())
        return client.connection_pool.connection_kwargs


@pytest.fixture
def env(request, tmp_path, m32):
    e = Env(request, tmp_path, m32)
    yield e
    e.close()


def _resolve(value, env):
    return value(env) if callable(value) else value


# --- every field has a route ---------------------------------------------------------------------


def test_every_field_has_a_route():
    missing, unknown = [], []
    for cls, routes in ALL_ROUTES.items():
        fields = set(cls.model_fields)
        missing += [f"{cls.__name__}.{f}" for f in sorted(fields - set(routes))]
        unknown += [f"{cls.__name__}.{f}" for f in sorted(set(routes) - fields)]
    assert missing == [], f"settings with no route (honour, refuse or warn; then route): {missing}"
    assert unknown == []


def test_every_inference_params_field_has_a_route():
    """Each ``InferenceParams`` field is a model entry's field (then it takes its route) or
    has a route of its own."""
    fields = set(InferenceParams.model_fields)
    shared = {name for name in fields if name in INFERENCE_PARAMS}
    assert {INFERENCE_PARAMS[name] for name in shared} <= set(MODEL_ROUTES)
    assert sorted(fields - shared - set(INFERENCE_ROUTES)) == []
    assert set(INFERENCE_ROUTES) <= fields


def test_every_hugectr_parameter_is_a_config_field_with_a_route():
    """Each field of HugeCTR's parameter objects is (under its ps.json name) a field of a
    config model of its level, so it takes that model's route."""
    from tierserve.ps.tier_registry import tier_configs

    levels = {VolatileDatabaseParams: tier_configs("volatile"),
              PersistentDatabaseParams: tier_configs("persistent"),
              UpdateSourceParams: (KafkaUpdateSourceConfig,)}  # fmt: skip
    for params, configs in levels.items():
        for name in params.FIELDS:
            key = params.RENAMED.get(name, name)
            owners = [c for c in configs if key in c.model_fields]
            assert owners, f"{params.__name__}.{name} is no field of {configs}"
            assert all(key in ALL_ROUTES[c] for c in owners)


# --- the tiers and the update source -------------------------------------------------------------


def _tier_cases():
    for cls, routes in TIER_ROUTES.items():
        marks = ()
        if cls is RedisConfig:
            marks = (pytest.mark.redis,)
        elif cls is RedisClusterConfig:
            marks = (pytest.mark.redis_cluster,)
        params = PARAMS[cls.level]
        for name, route in routes.items():
            # HugeCTR's object carries HugeCTR's fields (and the multi-process map has none)
            paths = ["ps.json"]
            if (cls is not MultiProcessHashMapConfig
                    and {name, *route.extra} <= set(params.FIELDS)):  # fmt: skip
                paths.append("params")
            for path in paths:
                yield pytest.param(cls, name, path, marks=marks, id=f"{cls.__name__}.{name}-{path}")


def _tier_data(cls, name, route, env) -> dict:
    value = _resolve(route.value, env)
    data = {"type": cls.model_fields["type"].default.value, **env.base_tier(cls), **route.extra}
    if value is not None:
        data[name] = value
    return data


def _build_tier_config(cls, data: dict, path: str):
    """The typed config of ``data`` through ``path``: ps.json, or HugeCTR's object."""
    level = cls.level
    if path == "ps.json":
        key = "volatile_db" if level == "volatile" else "persistent_db"
        return getattr(parse_ps_config({key: data}), key)
    return PARAMS[level](**data).to_config()


def _ps_around(env, volatile=None, persistent=None, load=True) -> HierarchicalParameterServer:
    """A parameter server serving the test model, with a RocksDB behind the volatile tier."""
    if volatile is None:
        volatile = HashMapConfig()
    if persistent is None:
        persistent = RocksDBConfig(path=str(env.tmp / "behind"))
    config = PSConfig(volatile_db=volatile, persistent_db=persistent,
                      models=[ModelConfig(**env.model_entry())])  # fmt: skip
    return env.keep(HierarchicalParameterServer(config, load=load))


def _arrived(route, obj, env, value):
    got = route.read(obj, env)
    want = _resolve(route.expect, env) if route.expect is not None else value
    assert got == want, f"arrived {got!r}, expected {want!r}"


@pytest.mark.parametrize("cls,name,path", list(_tier_cases()))
def test_tier_setting_arrives(cls, name, path, env):
    route = TIER_ROUTES[cls][name]
    data = _tier_data(cls, name, route, env)
    value = data.get(name, cls.model_fields["type"].default.value)
    if route.target == REFUSED:
        with pytest.raises(TierserveError, match=name):
            _build_tier_config(cls, data, path)
        return
    if route.target == WARNS:
        reset_warnings()
        with pytest.warns(HugeCTRCompatibilityWarning, match=name):
            _build_tier_config(cls, data, path)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HugeCTRCompatibilityWarning)
        config = _build_tier_config(cls, data, path)
    assert isinstance(config, cls)
    if route.target == "client":
        _arrived(route, connection_kwargs(config), env, value)
    elif route.target == "tier":
        _arrived(route, env.keep(create_tier(config)), env, value)
    else:
        if name == "read_only":  # a read-only database must exist: the server made it before
            env.keep(create_tier(config.model_copy(update={"read_only": False}))).close()
        # attaching (to what another process loaded) finds no tables here: nothing loaded
        load = name not in ("initialize_after_startup", "read_only")
        ps = (_ps_around(env, persistent=config, load=load) if cls.level == "persistent"
              else _ps_around(env, volatile=config, load=load))  # fmt: skip
        _arrived(route, ps, env, value)


@pytest.mark.parametrize("name", list(SOURCE_ROUTES))
@pytest.mark.parametrize("path", ["ps.json", "params"])
def test_update_source_setting_arrives(name, path, env):
    route = SOURCE_ROUTES[name]
    data = {"type": "kafka_message_queue"}
    if route.value is not None:
        data[name] = route.value
    if path == "ps.json":
        config = parse_ps_config({"update_source": data}).update_source
    else:
        renamed = {v: k for k, v in UpdateSourceParams.RENAMED.items()}
        config = UpdateSourceParams(**{renamed.get(k, k): v for k, v in data.items()}).to_config()
    assert isinstance(config, KafkaUpdateSourceConfig)
    ps = _ps_around(env)
    consumer = env.keep(UpdateConsumer(ps, config, "volatile", replica="paths"))  # not started
    _arrived(route, consumer, env, route.value)


def test_top_level_setting_arrives(env):
    route = PS_ROUTES["supportlonglong"]
    data = {"supportlonglong": False, "volatile_db": {"type": "hash_map"},
            "models": [env.model_entry()]}  # fmt: skip
    ps = env.keep(HierarchicalParameterServer(parse_ps_config(data)))
    _arrived(route, ps, env, False)


# --- the models -------------------------------------------------------------------------------


def _model_paths(name: str) -> list[str]:
    paths = ["ps.json"]
    if name in INFERENCE_PARAMS.values():
        paths.append("InferenceParams")
    paths += [f"inference JSON: {key}" for key, f in CLAUSE_FIELDS.items() if f == name]
    return paths


def _model_config(env, name, value, extra, path) -> ModelConfig:
    """The model entry with ``name`` = ``value`` through ``path``; the other paths carry only
    the fields they have, so the rest of the entry is ps.json's."""
    if path == "ps.json":
        return parse_ps_config({"models": [env.model_entry(**{**extra, name: value})]}).models[0]
    if path == "InferenceParams":
        named = {f: p for p, f in INFERENCE_PARAMS.items()}
        params_ = env.m32.inference_params(**{named[k]: v for k, v in {**extra, name: value}.items()})
        return read_params(str(env.m32.graph), params_)[0]
    key = path.partition(": ")[2]  # "inference JSON: <the clause's key>"
    graph = json.loads(env.m32.graph.read_text())
    graph["inference"] = {"dense_model_file": str(env.m32.dense),
                          "sparse_model_file": [str(env.m32.sparse)], key: value}  # fmt: skip
    path_ = env.tmp / "inference.json"
    path_.write_text(json.dumps(graph))
    return model_config_from_inference_json(path_, "m32")


def _model_cases():
    for name in MODEL_ROUTES:
        for path in _model_paths(name):
            yield pytest.param(name, path, id=f"{name}-{path}")


def _serve(env, config: ModelConfig, target: str):
    """The object that uses a model entry: the parameter server, the cache, the server's
    model (the chain a server builds: parameter server, then the model over it)."""
    from tierserve.server.inference_model import InferenceModel

    ps_config = PSConfig(volatile_db=HashMapConfig(), models=[config])
    ps = env.keep(HierarchicalParameterServer(ps_config, load=target in ("ps", "cache")))
    if target == "ps":
        return ps
    if target == "cache":
        caches = env.keep(CreateEmbeddingCache(ps, 0, False, None, config, config.model))
        return caches[0]
    model = InferenceModel.from_config(config, ps, i64_input_key=False)
    env._stack.callback(model.discard)
    return model


@pytest.mark.parametrize("name,path", list(_model_cases()))
def test_model_setting_arrives(name, path, env):
    route = PATH_ROUTES.get((name, path), MODEL_ROUTES[name])
    value = _resolve(route.value, env)
    if route.target == WARNS:
        reset_warnings()
        with pytest.warns(HugeCTRCompatibilityWarning, match=name):
            _model_config(env, name, value, route.extra, path)
        return
    if route.target == REFUSED:
        with pytest.raises(TierserveError, match=f"{name}|{re.escape(str(value))}"):
            config = _model_config(env, name, value, route.extra, path)
            _serve(env, config, "server")
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HugeCTRCompatibilityWarning)
        config = _model_config(env, name, value, route.extra, path)
    assert getattr(config, name) == value  # every hop keeps the value
    if path != "ps.json":
        return  # past the hop the entry is the same model config: its route was checked once
    _arrived(route, _serve(env, config, route.target), env, value)


def _inference_cases():
    for name in INFERENCE_ROUTES:
        marks = (pytest.mark.kafka,) if name == "update_source" else ()
        yield pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("name", list(_inference_cases()))
def test_inference_params_setting_arrives(name, env):
    route = INFERENCE_ROUTES[name]
    value = _resolve(route.value, env)
    if route.target == WARNS:
        reset_warnings()
        with pytest.warns(HugeCTRCompatibilityWarning, match=name):
            read_params(str(env.m32.graph), env.m32.inference_params(**{name: value}))
        return
    if route.target == REFUSED:
        with pytest.raises(TierserveError, match=f"{name}|{re.escape(str(value))}"):
            _model_of(env.m32.inference_params(**{name: value}), env)
        return
    params_ = env.m32.inference_params(**{name: value})
    assert getattr(params_, name) is value or getattr(params_, name) == value
    if route.target == "config":
        obj = read_params(str(env.m32.graph), params_)[0]
    else:
        obj = _model_of(params_, env)
    _arrived(route, obj, env, value)


@pytest.mark.parametrize("path", _model_paths("gpucacheper"))
def test_cache_percentage_has_one_rule_on_every_path(path, env):
    """HugeCTR's rule for ``cache_size_percentage`` / ``gpucacheper``: a share in [0, 1]; 0
    is the smallest cache (HugeCTR rounds it up to its least cache size; ours holds one
    set).  Every path honours 0 the same way and refuses 1.5 naming the field as that path
    calls it."""
    config = _model_config(env, "gpucacheper", 0.0, {}, path)
    assert config.gpucacheper == 0.0
    cache = _serve(env, config, "cache")
    assert 1 <= cache.capacity <= 2  # one set of the set-associative cache
    keys = env.table.keys[:50]
    np.testing.assert_array_equal(to_host(cache.query(keys)), env.table.embeddings[:50])
    named = {"ps.json": "gpucacheper", "InferenceParams": "cache_size_percentage"}
    name = named.get(path, f"inference.{path.partition(': ')[2]}")
    with pytest.raises(TierserveError, match=rf"{re.escape(name)}: .*less than or equal to 1"):
        _model_config(env, "gpucacheper", 1.5, {}, path)
