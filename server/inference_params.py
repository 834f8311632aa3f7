"""HugeCTR's ``InferenceParams`` and their one conversion into a ``ps.json`` model entry.

:data:`MODEL_FIELDS` are the fields that are a model entry's
(:class:`~tierserve.ps.config.ModelConfig`) under HugeCTR's names: their types, bounds and
defaults are the entry's, declared there once.  :func:`model_config_from_params` converts
the params into that entry, checked against the graph (the fields that repeat it must agree
with it); :func:`read_params` is what ``InferenceModel(model_config_path, params)`` serves.
"""

from __future__ import annotations

import os
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from tierserve.core.errors import ConfigError
from tierserve.model.graph_json import Graph, load_graph_json
from tierserve.model.inference_graph import InferenceGraph
from tierserve.ps.config import ModelConfig
from tierserve.ps.config_base import format_validation_errors, validate
from tierserve.ps.params import persistent_config, update_source_config, volatile_config

# --- parameters ------------------------------------------------------------------------------


#: ``InferenceParams`` fields that are a ``ps.json`` model entry's (:class:`ModelConfig`)
#: field, in HugeCTR's argument order, under HugeCTR's name -> the model entry's name.  Their
#: type, bounds and default are the model entry's, declared there once (HugeCTR requires the
#: ones in :data:`REQUIRED`); :func:`model_config_fields` converts them.
MODEL_FIELDS = {
    "model_name": "model",
    "max_batchsize": "max_batch_size",
    "hit_rate_threshold": "hit_rate_threshold",
    "dense_model_file": "dense_file",
    "sparse_model_files": "sparse_files",
    "use_gpu_embedding_cache": "gpucache",
    "cache_size_percentage": "gpucacheper",
    "use_mixed_precision": "use_mixed_precision",
    "number_of_worker_buffers_in_pool": "num_of_worker_buffer_in_pool",
    "number_of_refresh_buffers_in_pool": "num_of_refresher_buffer_in_pool",
    "cache_refresh_percentage_per_iteration": "cache_refresh_percentage_per_iteration",
    "deployed_devices": "deployed_device_list",
    "default_value_for_each_table": "default_value_for_each_table",
    "maxnum_des_feature_per_sample": "maxnum_des_feature_per_sample",
    "refresh_delay": "refresh_delay",
    "refresh_interval": "refresh_interval",
    "maxnum_catfeature_query_per_table_per_sample": "maxnum_catfeature_query_per_table_per_sample",
    "embedding_vecsize_per_table": "embedding_vecsize_per_table",
    "embedding_table_names": "embedding_table_names",
    "network_file": "network_file",
    "label_dim": "label_dim",
    "slot_num": "slot_num",
    "use_static_table": "use_static_table",
    "embedding_cache_type": "embedding_cache_type",
    "use_context_stream": "use_context_stream",
    "fuse_embedding_table": "fuse_embedding_table",
}
#: The fields HugeCTR's ``InferenceParams`` has no default for.
REQUIRED = (
    "model_name", "max_batchsize", "hit_rate_threshold", "dense_model_file",
    "sparse_model_files", "use_gpu_embedding_cache", "cache_size_percentage", "i64_input_key",
)  # fmt: skip
#: HugeCTR's first arguments, which may be given by position.
POSITIONAL = REQUIRED


def _model_field(name: str) -> tuple[Any, Any]:
    """The :class:`ModelConfig` field behind ``InferenceParams.name``: its type with its
    bounds, and its default (none where HugeCTR requires the value)."""
    info = ModelConfig.model_fields[MODEL_FIELDS[name]]
    annotation = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
    if name in REQUIRED:
        return annotation, Field()
    if info.default_factory is not None:
        return annotation, Field(default_factory=info.default_factory)
    return annotation, Field(default=info.default)


