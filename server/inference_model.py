"""The model runtime behind HugeCTR's inference API: ``InferenceModel`` (``InferenceParams``,
from :mod:`tierserve.server.inference_params`, is re-exported here, beside it).

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
from typing import TYPE_CHECKING, Any, Union

import numpy as np

from tierserve.core.errors import ConfigError, InvalidInputError
from tierserve.model.batch import Batch
from tierserve.model.combine import CsrLayout, check_csr, combine
from tierserve.model.device import to_numpy, to_xp
from tierserve.model.graph_json import Graph, load_graph_json
from tierserve.model.inference_graph import EmbeddingSpec, InferenceGraph
from tierserve.ps.config import ModelConfig, PSConfig
from tierserve.ps.keys import as_keys

from .inference_params import InferenceParams, check_against_graph, read_params

if TYPE_CHECKING:
    from tierserve.cache.model_cache import ModelEmbeddingCache
    from tierserve.cache.protocols import ParameterServerLike
    from tierserve.ps.hierarchy import HierarchicalParameterServer

#: What a model reads its tables through: a hierarchical parameter server (the model stages
#: its version there), or any parameter server that already holds the tables (a cache's
#: ``CreateEmbeddingCache`` object, a test's own).
ParameterServer = Union["HierarchicalParameterServer", "ParameterServerLike"]

log = logging.getLogger("tierserve.server.inference_model")


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
        config, graph, network = read_params(model_config_path, p)
        network.keep_tensors = True  # HugeCTR's InferenceModel: check_out_tensor
        ps_config = None
        if parameter_server is not None:
            from tierserve.core.compat import warn_once

            for name in ("volatile_db", "persistent_db", "update_source"):
                if getattr(p, name) is not None:
                    warn_once(f"InferenceParams.{name}", "not used: the model reads the tiers "
                              "of the parameter_server it was given", stacklevel=3)  # fmt: skip
        else:
            vdb, pdb, src = p.tier_configs()
            ps_config = PSConfig(supportlonglong=p.i64_input_key, volatile_db=vdb,
                                 persistent_db=pdb, update_source=src, models=[])  # fmt: skip
        self.params = p
        self._open(config, graph, network, parameter_server, ps_config,
                   i64_input_key=p.i64_input_key,
                   use_gpu_embedding_cache=p.use_gpu_embedding_cache)  # fmt: skip

    @classmethod
    def open(
        cls,
        config: ModelConfig,
        parameter_server: ParameterServer | None = None,
        ps_config: PSConfig | None = None,
        *,
        i64_input_key: bool = True,
        use_gpu_embedding_cache: bool | None = None,
    ) -> InferenceModel:
        """A model over ``ps.json`` entry ``config``, serving at once: its tables loaded into
        ``parameter_server``, or into a parameter server of its own built from ``ps_config``
        (``parameter_server`` None; the model's Kafka consumers start when its
        ``update_source`` is a Kafka one).  ``use_gpu_embedding_cache`` overrides the entry's
        ``gpucache`` (None: as it says)."""
        graph, network = cls._graph_of(config)
        self = cls.__new__(cls)
        self.params = None
        cache = config.gpucache if use_gpu_embedding_cache is None else use_gpu_embedding_cache
        self._open(config, graph, network, parameter_server, ps_config,
                   i64_input_key=i64_input_key, use_gpu_embedding_cache=cache)  # fmt: skip
        return self

    def _open(
        self, config: ModelConfig, graph: Graph, network: InferenceGraph, parameter_server: ParameterServer | None,
        ps_config: PSConfig | None, *, i64_input_key: bool, use_gpu_embedding_cache: bool,
    ) -> None:  # fmt: skip
        """Set up over ``parameter_server`` or a new one of ``ps_config``, and commit."""
        consumers: list = []
        owns = parameter_server is None
        if owns:
            from tierserve.ps.hierarchy import HierarchicalParameterServer

            parameter_server = HierarchicalParameterServer(ps_config)
        try:
            self._setup(
                config, graph, network, parameter_server, i64_input_key=i64_input_key,
                use_gpu_embedding_cache=use_gpu_embedding_cache,
            )  # fmt: skip
            replaced = self.commit()
            if replaced is not None:
                parameter_server.drop_model(replaced)
            if owns:
                from tierserve.ps.kafka_updates import start_update_consumers

                consumers = start_update_consumers(parameter_server, ps_config.update_source)
        except BaseException:
            if owns:
                parameter_server.close()
            raise
        self._owns_ps = owns
        self.update_consumers = consumers  # Kafka online updates of its own server

    @staticmethod
    def _graph_of(config: ModelConfig) -> tuple[Graph, InferenceGraph]:
        """The graph and dense network of ps.json entry ``config``, checked against it."""
        if not config.network_file:
            raise ConfigError(f"model {config.model!r}: no network_file (graph JSON)")
        graph = load_graph_json(config.network_file)
        network = InferenceGraph(graph, config.dense_file, None)
        # ps.json's names are matched to the graph's tables by position (see _setup).
        slots = [int(s["slot_num"]) for s in graph.data_layer.get("sparse", []) or []]
        check_against_graph(config, f"ps.json models[{config.model}]", network, slots,
                            config.network_file, names=False)  # fmt: skip
        return graph, network

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
        graph, network = cls._graph_of(config)
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
        self.cache: ModelEmbeddingCache | None = None
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
        if self.cache is None or self.cache.xp is np:
            return
        xp = self.cache.xp
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
        # Each table's CSR layout is worked out on the host; the inverses (and the row offsets
        # of ragged tables, whose pooling needs them) go to the device in one copy, so a
        # request costs no per-table copies or synchronisations on a GPU.  Where the keys
        # were sorted and distinct already (batch 1, one key a table) the inverse is the
        # identity: no gather.
        layouts, parts = [], []
        for spec, sparse, inverse, unique in zip(self.tables, inputs, inverses, uniques):
            offsets = np.asarray(to_numpy(sparse.row_offsets), dtype=np.int64)
            check_csr(offsets, inverse.size, spec.slot_num)
            layouts.append(CsrLayout(offsets, inverse.size))
            identity = inverse.size == unique.size and np.array_equal(inverse, np.arange(inverse.size))
            parts += [None if identity else inverse.astype(np.int64, copy=False),
                      offsets if layouts[-1].kind == "ragged" else offsets[:0]]
        sent = [p for p in parts if p is not None]
        packed = to_xp(xp, np.concatenate(sent) if sent else np.empty(0, np.int64))
        out, at = [], 0
        for spec, vectors, layout, inverse, offsets in zip(
            self.tables, found, layouts, parts[::2], parts[1::2]
        ):
            rows = to_xp(xp, vectors, np.float32)
            if inverse is not None:
                rows = rows[packed[at : at + inverse.size]]
                at += inverse.size
            if layout.kind == "ragged":
                layout = CsrLayout(packed[at : at + offsets.size], layout.nnz)
                at += offsets.size
            out.append(combine(rows, None, spec.slot_num, spec.combiner, layout=layout))
        return out

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
        ``tensor_name`` (an embedding's output or a layer's top) of the last predicted batch.
        A model loaded by :meth:`from_config` (as ``tierserve serve`` loads one) keeps no
        tensors of its batches: it refuses."""
        if not self.network.keep_tensors:
            raise ConfigError(
                "check_out_tensor: this model keeps no tensors of its batches (loaded from a "
                "ps.json entry, as the server loads one); create it with "
                "InferenceModel(graph, InferenceParams(...)) to check tensors out"
            )
        tensors = self.network.last_tensors
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

