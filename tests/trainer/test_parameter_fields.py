"""Every field of every public parameter object is honoured or refused, never accepted and
ignored.

A field counts as honoured when the code reads it somewhere (``.field`` or ``"field"`` in the
sources of ps, cache, trainer, server and clients).  Fields that are read under another name,
or that have no effect here, are listed in ``REGISTRY`` with why; those that "warn" are checked
to warn, naming themselves, when given.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import warnings
from pathlib import Path

import pytest

import tierserve.trainer as hugectr
from tierserve.core.compat import HugeCTRCompatibilityWarning, reset_warnings
from tierserve.core.errors import ConfigError
from tierserve.ps import config as ps_config
from tierserve.ps import params as ps_params
from tierserve.ps.hash_map import HashMapConfig, ParallelHashMapConfig
from tierserve.ps.kafka_source import KafkaUpdateSourceConfig
from tierserve.ps.redis_tier import RedisClusterConfig, RedisConfig
from tierserve.ps.rocksdb_tier import RocksDBConfig

ROOT = Path(__file__).resolve().parents[2]


def _classes():
    inference = hugectr.inference
    return [
        hugectr.Solver, hugectr.SolverParser, hugectr.DataReaderParams,
        hugectr.DataReaderSparseParam, hugectr.AsyncParam, hugectr.OptParamsPy,
        hugectr.CreateOptimizer, hugectr.tools.DataGeneratorParams,
        hugectr.data.DataSourceParams, hugectr.Input, hugectr.SparseEmbedding,
        hugectr.DenseLayer, hugectr.GroupDenseLayer, hugectr.HybridEmbeddingParam,
        ps_params.VolatileDatabaseParams, ps_params.PersistentDatabaseParams,
        ps_params.UpdateSourceParams, inference.InferenceParams, ps_config.PSConfig,
        ps_config.ModelConfig, HashMapConfig, ParallelHashMapConfig, RedisClusterConfig,
        RedisConfig, RocksDBConfig, KafkaUpdateSourceConfig,
    ]


def _fields(cls) -> list[str]:
    if isinstance(getattr(cls, "FIELDS", None), tuple):  # the ps params: HugeCTR's fields
        return list(cls.FIELDS)
    if hasattr(cls, "model_fields"):
        return list(cls.model_fields)
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls)]
    target = cls.__init__ if inspect.isclass(cls) else cls
    return [p.name for p in inspect.signature(target).parameters.values()
            if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


#: Fields the source search cannot see read, each with what happens to it.
REGISTRY = {
    "Solver.lr_policy": "works: LrPolicy_t has one value, fixed, the only schedule",
    "AsyncParam.num_batches_per_thread": "warns as DataReaderParams.async_param",
    "AsyncParam.io_block_size": "warns as DataReaderParams.async_param",
    "AsyncParam.io_depth": "warns as DataReaderParams.async_param",
    "AsyncParam.io_alignment": "warns as DataReaderParams.async_param",
    "AsyncParam.shuffle": "warns as DataReaderParams.async_param",
    "AsyncParam.aligned_type": "warns as DataReaderParams.async_param",
    "VolatileDatabaseParams.tls_server_name_identification": "warns",
    "RedisClusterConfig.tls_server_name_identification": "warns",
    "RedisConfig.tls_server_name_identification": "warns",
    "ModelConfig.use_static_table": "works: sets embedding_cache_type static",
    "ModelConfig.num_of_worker_buffer_in_pool": "warns",
    "ModelConfig.num_of_refresher_buffer_in_pool": "warns",
    "ModelConfig.use_context_stream": "warns",
    "ModelConfig.fuse_embedding_table": "warns",
    "DenseLayer.lambda_": "works: stored as reg_lambda",
    "Input.data_reader_sparse_param_array": "works: stored as sparse_params",
    "GroupDenseLayer.group_layer_type": "works: only GroupFusedInnerProduct, others refused",
    "GroupDenseLayer.bottom_name_list": "works: stored as bottom_names",
    "GroupDenseLayer.top_name_list": "works: stored as top_names",
}


def _sources() -> str:
    parts = []
    for folder in ("ps", "cache", "trainer", "server", "clients"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.parent != ROOT / "server" / "grpc" / "gen":
                parts.append(path.read_text())
    return "\n".join(parts)


def test_every_field_is_read_or_registered():
    text = _sources()
    unread = []
    for cls in _classes():
        for field in _fields(cls):
            key = f"{cls.__name__}.{field}"
            if key in REGISTRY:
                continue
            if not re.search(rf"\.{field}\b|[\"']{field}[\"']", text):
                unread.append(key)
    assert unread == [], f"accepted but read nowhere (honour, refuse or register): {unread}"


def test_registry_names_real_fields():
    known = {f"{c.__name__}.{f}" for c in _classes() for f in _fields(c)}
    assert set(REGISTRY) <= known


def _warns(build, name: str) -> None:
    reset_warnings()
    with pytest.warns(HugeCTRCompatibilityWarning, match=re.escape(name)):
        build()


@pytest.mark.parametrize("name,build", [
    ("tls_server_name_identification", lambda: RedisConfig(
        enable_tls=True, tls_server_name_identification="other")),
    ("models[].num_of_worker_buffer_in_pool", lambda: ps_config.ModelConfig(
        model="m", sparse_files=["x"], embedding_vecsize_per_table=[4],
        maxnum_catfeature_query_per_table_per_sample=[1], num_of_worker_buffer_in_pool=4)),
    ("models[].num_of_refresher_buffer_in_pool", lambda: ps_config.ModelConfig(
        model="m", sparse_files=["x"], embedding_vecsize_per_table=[4],
        maxnum_catfeature_query_per_table_per_sample=[1], num_of_refresher_buffer_in_pool=2)),
    ("models[].use_context_stream", lambda: ps_config.ModelConfig(
        model="m", sparse_files=["x"], embedding_vecsize_per_table=[4],
        maxnum_catfeature_query_per_table_per_sample=[1], use_context_stream=False)),
    ("models[].fuse_embedding_table", lambda: ps_config.ModelConfig(
        model="m", sparse_files=["x"], embedding_vecsize_per_table=[4],
        maxnum_catfeature_query_per_table_per_sample=[1], fuse_embedding_table=True)),
    ("models[].deployed_device_list", lambda: ps_config.ModelConfig(
        model="m", sparse_files=["x"], embedding_vecsize_per_table=[4],
        maxnum_catfeature_query_per_table_per_sample=[1], deployed_device_list=[0, 1])),
    ("DataReaderParams.async_param", lambda: hugectr.DataReaderParams(
        data_reader_type="Raw", source="x.bin",
        async_param=hugectr.AsyncParam(32, 4, 716800, 2, 512, True, hugectr.Alignment_t.Non))),
    ("DataReaderParams.keyset", lambda: hugectr.Model(  # a Model without etc warns
        hugectr.CreateSolver(), hugectr.DataReaderParams(
            data_reader_type="Norm", source=["a.txt"], keyset=["a.keyset"]),
        hugectr.CreateOptimizer())),
    ("DataReaderParams.cache_eval_data", lambda: hugectr.DataReaderParams(
        data_reader_type="Norm", source="a.txt", cache_eval_data=1)),
    ("CreateSolver.use_cuda_graph", lambda: hugectr.CreateSolver(use_cuda_graph=True)),
    ("CreateSolver.vvgpu", lambda: hugectr.CreateSolver(vvgpu=[[0, 1]])),
    ("CreateSolver.is_dlrm", lambda: hugectr.CreateSolver(is_dlrm=True)),
    ("CreateOptimizer.atomic_update", lambda: hugectr.CreateOptimizer(
        optimizer_type=hugectr.Optimizer_t.SGD, atomic_update=False)),
    ("DenseLayer.pos_type", lambda: hugectr.DenseLayer(
        layer_type=hugectr.Layer_t.FusedInnerProduct, bottom_names=["a"], top_names=["b"],
        pos_type=hugectr.FcPosition_t.Head)),
    ("SparseEmbedding.hybrid_embedding_param", lambda: hugectr.SparseEmbedding(
        hugectr.Embedding_t.LocalizedSlotSparseEmbeddingOneHot, 1, 4, "sum", "e", "d",
        hybrid_embedding_param=hugectr.HybridEmbeddingParam(
            2, -1, 0.01, 1.3e11, 1.9e11, 1.0, hugectr.CommunicationType.IB_NVLink_Hier,
            hugectr.HybridEmbeddingType.Distributed))),
])
def test_unhonoured_settings_warn_naming_themselves(name, build):
    _warns(build, name)


def test_unhonoured_settings_warn_once():
    reset_warnings()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hugectr.CreateSolver(use_cuda_graph=True)
        hugectr.CreateSolver(use_cuda_graph=True)
    assert len([w for w in caught if "use_cuda_graph" in str(w.message)]) == 1


def test_refused_settings_say_why():
    with pytest.raises(ConfigError, match="1 ps_types for 0 sparse_models"):
        hugectr.CreateETC(ps_types=[hugectr.TrainPSType_t.Staged], sparse_models=[])
    with pytest.raises(ConfigError, match="HybridSparseEmbedding"):
        hugectr.SparseEmbedding(hugectr.Embedding_t.HybridSparseEmbedding, 1, 4, "sum", "e", "d")
    with pytest.raises(ConfigError, match="algorithm 'stl'"):
        hugectr.inference.VolatileDatabaseParams(algorithm=hugectr.DatabaseHashMapAlgorithm_t.stl)
    with pytest.raises(ConfigError, match="use_static_table"):
        ps_config.parse_ps_config({"models": [{
            "model": "m", "sparse_files": ["x"], "embedding_vecsize_per_table": [4],
            "maxnum_catfeature_query_per_table_per_sample": [1], "use_static_table": True,
            "embedding_cache_type": "dynamic"}]})


def test_inference_params_that_repeat_the_graph_must_agree_with_it(tmp_path):
    from model32 import train_model32

    m = train_model32(tmp_path / "m")
    good = hugectr.inference.InferenceModel(
        str(m.graph), m.inference_params(embedding_table_names=["emb"], label_dim=1,
                                         slot_num=4, embedding_vecsize_per_table=[4]))
    good.close()
    for field, value, graph in [("embedding_table_names", ["other"], "['emb']"),
                                ("embedding_vecsize_per_table", [8], "[4]"),
                                ("label_dim", 2, "1"), ("slot_num", 26, "4"),
                                ("maxnum_des_feature_per_sample", 1, "3")]:
        with pytest.raises(ConfigError, match=rf"InferenceParams.{field} .*{re.escape(graph)}"):
            hugectr.inference.InferenceModel(str(m.graph), m.inference_params(**{field: value}))
    _warns(lambda: hugectr.inference.InferenceModel(
        str(m.graph), m.inference_params(use_cuda_graph=True)).close(),
        "InferenceParams.use_cuda_graph")