class _InferenceParamsBase(BaseModel):
    """The fields of ``InferenceParams`` that are not a model entry's."""

    model_config = ConfigDict(
        extra="forbid", arbitrary_types_allowed=True, validate_assignment=True
    )

    #: The device of ``CreateInferenceSession``'s session and cache (see ``serving_devices``).
    device_id: Annotated[int, Field(ge=0)] = 0
    #: 64-bit keys (the parameter server's ``supportlonglong``).
    i64_input_key: bool
    scaler: float = 1.0
    use_algorithm_search: bool = True
    use_cuda_graph: bool = True
    thread_pool_size: Annotated[int, Field(gt=0)] = 16
    #: The parameter server's tiers (``ps.json``'s top level): HugeCTR's parameter objects of
    #: :mod:`tierserve.ps.params`, their typed configs or ``ps.json``-style dicts.
    volatile_db: Any = None
    persistent_db: Any = None
    update_source: Any = None
    #: The graph's non-trainable parameters (batch norm's running statistics).
    non_trainable_params_file: str = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if len(args) > len(POSITIONAL):
            raise ConfigError(
                f"InferenceParams takes at most {len(POSITIONAL)} positional arguments"
            )
        for name, value in zip(POSITIONAL, args):
            if name in kwargs:
                raise ConfigError(f"InferenceParams: {name} given twice")
            kwargs[name] = value
        if isinstance(kwargs.get("sparse_model_files"), (str, os.PathLike)):
            kwargs["sparse_model_files"] = [kwargs["sparse_model_files"]]
        try:
            super().__init__(**kwargs)
        except ValidationError as exc:
            raise ConfigError(format_validation_errors(exc, "InferenceParams")) from None

    def __setattr__(self, name: str, value: Any) -> None:
        try:
            super().__setattr__(name, value)
        except ValidationError as exc:
            raise ConfigError(format_validation_errors(exc, "InferenceParams")) from None

    def tier_configs(self) -> tuple[Any, Any, Any]:
        """The typed volatile, persistent and update-source configs."""
        return (
            volatile_config(self.volatile_db),
            persistent_config(self.persistent_db),
            update_source_config(self.update_source),
        )


InferenceParams = create_model(
    "InferenceParams",
    __base__=_InferenceParamsBase,
    __module__=__name__,
    **{name: _model_field(name) for name in MODEL_FIELDS},
)
InferenceParams.__doc__ = """HugeCTR's ``InferenceParams``: the first eight arguments
(:data:`POSITIONAL`) may be given by position, the rest by keyword.

The fields of :data:`MODEL_FIELDS` are a ``ps.json`` model entry's under HugeCTR's names,
with its types, bounds and defaults; :func:`model_config_from_params` converts them into that
entry (:class:`~tierserve.ps.config.ModelConfig`), the one model every later step reads.
``device_id`` is the device of ``CreateInferenceSession``'s session and embedding cache, as
in HugeCTR; ``InferenceModel`` uses ``deployed_devices``, unless only ``device_id`` is given.
``volatile_db``, ``persistent_db`` and ``update_source`` take the parameter objects of
:mod:`tierserve.ps.params` (or their typed configs or dicts); ``network_file`` overrides
where the graph is.
"""


# --- the conversion into the model entry ---------------------------------------------------


#: InferenceParams fields with no effect here, and what happens instead (warned once when given).
PARAMS_NOT_HONOURED = {
    "use_algorithm_search": "no cuBLAS algorithm search; numpy/cupy pick the GEMM kernels",
    "use_cuda_graph": "no CUDA graphs; each layer runs as its own numpy/cupy calls",
    "scaler": "inference computes in float32, so there is no loss scale",
    "thread_pool_size": "the embedding cache's lookups and inserts run on the calling thread",
}


def check_params_against_graph(
    p: InferenceParams, network: InferenceGraph, slots: list[int], graph_path
) -> None:
    """HugeCTR's ``InferenceParams`` repeat what the graph defines (table names, vector sizes,
    slots, label and dense widths): when given, they must agree with ``graph_path``; and the
    switches of :data:`PARAMS_NOT_HONOURED` warn once when given."""
    from tierserve.core.compat import warn_once

    check_against_graph(p, "InferenceParams", network, slots, graph_path)
    for name, instead in PARAMS_NOT_HONOURED.items():
        if name in p.model_fields_set:
            warn_once(f"InferenceParams.{name}", instead, stacklevel=4)


