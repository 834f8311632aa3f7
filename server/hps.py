"""HugeCTR's HPS Python API: ``hugectr.inference.HPS`` and ``ParameterServerConfig``.

``HPS(ps_config)`` (or ``HPS("ps.json")``) builds the hierarchical parameter server of the
configured models (volatile tier, persistent tier, Kafka update source) and, for each model
whose ``use_gpu_embedding_cache`` / ``gpucache`` is on, its embedding cache; then
``lookup(h_keys, model_name, table_id)`` returns the embeddings ``[len(h_keys), vec_size]``
of one table, read through the cache (on a GPU when cupy sees one, else in host memory) or,
without one, from the tiers; keys no tier holds get the table's default value.  These are the
same objects and calls an :class:`~tierserve.server.inference_model.InferenceModel` reads its
embeddings with; HPS only has no dense network.  ``lookup_fromdlpack`` does the same between
DLPack capsules (PyTorch, TensorFlow, numpy, cupy tensors).

A model is served on one device (the first of ``deployed_devices``); ``device_id`` must be
one of its deployed devices.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tierserve.core.errors import ConfigError, InvalidInputError, NotFoundError
from tierserve.ps.config import ModelConfig, PSConfig, load_ps_config
from tierserve.ps.config_base import validate
from tierserve.ps.keys import as_keys
from tierserve.ps.params import persistent_config, update_source_config, volatile_config

from .inference_params import MODEL_FIELDS, InferenceParams, model_config_fields, table_defaults


class ParameterServerConfig:
    """HugeCTR's ``ParameterServerConfig(emb_table_name, embedding_vec_size,
    max_feature_num_per_sample_per_emb_table, inference_params_array, volatile_db,
    persistent_db, update_source)``: per model (keyed by ``InferenceParams.model_name``) its
    tables' names, vector sizes and most keys per sample, and the tiers every model shares
    (which replace the ones of the ``InferenceParams``, as in HugeCTR)."""

    def __init__(
        self,
        emb_table_name: Mapping[str, Sequence[str]],
        embedding_vec_size: Mapping[str, Sequence[int]],
        max_feature_num_per_sample_per_emb_table: Mapping[str, Sequence[int]],
        inference_params_array: Sequence[InferenceParams],
        volatile_db: Any = None,
        persistent_db: Any = None,
        update_source: Any = None,
    ) -> None:
        params = list(inference_params_array)
        maps = {"emb_table_name": emb_table_name, "embedding_vec_size": embedding_vec_size,
                "max_feature_num_per_sample_per_emb_table":
                    max_feature_num_per_sample_per_emb_table}
        for what, given in maps.items():
            if len(given) != len(params):
                raise ConfigError(f"ParameterServerConfig: {what} has {len(given)} models, "
                                  f"inference_params_array has {len(params)}")
        models = []
        for p in params:
            if not isinstance(p, InferenceParams):
                raise ConfigError("ParameterServerConfig: inference_params_array takes "
                                  f"InferenceParams, not {type(p).__name__}")
            per_table = {}
            for what, given in maps.items():
                if p.model_name not in given:
                    raise ConfigError(f"ParameterServerConfig: {what} has no entry for model "
                                      f"{p.model_name!r}")
                per_table[what] = list(given[p.model_name])
            models.append(_model_config(p, **per_table))
        keys64 = {p.i64_input_key for p in params}
        if len(keys64) > 1:
            raise ConfigError("ParameterServerConfig: the models must agree on i64_input_key "
                              "(one parameter server holds keys of one width)")
        self.inference_params_array = params
        self.config = PSConfig(
            supportlonglong=keys64.pop() if keys64 else True,
            volatile_db=volatile_config(volatile_db),
            persistent_db=persistent_config(persistent_db),
            update_source=update_source_config(update_source),
            models=models,
        )


def _model_config(
    p: InferenceParams,
    emb_table_name: list[str],
    embedding_vec_size: list[int],
    max_feature_num_per_sample_per_emb_table: list[int],
) -> ModelConfig:
    n = len(p.sparse_model_files)
    for what, values in (("emb_table_name", emb_table_name),
                         ("embedding_vec_size", embedding_vec_size),
                         ("max_feature_num_per_sample_per_emb_table",
                          max_feature_num_per_sample_per_emb_table)):
        if len(values) != n:
            raise ConfigError(f"ParameterServerConfig: {what}[{p.model_name!r}] has "
                              f"{len(values)} tables, sparse_model_files has {n}")
    fields = {
        **model_config_fields(p),
        "default_value_for_each_table": table_defaults(p, n),
        "maxnum_catfeature_query_per_table_per_sample": max_feature_num_per_sample_per_emb_table,
        "embedding_vecsize_per_table": embedding_vec_size,
        "embedding_table_names": emb_table_name,
    }
    names = {field: name for name, field in MODEL_FIELDS.items()}
    return validate(ModelConfig, fields, f"InferenceParams of {p.model_name!r}", names)


class HPS:
    """HugeCTR's ``HPS(ps_config)`` / ``HPS(hps_json_config_file)``: see the module docstring.

    Call :meth:`close` (or use it as a context manager) to stop its update consumers and
    release its tiers and caches.
    """

    def __init__(
        self,
        ps_config: ParameterServerConfig | str | os.PathLike | None = None,
        hps_json_config_file: str | os.PathLike | None = None,
    ) -> None:
        from tierserve.ps.hierarchy import HierarchicalParameterServer
        from tierserve.ps.kafka_updates import start_update_consumers

        source = ps_config if ps_config is not None else hps_json_config_file
        if source is None:
            raise ConfigError("HPS takes a ParameterServerConfig or the path of a ps.json")
        if isinstance(source, ParameterServerConfig):
            config = source.config
        elif isinstance(source, PSConfig):
            config = source
        else:
            config = load_ps_config(source)
        self.config = config
        self.i64_input_key = config.supportlonglong
        self.parameter_server = HierarchicalParameterServer(config)
        self.caches: dict[str, Any] = {}
        self.update_consumers: list = []
        try:
            for model in config.models:
                if model.gpucache:
                    self.caches[model.model] = self._create_cache(model)
            self.update_consumers = start_update_consumers(
                self.parameter_server, config.update_source)
        except BaseException:
            self.close()
            raise

    def _create_cache(self, model: ModelConfig) -> Any:
        """The model's embedding cache, as an :class:`InferenceModel` makes it: on its first
        deployed device when cupy sees a GPU, else in host memory."""
        from tierserve.cache import CreateEmbeddingCache
        from tierserve.cache.device import cupy_or_none

        return CreateEmbeddingCache(
            self.parameter_server, model.deployed_device_list[0], cupy_or_none() is not None,
            None, model, model.model, self.i64_input_key)

    def _model(self, model_name: str, table_id: int, device_id: int) -> ModelConfig:
        try:
            model = self.config.model(model_name)
        except ConfigError:
            raise NotFoundError(f"HPS: the model name {model_name!r} does not exist in HPS; it "
                                f"has {[m.model for m in self.config.models]}") from None
        if not 0 <= int(table_id) < model.num_tables:
            raise NotFoundError(f"HPS: model {model_name!r} has {model.num_tables} tables, no "
                                f"table_id {table_id}")
        if int(device_id) not in model.deployed_device_list:
            raise ConfigError(f"HPS: model {model_name!r} is deployed on devices "
                              f"{model.deployed_device_list}, not device_id {device_id}")
        return model

    def _lookup(self, keys: Any, model_name: str, table_id: int, device_id: int) -> Any:
        """Embeddings of ``keys`` (1-D) in one table: a numpy or, with a GPU cache, a cupy
        array ``[len(keys), vec_size]``."""
        model = self._model(model_name, table_id, device_id)
        keys = np.asarray(keys)
        if keys.ndim != 1:
            raise InvalidInputError(f"HPS.lookup: h_keys must have one dimension, got shape "
                                    f"{keys.shape}")
        table_id = int(table_id)
        limit = model.maxnum_catfeature_query_per_table_per_sample[table_id] * model.max_batch_size
        if keys.shape[0] > limit:
            raise InvalidInputError(
                f"HPS.lookup: {keys.shape[0]} keys; table {table_id} of {model_name!r} takes at "
                f"most max_feature_num_per_sample_per_emb_table * max_batchsize = {limit}")
        keys = as_keys(keys, 64 if self.i64_input_key else 32)
        cache = self.caches.get(model.model)
        if cache is not None:
            return cache.lookup(table_id, keys)
        name = model.embedding_table_names[table_id]
        return self.parameter_server.lookup(model.model, name, keys)

    def lookup(self, h_keys: Any, model_name: str, table_id: int, device_id: int = 0) -> np.ndarray:
        """The float32 embeddings ``[len(h_keys), vec_size]`` of ``h_keys`` (a 1-D integer
        array) in table ``table_id`` (its index in ``emb_table_name[model_name]``)."""
        from tierserve.model.device import to_numpy

        vectors = self._lookup(h_keys, model_name, table_id, device_id)
        return np.ascontiguousarray(to_numpy(vectors), dtype=np.float32)

    def lookup_fromdlpack(self, keys: Any, out_tensor: Any, model_name: str, table_id: int,
                          device_id: int = 0) -> None:
        """HugeCTR's ``lookup_fromdlpack``: the keys of DLPack capsule ``keys`` (a 1-D integer
        tensor, on the host or a CUDA device) looked up as :meth:`lookup` does, the vectors
        written into DLPack capsule ``out_tensor`` (a float32 tensor of at least
        ``len(keys) * vec_size`` elements, on the host or a CUDA device).  Neither capsule is
        consumed: the tensors they came from see the result."""
        from .runtime.dlpack import read_capsule, write_capsule

        key_array = read_capsule(keys, "keys")
        if key_array.ndim != 1:
            key_array = key_array.reshape(-1)
        vectors = self._lookup(key_array, model_name, table_id, device_id)
        write_capsule(out_tensor, vectors, "out_tensor")

    def close(self) -> None:
        """Stop the update consumers, release the caches and the parameter server."""
        for consumer in self.update_consumers:
            consumer.close()
        self.update_consumers = []
        for cache in self.caches.values():
            cache.close()
        self.caches = {}
        self.parameter_server.close()

    def __enter__(self) -> HPS:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
