"""The model runtime behind HugeCTR's inference API: ``InferenceParams`` and ``InferenceModel``.

``InferenceModel(model_config_path, inference_params)`` reads the graph JSON and dense file
into the trainer's forward-only :class:`~tierserve.model.inference_graph.InferenceGraph`
(the same layers as training), puts the sparse model folders into the hierarchical parameter
server's tiers (``volatile_db``, ``persistent_db``), optionally fronted by the embedding cache,
and predicts: per table, the batch's keys are looked up once each (unique), the vectors are
combined per slot by the trainer's own embedding ``combine`` (sum or mean), and the dense network runs.
With the embedding cache on a GPU, combining and the dense network run on that GPU too.

This is the runtime the server loads; HugeCTR's facade
(:mod:`tierserve.trainer.hugectr.inference`) adds ``predict`` and ``evaluate`` over a dataset
and the older ``InferenceSession``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tierserve.core.errors import ConfigError, InvalidInputError
from tierserve.model.batch import Batch
from tierserve.model.combine import combine
from tierserve.model.device import to_numpy, to_xp
from tierserve.model.graph_json import Graph, load_graph_json
from tierserve.model.inference_graph import EmbeddingSpec, InferenceGraph
from tierserve.ps.config import (
    ModelConfig,
    PersistentDBConfig,
    PSConfig,
    UpdateSourceConfig,
    VolatileDBConfig,
    format_validation_errors,
)
from tierserve.ps.keys import as_keys
from tierserve.ps.params import PersistentDatabaseParams, UpdateSourceParams, VolatileDatabaseParams

if TYPE_CHECKING:
    from tierserve.cache.model_cache import ModelCache
    from tierserve.cache.protocols import ParameterServerLike
    from tierserve.ps.hierarchy import HierarchicalParameterServer

#: What a model reads its tables through: a hierarchical parameter server (the model stages
#: its version there), or any parameter server that already holds the tables (a cache's
#: ``CreateEmbeddingCache`` object, a test's own).
ParameterServer = Union["HierarchicalParameterServer", "ParameterServerLike"]

log = logging.getLogger("tierserve.server.inference_model")


# --- parameters ------------------------------------------------------------------------------


def _tier_config(value: Any, adapter) -> Any:
    if hasattr(value, "to_config"):
        return value.to_config()
    return value if not isinstance(value, dict) else adapter(value)


class InferenceParams(BaseModel):
    """HugeCTR's ``InferenceParams``: the first eight arguments may be given by position.

    ``device_id`` (HugeCTR's 6th argument, here keyword only) is the device of
    ``CreateInferenceSession``'s session and embedding cache, as in HugeCTR;
    ``InferenceModel`` uses ``deployed_devices``, unless only ``device_id`` is given.

    Beyond HugeCTR's fields, ``volatile_db``, ``persistent_db`` and ``update_source`` take the
    parameter objects of :mod:`tierserve.ps.params` (or their typed configs or dicts), and
    ``network_file`` / ``non_trainable_params_file`` override where the graph's files are.
    """

    model_config = ConfigDict(
        extra="forbid", arbitrary_types_allowed=True, validate_assignment=True
    )

    model_name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,120}$")]
    max_batchsize: Annotated[int, Field(gt=0)]
    hit_rate_threshold: Annotated[float, Field(ge=0.0, le=1.0)]
    dense_model_file: str
    sparse_model_files: list[str]
    device_id: Annotated[int, Field(ge=0)] = 0
    use_gpu_embedding_cache: bool
    cache_size_percentage: Annotated[float, Field(ge=0.0, le=1.0)]
    i64_input_key: bool
    use_mixed_precision: bool = False
    scaler: float = 1.0
    use_algorithm_search: bool = True
    use_cuda_graph: bool = True
    number_of_worker_buffers_in_pool: Annotated[int, Field(gt=0)] = 2
    number_of_refresh_buffers_in_pool: Annotated[int, Field(gt=0)] = 1
    cache_refresh_percentage_per_iteration: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0
    deployed_devices: list[int] = Field(default_factory=lambda: [0])
    default_value_for_each_table: list[float] = Field(default_factory=lambda: [0.0])
    volatile_db: Any = None
    persistent_db: Any = None
    update_source: Any = None
    maxnum_des_feature_per_sample: Annotated[int, Field(ge=0)] = 26
    refresh_delay: Annotated[float, Field(ge=0.0, allow_inf_nan=False)] = 0.0
    refresh_interval: Annotated[float, Field(ge=0.0, allow_inf_nan=False)] = 0.0
    maxnum_catfeature_query_per_table_per_sample: list[int] = Field(default_factory=list)
    embedding_vecsize_per_table: list[int] = Field(default_factory=list)
    embedding_table_names: list[str] = Field(default_factory=list)
    network_file: str = ""
    label_dim: Annotated[int, Field(gt=0)] = 1
    slot_num: Annotated[int, Field(gt=0)] = 10
    non_trainable_params_file: str = ""

    _POSITIONAL: ClassVar[tuple[str, ...]] = (
        "model_name",
        "max_batchsize",
        "hit_rate_threshold",
        "dense_model_file",
        "sparse_model_files",
        "use_gpu_embedding_cache",
        "cache_size_percentage",
        "i64_input_key",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if len(args) > len(self._POSITIONAL):
            raise ConfigError(
                f"InferenceParams takes at most {len(self._POSITIONAL)} positional arguments"
            )
        for name, value in zip(self._POSITIONAL, args):
            if name in kwargs:
                raise ConfigError(f"InferenceParams: {name} given twice")
            kwargs[name] = value
        if isinstance(kwargs.get("sparse_model_files"), (str, os.PathLike)):
            kwargs["sparse_model_files"] = [kwargs["sparse_model_files"]]
        try:
            super().__init__(**kwargs)
        except ValidationError as exc:
            raise ConfigError(format_validation_errors(exc, "InferenceParams")) from None

    def tier_configs(self) -> tuple[Any, Any, Any]:
        """The typed volatile, persistent and update-source configs."""
        from pydantic import TypeAdapter

        vdb = self.volatile_db if self.volatile_db is not None else VolatileDatabaseParams()
        pdb = self.persistent_db if self.persistent_db is not None else PersistentDatabaseParams()
        src = self.update_source if self.update_source is not None else UpdateSourceParams()
        return (
            _tier_config(vdb, TypeAdapter(VolatileDBConfig).validate_python),
            _tier_config(pdb, TypeAdapter(PersistentDBConfig).validate_python),
            _tier_config(src, TypeAdapter(UpdateSourceConfig).validate_python),
        )


# --- the model -------------------------------------------------------------------------------


#: InferenceParams fields with no effect here, and what happens instead (warned once when given).
PARAMS_NOT_HONOURED = {
    "use_algorithm_search": "no cuBLAS algorithm search; numpy/cupy pick the GEMM kernels",
    "use_cuda_graph": "no CUDA graphs; each layer runs as its own numpy/cupy calls",
    "scaler": "inference computes in float32, so there is no loss scale",
}


def check_params_against_graph(
    p: InferenceParams, network: InferenceGraph, slots: list[int], graph_path
) -> None:
    """HugeCTR's ``InferenceParams`` repeat what the graph defines (table names, vector sizes,
    slots, label and dense widths): when given, they must agree with ``graph_path``; and the
    switches of :data:`PARAMS_NOT_HONOURED` warn once when given."""
    from tierserve.core.compat import warn_once

    tables = list(network.embeddings)
    graph = {
        "embedding_table_names": [t.name for t in tables],
        "embedding_vecsize_per_table": [t.embedding_vec_size for t in tables],
        "label_dim": sum(network.label_dims),
        "slot_num": sum(slots),
    }
    given = p.model_fields_set
    for name, value in graph.items():
        if name in given and getattr(p, name) != value:
            raise ConfigError(
                f"InferenceParams.{name} is {getattr(p, name)!r} but the graph {graph_path} "
                f"defines {value!r}"
            )
    at_least = {
        "maxnum_catfeature_query_per_table_per_sample": [max(t.max_nnz, t.slot_num)
                                                         for t in tables],
        "maxnum_des_feature_per_sample": network.dense_dim,
    }
    for name, need in at_least.items():
        if name not in given:
            continue
        value = getattr(p, name)
        ok = (len(value) == len(need) and all(v >= n for v, n in zip(value, need))
              if isinstance(need, list) else value >= need)
        if not ok:
            raise ConfigError(
                f"InferenceParams.{name} is {value!r}; the graph {graph_path} needs at least "
                f"{need!r}"
            )
    for name, instead in PARAMS_NOT_HONOURED.items():
        if name in given:
            warn_once(f"InferenceParams.{name}", instead, stacklevel=4)


def serving_devices(p: InferenceParams) -> list[int]:
    """``deployed_devices``, or ``[device_id]`` when only ``device_id`` was given."""
    if "device_id" in p.model_fields_set and "deployed_devices" not in p.model_fields_set:
        return [p.device_id]
    return list(p.deployed_devices)


def model_config_fields(p: InferenceParams) -> dict[str, Any]:
    """The ``ps.json`` model entry fields that ``InferenceParams`` give by themselves (files,
    batch size, devices, defaults, cache settings); the per-table shape of the model (names,
    vector sizes, keys per sample) comes from the graph or the HPS config."""
    return dict(
        model=p.model_name,
        sparse_files=[os.fspath(f) for f in p.sparse_model_files],
        dense_file=os.fspath(p.dense_model_file),
        max_batch_size=p.max_batchsize,
        deployed_device_list=serving_devices(p),
        hit_rate_threshold=p.hit_rate_threshold,
        gpucache=p.use_gpu_embedding_cache,
        gpucacheper=p.cache_size_percentage,
        cache_refresh_percentage_per_iteration=p.cache_refresh_percentage_per_iteration,
        refresh_interval=p.refresh_interval,
        refresh_delay=p.refresh_delay,
        # given only when the script set them (the defaults differ; they warn, see ModelConfig)
        **{name: getattr(p, field) for field, name in (
            ("number_of_worker_buffers_in_pool", "num_of_worker_buffer_in_pool"),
            ("number_of_refresh_buffers_in_pool", "num_of_refresher_buffer_in_pool"),
        ) if field in p.model_fields_set},
        use_mixed_precision=p.use_mixed_precision,
    )


def table_defaults(p: InferenceParams, num_tables: int) -> list[float]:
    """``default_value_for_each_table``, one value repeated for every table."""
    defaults = list(p.default_value_for_each_table)
    return defaults * num_tables if len(defaults) == 1 and num_tables > 1 else defaults


def model_config_from_params(
    params: InferenceParams, network: InferenceGraph, graph_path: str | os.PathLike
) -> ModelConfig:
    """The ``ps.json`` model entry (:class:`ModelConfig`) that HugeCTR's ``params`` describe.

    The one conversion from the HugeCTR facade: everything past it reads the model config.
    Per-table values the graph defines (table names, vector sizes, slots) come from the graph.
    """
    p = params
    tables = list(network.embeddings)
    if len(p.sparse_model_files) != len(tables):
        raise ConfigError(
            f"model {p.model_name!r}: {len(p.sparse_model_files)} sparse model files for "
            f"{len(tables)} embedding tables in {graph_path}"
        )
    slots = [int(s["slot_num"]) for s in load_graph_json(graph_path).data_layer.get("sparse", [])]
    check_params_against_graph(p, network, slots, graph_path)
    return ModelConfig(
        **model_config_fields(p),
        network_file=os.fspath(graph_path),
        default_value_for_each_table=table_defaults(p, len(tables)),
        maxnum_des_feature_per_sample=network.dense_dim,
        maxnum_catfeature_query_per_table_per_sample=[max(t.max_nnz, t.slot_num) for t in tables],
        embedding_vecsize_per_table=[t.embedding_vec_size for t in tables],
        embedding_table_names=[t.name for t in tables],
        label_dim=sum(network.label_dims),
        slot_num=max(1, sum(slots)),
    )


class InferenceModel:
    """Predicts with a trained model; see the module docstring.

    ``InferenceModel(graph, params)`` is HugeCTR's form: it builds its own parameter server from
    the params (and reads online updates into it when ``update_source`` is a Kafka one), or,
    given ``parameter_server``, loads its tables into that one and serves them at once.
    :meth:`from_config` is the server's form: a ``ps.json`` model entry, used as it is, whose
    tables are *staged* in a shared parameter server; the owner then calls :meth:`commit` (the
    tables become the ones name-addressed calls reach) or :meth:`discard` (they are dropped).
    A model always reads the tables it was loaded with, whatever version is committed later.
    """

    def __init__(
        self,
        model_config_path: str | os.PathLike,
        inference_params: InferenceParams,
        parameter_server: ParameterServer | None = None,
    ) -> None:
        p = inference_params
        graph_path = p.network_file or model_config_path
        graph = load_graph_json(graph_path)
        network = InferenceGraph(graph, p.dense_model_file, p.non_trainable_params_file or None)
        config = model_config_from_params(p, network, graph_path)
        consumers: list = []
        owns = parameter_server is None
        if owns:
            from tierserve.ps.hierarchy import HierarchicalParameterServer
            from tierserve.ps.kafka_updates import start_update_consumers

            vdb, pdb, src = p.tier_configs()
            ps_config = PSConfig(
                supportlonglong=p.i64_input_key,
                volatile_db=vdb,
                persistent_db=pdb,
                update_source=src,
                models=[],
            )
            parameter_server = HierarchicalParameterServer(ps_config)
        self.params = p
        try:
            self._setup(
                config, graph, network, parameter_server, i64_input_key=p.i64_input_key,
                use_gpu_embedding_cache=p.use_gpu_embedding_cache,
            )  # fmt: skip
            replaced = self.commit()
            if replaced is not None:
                parameter_server.drop_model(replaced)
            if owns:
                consumers = start_update_consumers(parameter_server, src)
        except BaseException:
            if owns:
                parameter_server.close()
            raise
        self._owns_ps = owns
        self.update_consumers = consumers  # Kafka online updates of its own server

    @classmethod
    def from_config(
        cls,
        config: ModelConfig,
        parameter_server: ParameterServer,
        *,
        i64_input_key: bool = True,
        use_gpu_embedding_cache: bool | None = None,
    ) -> InferenceModel:
        """A model over ``ps.json`` entry ``config`` whose tables are staged in
        ``parameter_server`` (call :meth:`commit` or :meth:`discard`).

        ``use_gpu_embedding_cache`` overrides the entry's ``gpucache`` (None: as it says).
        """
        if not config.network_file:
            raise ConfigError(f"model {config.model!r}: no network_file (graph JSON)")
        graph = load_graph_json(config.network_file)
        network = InferenceGraph(graph, config.dense_file, None)
        self = cls.__new__(cls)
        self.params = None
        self._owns_ps = False
        self.update_consumers = []
        cache = config.gpucache if use_gpu_embedding_cache is None else use_gpu_embedding_cache
        self._setup(
            config, graph, network, parameter_server, i64_input_key=i64_input_key,
            use_gpu_embedding_cache=cache,
        )  # fmt: skip
        return self

    def _setup(
        self,
        config: ModelConfig,
        graph: Graph,
        network: InferenceGraph,
        parameter_server: ParameterServer,
        *,
        i64_input_key: bool,
        use_gpu_embedding_cache: bool,
    ) -> None:
        self.model_config = config
        self.model_name = config.model
        self.max_batchsize = config.max_batch_size
        self.i64_input_key = i64_input_key
        self.graph = graph
        self.network = network
        self.tables: list[EmbeddingSpec] = list(network.embeddings)
        if len(config.sparse_files) != len(self.tables):
            raise ConfigError(
                f"model {config.model!r}: {len(config.sparse_files)} sparse model files for "
                f"{len(self.tables)} embedding tables in {config.network_file}"
            )
        self.dense_dim = network.dense_dim
        self.label_dim = sum(network.label_dims)
        self.table_names = [t.name for t in self.tables]
        if list(config.embedding_table_names) != self.table_names:
            # The graph names the tables; ps.json's names are matched by position.
            config = config.model_copy(update={"embedding_table_names": self.table_names})
            self.model_config = config
        # Batches carry one SparseInput per sparse input of the Data layer, in its order.
        self.sparse_names = [s["top"] for s in graph.data_layer.get("sparse", []) or []]
        self.slot_nums = [int(s["slot_num"]) for s in graph.data_layer.get("sparse", [])]
        self._table_input = [self.sparse_names.index(t.sparse_input) for t in self.tables]
        self.parameter_server = parameter_server
        self.cache: ModelCache | None = None
        self.lookup_seconds = 0.0
        self.lookups = 0
        from tierserve.ps.hierarchy import HierarchicalParameterServer

        if isinstance(parameter_server, HierarchicalParameterServer):
            self.version = parameter_server.stage_model(config)
            self.tables_source = parameter_server.version_view(self.version)
        else:  # a ParameterServerLike that already holds the tables (no versions)
            self.version = None
            self.tables_source = parameter_server
        self.xp = np  # where the dense network runs: the cache's device (see below)
        self._on_device = contextlib.nullcontext  # makes that device current (cupy: per thread)
        try:
            if use_gpu_embedding_cache:
                self.cache = self._create_cache(config)
                self._follow_the_cache()
        except BaseException:
            self.discard()
            raise

    def _follow_the_cache(self) -> None:
        """With the cache on a GPU, the dense network runs on that GPU too (as HugeCTR's
        inference does): the embeddings stay on the device from lookup to prediction."""
        xp = getattr(self.cache, "xp", np)
        if xp is np:
            return
        from tierserve.cache.device import device_context  # the cache package loads numba

        device_id = self.cache.device_id
        self.xp = xp
        self._on_device = lambda: device_context(xp, device_id)
        with self._on_device():
            self.network.to_device(xp)

    def _create_cache(self, config: ModelConfig):
        """The embedding cache of every table: on the GPU when cupy sees one, else in host
        memory (numpy), in front of this version's tables.  Its type, size and refresher are
        the model config's (``embedding_cache_type``, ``gpucacheper``, ``refresh_*``)."""
        from tierserve.cache import CreateEmbeddingCache
        from tierserve.cache.device import cupy_or_none

        return CreateEmbeddingCache(
            self.tables_source,
            config.deployed_device_list[0],
            cupy_or_none() is not None,
            None,
            config,
            self.model_name,
            self.i64_input_key,
        )

    def commit(self) -> Any:
        """Make this version's tables the ones the parameter server serves by name; returns
        the version they replace (its owner drops it), if any."""
        if self.version is None:
            return None
        return self.parameter_server.commit_model(self.version)

    def discard(self) -> None:
        """Drop this version's tables (staged or replaced) once nothing reads them, and its
        worker pool's shared copy of the dense weights."""
        if self.cache is not None:
            self.cache.close()
            self.cache = None
        self.network.release()
        if self.version is not None:
            self.parameter_server.drop_model(self.version)

    # -- lookups and prediction -------------------------------------------------------------

    def lookup(self, table: int, keys: np.ndarray) -> np.ndarray:
        """Embeddings ``[len(keys), dim]`` of table ``table`` (index in graph order)."""
        keys = as_keys(keys, 64 if self.i64_input_key else 32)
        started = time.perf_counter()
        name = self.table_names[table]
        if self.cache is not None:
            vectors = self.cache.lookup(name, keys)
        else:
            vectors = self.tables_source.lookup(self.model_name, name, keys)
        self.lookup_seconds += time.perf_counter() - started
        self.lookups += 1
        return np.asarray(vectors, dtype=np.float32)

    def embeddings(self, batch: Batch) -> list[np.ndarray]:
        """Each table's combined embeddings ``[B, slot_num, dim]`` for ``batch``."""
        inputs = [batch.sparse[i] for i in self._table_input]
        uniques, inverses = [], []
        for sparse in inputs:
            unique, inverse = np.unique(sparse.keys, return_inverse=True)
            uniques.append(as_keys(unique, 64 if self.i64_input_key else 32))
            inverses.append(inverse.reshape(-1))
        started = time.perf_counter()
        if self.cache is not None:
            found = self.cache.query_tables(uniques)  # on the network's device (self.xp)
        else:
            found = self.tables_source.lookup_tables(self.model_name, uniques)
        self.lookup_seconds += time.perf_counter() - started
        self.lookups += 1
        xp = self.xp
        return [
            combine(
                to_xp(xp, vectors, np.float32)[to_xp(xp, inverse)],
                to_xp(xp, sparse.row_offsets),
                spec.slot_num,
                spec.combiner,
            )
            for spec, sparse, vectors, inverse in zip(self.tables, inputs, found, inverses)
        ]

    def predict_batch(self, batch: Batch) -> np.ndarray:
        """Probabilities ``[batch_size, label_dim]`` for one batch."""
        if len(batch.sparse) != len(self.sparse_names):
            raise InvalidInputError(
                f"the batch has {len(batch.sparse)} sparse inputs; the model has "
                f"{len(self.sparse_names)} ({', '.join(self.sparse_names)})"
            )
        with self._on_device():
            out = self.network.predict(batch.dense, self.embeddings(batch))
        return to_numpy(out).astype(np.float32, copy=False)

    def check_out_tensor(self, tensor_name: str) -> np.ndarray:
        """HugeCTR's ``InferenceModel.check_out_tensor``: a host copy of tensor
        ``tensor_name`` (an embedding's output or a layer's top) of the last predicted batch."""
        tensors = getattr(self.network, "last_tensors", None)
        if tensors is None:
            raise ConfigError("check_out_tensor: nothing has been predicted yet")
        if tensor_name not in tensors:
            raise ConfigError(f"check_out_tensor: no tensor {tensor_name!r}; the network has "
                              f"{sorted(tensors)}")
        return np.asarray(to_numpy(tensors[tensor_name]), dtype=np.float32)

    # -- housekeeping -----------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """The embedding cache's hit rate per table (empty without a cache), for /metrics."""
        if self.cache is None:
            return {"cache_hit_rate": {}}
        return {"cache_hit_rate": {m.table: float(m.hit_rate) for m in self.cache.metrics()}}

    def close(self) -> None:
        """Release the cache and, when this model created it, the parameter server.

        The tables stay in a shared parameter server (see :meth:`discard`).
        """
        for consumer in self.update_consumers:
            consumer.close()
        self.update_consumers = []
        if self.cache is not None:
            self.cache.close()
            self.cache = None
        if self._owns_ps:
            self.parameter_server.close()


def load_inference_model(
    graph_path: str | os.PathLike, params: InferenceParams, **kwargs: Any
) -> InferenceModel:
    """``InferenceModel(graph_path, params)``, for symmetry with the loaders."""
    return InferenceModel(graph_path, params, **kwargs)