def check_against_graph(
    config: Any, source: str, network: InferenceGraph, slots: list[int], graph_path,
    names: bool = True,
) -> None:  # fmt: skip
    """The fields of ``config`` (``InferenceParams`` or a ``ps.json`` model entry) that repeat
    what the graph defines must agree with ``graph_path`` where given: vector sizes, slots,
    the label width, and (``names``) the table names; the keys and dense features per sample
    must be at least what the graph's inputs hold.  A :class:`ConfigError` names
    ``source.<field>`` otherwise."""
    tables = list(network.embeddings)
    graph = {
        "embedding_table_names": [t.name for t in tables],
        "embedding_vecsize_per_table": [t.embedding_vec_size for t in tables],
        "label_dim": sum(network.label_dims),
        "slot_num": sum(slots),
    }
    if not names:
        del graph["embedding_table_names"]
    given = config.model_fields_set
    for name, value in graph.items():
        if name in given and getattr(config, name) != value:
            raise ConfigError(
                f"{source}.{name} is {getattr(config, name)!r} but the graph {graph_path} "
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
        value = getattr(config, name)
        ok = (len(value) == len(need) and all(v >= n for v, n in zip(value, need))
              if isinstance(need, list) else value >= need)
        if not ok:
            raise ConfigError(
                f"{source}.{name} is {value!r}; the graph {graph_path} needs at least "
                f"{need!r}"
            )


def serving_devices(p: InferenceParams) -> list[int]:
    """``deployed_devices``, or ``[device_id]`` when only ``device_id`` was given."""
    if "device_id" in p.model_fields_set and "deployed_devices" not in p.model_fields_set:
        return [p.device_id]
    return list(p.deployed_devices)


def model_config_fields(p: InferenceParams) -> dict[str, Any]:
    """The ``ps.json`` model entry fields of ``p``'s :data:`MODEL_FIELDS`: the ones HugeCTR
    requires and the ones the script set (the others are the entry's own defaults), with
    ``deployed_devices`` as :func:`serving_devices` says.  ``default_value_for_each_table``
    is left to :func:`table_defaults` (HugeCTR repeats one value for every table)."""
    given = p.model_fields_set | set(REQUIRED)
    fields = {MODEL_FIELDS[name]: getattr(p, name) for name in MODEL_FIELDS if name in given}
    fields.pop("default_value_for_each_table", None)
    fields["deployed_device_list"] = serving_devices(p)
    fields["sparse_files"] = [os.fspath(f) for f in p.sparse_model_files]
    fields["dense_file"] = os.fspath(p.dense_model_file)
    return fields


def table_defaults(p: InferenceParams, num_tables: int) -> list[float] | None:
    """``default_value_for_each_table``: one value is repeated for every table (as HugeCTR
    does); None (not given) is the model entry's default."""
    if p.default_value_for_each_table is None:
        return None
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
    fields = {
        **model_config_fields(p),
        "network_file": os.fspath(graph_path),
        "default_value_for_each_table": table_defaults(p, len(tables)),
        "maxnum_des_feature_per_sample": network.dense_dim,
        "maxnum_catfeature_query_per_table_per_sample": [max(t.max_nnz, t.slot_num)
                                                         for t in tables],
        "embedding_vecsize_per_table": [t.embedding_vec_size for t in tables],
        "embedding_table_names": [t.name for t in tables],
        "label_dim": sum(network.label_dims),
        "slot_num": max(1, sum(slots)),
    }
    names = {field: name for name, field in MODEL_FIELDS.items()}
    return validate(ModelConfig, fields, "InferenceParams", names)


def read_params(
    model_config_path: str | os.PathLike, params: InferenceParams
) -> tuple[ModelConfig, Graph, InferenceGraph]:
    """What ``InferenceModel(model_config_path, params)`` serves: the model entry, the graph
    (``params.network_file``, else ``model_config_path``) and its dense network."""
    graph_path = params.network_file or model_config_path
    graph = load_graph_json(graph_path)
    network = InferenceGraph(graph, params.dense_model_file,
                             params.non_trainable_params_file or None)  # fmt: skip
    return model_config_from_params(params, network, graph_path), graph, network
