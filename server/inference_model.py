"""HugeCTR's inference API: ``InferenceModel`` and ``InferenceSession`` (``InferenceParams``,
from :mod:`tierserve.server.inference_params`, is re-exported here, beside them).

``InferenceModel(model_config_path, inference_params)`` reads the graph JSON and dense file
into the trainer's forward-only :class:`~tierserve.trainer.inference_graph.InferenceGraph`
(the same layers as training), puts the sparse model folders into the hierarchical parameter
server's tiers (``volatile_db``, ``persistent_db``), optionally fronted by the embedding cache,
and predicts: per table, the batch's keys are looked up once each (unique), the vectors are
combined per slot by the trainer's own embedding ``combine`` (sum or mean), and the dense network runs.
With the embedding cache on a GPU, combining and the dense network run on that GPU too.

``predict`` and ``evaluate`` read a Norm, Raw or Parquet dataset in batches of
``max_batchsize`` and wrap around to its start, as HugeCTR does.  ``InferenceSession`` is the
older single-table API over raw lists.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from tierserve.ps.config import ModelConfig, PSConfig
from tierserve.ps.config_base import DisabledConfig
from tierserve.ps.errors import ConfigError, InvalidInputError
from tierserve.ps.hash_map import HashMapConfig
from tierserve.ps.keys import as_keys
from tierserve.trainer.data.batch import Batch, SparseInput
from tierserve.trainer.device import to_numpy, to_xp
from tierserve.trainer.embedding.combine import combine
from tierserve.trainer.graph_json import Graph, load_graph_json
from tierserve.trainer.inference_graph import EmbeddingSpec, InferenceGraph

from .inference_params import InferenceParams, check_against_graph, read_params

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
        parameter_server: Any = None,
    ) -> None:
        p = inference_params
        config, graph, network = read_params(model_config_path, p)
        network.keep_tensors = True  # HugeCTR's InferenceModel: check_out_tensor
        ps_config = None
        if parameter_server is not None:
            from tierserve.ps.compat import warn_once

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
        parameter_server: Any = None,
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
        self, config: ModelConfig, graph: Graph, network: InferenceGraph, parameter_server: Any,
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
        parameter_server: Any,
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
        parameter_server: Any,
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
        self.cache = None
        self.lookup_seconds = 0.0
        self.lookups = 0
        if hasattr(parameter_server, "stage_model"):
            self.version = parameter_server.stage_model(config)
            self.tables_source = parameter_server.version_view(self.version)
        else:  # any ParameterServerLike that already holds the tables
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
        if self.cache is not None and hasattr(self.cache, "close"):
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

    def _batches(
        self, num_batches: int, source, data_reader_type, check_type, slot_size_array
    ) -> Iterator[Batch]:
        from .datasets import wrapped_batches

        return wrapped_batches(
            self.graph,
            source,
            data_reader_type,
            check_type,
            slot_size_array,
            batch_size=self.max_batchsize,
            num_batches=num_batches,
            i64_input_key=self.i64_input_key,
        )

    def predict(
        self,
        num_batches: int,
        source: str | Sequence[str],
        data_reader_type: Any = "Norm",
        check_type: Any = "Sum",
        slot_size_array: Sequence[int] | None = None,
    ) -> np.ndarray:
        """Predictions ``(max_batchsize * num_batches, label_dim)``, wrapping over the data."""
        outs = [
            self.predict_batch(b)
            for b in self._batches(
                num_batches, source, data_reader_type, check_type, slot_size_array
            )
        ]
        if not outs:
            return np.zeros((0, self.label_dim), dtype=np.float32)
        return np.concatenate(outs)

    def evaluate(
        self,
        num_batches: int,
        source: str | Sequence[str],
        data_reader_type: Any = "Norm",
        check_type: Any = "Sum",
        slot_size_array: Sequence[int] | None = None,
    ) -> float:
        """AUC over ``max_batchsize * num_batches`` samples (wrapping over the data)."""
        preds, labels = [], []
        for b in self._batches(num_batches, source, data_reader_type, check_type, slot_size_array):
            preds.append(self.predict_batch(b))
            labels.append(b.label)
        from .evaluation import auc

        return auc(np.concatenate(labels), np.concatenate(preds))

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
        if self.cache is not None and hasattr(self.cache, "close"):
            self.cache.close()
            self.cache = None
        if self._owns_ps and hasattr(self.parameter_server, "close"):
            self.parameter_server.close()


def load_inference_model(
    graph_path: str | os.PathLike, params: InferenceParams, **kwargs: Any
) -> InferenceModel:
    """``InferenceModel(graph_path, params)``, for symmetry with the loaders."""
    return InferenceModel(graph_path, params, **kwargs)


# --- the older API -----------------------------------------------------------------------------


class InferenceSession:
    """HugeCTR's older ``InferenceSession(config_file, device_id, embedding_cache)``.

    ``config_file`` is the older document's inference JSON: the graph's ``layers`` and an
    ``inference`` clause naming ``dense_model_file`` and ``sparse_model_file`` (or the keyword
    arguments give them).  ``embedding_cache`` is what ``CreateEmbeddingCache`` returned (the
    session reads the model's tables through it), a parameter server already holding the
    model, or None (the session loads the files into a hash map of its own).  The key width is
    the clause's ``input_key_type`` ("I64" / "I32"), else the cache's, else 64 bits.
    ``predict(dense_features, embeddingcolumns, row_ptrs)`` takes flat lists: ``B *
    dense_dim`` floats, the keys, and CSR row pointers ``B * slot_num + 1`` per table.
    :meth:`from_model` wraps an :class:`InferenceModel` (``CreateInferenceSession``).
    """

    def __init__(
        self,
        config_file: str | os.PathLike,
        device_id: int = 0,
        embedding_cache: Any = None,
        model_name: str | None = None,
        dense_model_file: str | None = None,
        sparse_model_files: Sequence[str] | None = None,
        max_batchsize: int | None = None,
    ) -> None:
        from tierserve.ps.inference_json import input_key_bits, model_config_from_inference_json

        if model_name is None and embedding_cache is not None:
            model_name = getattr(embedding_cache, "model", None)
        config = model_config_from_inference_json(config_file, model_name)
        changes: dict[str, Any] = {"deployed_device_list": [device_id]}
        if sparse_model_files:
            changes["sparse_files"] = list(sparse_model_files)
        if dense_model_file:
            changes["dense_file"] = dense_model_file
        if max_batchsize:
            changes["max_batch_size"] = max_batchsize
        config = config.updated("InferenceSession", **changes)
        bits = input_key_bits(config_file)
        if bits is None:
            bits = 64 if getattr(embedding_cache, "i64_input_key", True) else 32
        ps_config = None
        if embedding_cache is None:  # the files in a hash map of the session's own
            ps_config = PSConfig(supportlonglong=bits == 64, volatile_db=HashMapConfig(),
                                 persistent_db=DisabledConfig(), models=[])  # fmt: skip
        self.model = InferenceModel.open(config, embedding_cache, ps_config,
                                         i64_input_key=bits == 64,
                                         use_gpu_embedding_cache=False)  # fmt: skip

    @classmethod
    def from_model(cls, model: InferenceModel) -> InferenceSession:
        """A session that predicts with ``model``."""
        self = cls.__new__(cls)
        self.model = model
        return self

    def refresh_embedding_cache(self) -> int:
        """HugeCTR's ``refresh_embedding_cache``: re-read every row the embedding cache holds
        from the parameter server's tiers (rows changed there since they were cached); the
        number of rows refreshed, 0 without an embedding cache."""
        cache = self.model.cache
        return 0 if cache is None else int(cache.refresh())

    def evaluate(self, num_batches: int, source: str | Sequence[str], data_reader_type: Any,
                 check_type: Any, slot_size_array: Sequence[int] | None = None,
                 num_samples: int = 0) -> float:
        """HugeCTR's ``InferenceSession.evaluate``: :meth:`InferenceModel.evaluate` (AUC).
        ``num_samples`` (v4.1's binding) is accepted; the batches are what they count."""
        return self.model.evaluate(num_batches, source, data_reader_type, check_type,
                                   slot_size_array)

    def predict(self, *args: Any, **kwargs: Any) -> Any:
        """Both of HugeCTR's overloads: ``predict(dense_feature, embeddingcolumns, row_ptrs)``
        (flat lists in, a flat list out; see :meth:`predict_samples`) and ``predict(num_batches,
        source, data_reader_type, check_type, slot_size_array=[], num_samples=0)`` (a dataset:
        :meth:`InferenceModel.predict`, ``[num_batches * max_batchsize, label_dim]``, flat
        ``[num_batches * max_batchsize]`` for one label, as HugeCTR's session returns it)."""
        first = args[0] if args else kwargs.get("num_batches", kwargs.get("dense_feature"))
        if "num_batches" in kwargs or "source" in kwargs or (
                isinstance(first, (int, np.integer)) and not isinstance(first, bool)):
            kwargs.pop("num_samples", None)
            if len(args) > 5:
                args = args[:5]  # num_samples: the batches are what they count
            preds = self.model.predict(*args, **kwargs)
            # HugeCTR's session returns [N] for one label (its InferenceModel: [N, 1])
            return preds.reshape(-1) if preds.shape[1] == 1 else preds
        if "dense_feature" in kwargs:
            kwargs["dense_features"] = kwargs.pop("dense_feature")
        return self.predict_samples(*args, **kwargs)

    def predict_samples(
        self,
        dense_features: Sequence[float],
        embeddingcolumns: Sequence[int],
        row_ptrs: Sequence[int],
        i64_input_key: bool | None = None,
    ) -> list[float]:
        """Predictions for the samples in the flat lists, as a flat list.  ``i64_input_key``,
        when given, must agree with the session's key width."""
        m = self.model
        if i64_input_key is not None and bool(i64_input_key) != m.i64_input_key:
            raise ConfigError(
                f"predict: i64_input_key={i64_input_key} but the session has "
                f"{64 if m.i64_input_key else 32}-bit keys"
            )
        dense = np.asarray(dense_features, dtype=np.float32)
        if m.dense_dim == 0 or dense.size % m.dense_dim:
            raise InvalidInputError(
                f"dense_features has {dense.size} values, not a multiple of dense_dim {m.dense_dim}"
            )
        batch_size = dense.size // m.dense_dim
        keys = np.asarray(embeddingcolumns, dtype=np.int64)
        ptrs = np.asarray(row_ptrs, dtype=np.int64)
        sparse, at, key_at = [], 0, 0
        for t, slots in enumerate(m.slot_nums):
            n = batch_size * slots + 1
            offsets = ptrs[at : at + n]
            if offsets.shape[0] != n:
                raise InvalidInputError(
                    f"row_ptrs has {ptrs.size} entries; {batch_size} samples need "
                    f"{sum(batch_size * s + 1 for s in m.slot_nums)}"
                )
            offsets = offsets - offsets[0]
            nnz = int(offsets[-1])
            sparse.append(SparseInput(keys[key_at : key_at + nnz], offsets, slots))
            at, key_at = at + n, key_at + nnz
            del t
        batch = Batch(
            label=np.zeros((batch_size, m.label_dim), np.float32),
            dense=dense.reshape(batch_size, m.dense_dim),
            sparse=tuple(sparse),
        )
        return m.predict_batch(batch).reshape(-1).tolist()
