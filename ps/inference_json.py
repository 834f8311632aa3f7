"""The older HugeCTR inference JSON as a model config.

HugeCTR's older inference API (``CreateParameterServer``, ``CreateEmbeddingCache``,
``InferenceSession``) takes a model's configuration JSON: the training graph's ``layers``
plus an ``inference`` clause naming the model files::

    {"inference": {"max_batchsize": 64, "hit_rate_threshold": 0.9,
                   "dense_model_file": "dcn_dense_10000.model",
                   "sparse_model_file": ["dcn0_sparse_10000.model"],   (or one string)
                   "label": 1, "input_key_type": "I64"},
     "layers": [{"type": "Data", ...}, {"type": "DistributedSlotSparseEmbeddingHash", ...}, ...]}

:func:`load_model_source` reads either that or a ``ps.json``, so those factories take both.
Relative file paths resolve against the JSON file's folder.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tierserve.core.errors import ConfigError

from .config import ModelConfig, PSConfig, load_ps_config
from .config_base import validate

#: Layer types that are embedding tables (HugeCTR's names).
EMBEDDING_TYPES = (
    "DistributedSlotSparseEmbeddingHash",
    "LocalizedSlotSparseEmbeddingHash",
    "LocalizedSlotSparseEmbeddingOneHot",
    "HybridSparseEmbedding",
)


#: The ``inference`` clause's settings and the ``ps.json`` model fields they are.
CLAUSE_FIELDS = {
    "max_batchsize": "max_batch_size",
    "hit_rate_threshold": "hit_rate_threshold",
    "gpucacheper": "gpucacheper",
    "cache_size_percentage": "gpucacheper",
}


def _read(path: str | os.PathLike) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"model configuration {path} does not exist") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"model configuration {path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"model configuration {path}: the top level must be a JSON object")
    return data


def is_inference_json(data: dict[str, Any]) -> bool:
    """Whether a decoded JSON is an inference (graph) JSON rather than a ``ps.json``."""
    return "models" not in data and isinstance(data.get("layers"), list)


def model_config_from_inference_json(
    path: str | os.PathLike, model_name: str | None = None
) -> ModelConfig:
    """The :class:`ModelConfig` an older inference JSON describes (``network_file`` is the
    JSON itself).  ``model_name`` defaults to the solver clause's ``model_name``."""
    data = _read(path)
    if not is_inference_json(data):
        raise ConfigError(f"{path} is not an inference JSON (no 'layers' list)")
    base = Path(path).resolve().parent
    clause = data.get("inference")
    if not isinstance(clause, dict):
        raise ConfigError(f"{path}: no 'inference' clause naming dense_model_file and "
                          "sparse_model_file")
    sparse = clause.get("sparse_model_file", clause.get("sparse_model_files"))
    if isinstance(sparse, str):
        sparse = [sparse]
    dense = clause.get("dense_model_file")
    if not sparse or not dense:
        raise ConfigError(f"{path}: the 'inference' clause must name dense_model_file and "
                          "sparse_model_file")

    def resolve(p: str) -> str:
        return p if os.path.isabs(p) else str(base / p)

    layers = data["layers"]
    tables = [layer for layer in layers if layer.get("type") in EMBEDDING_TYPES]
    data_layer = next((layer for layer in layers if layer.get("type") == "Data"), {})
    inputs = {s.get("top"): s for s in data_layer.get("sparse", []) or []}
    dims, queries = [], []
    for layer in tables:
        hparam = layer.get("sparse_embedding_hparam") or {}
        if "embedding_vec_size" not in hparam:
            raise ConfigError(f"{path}: layer {layer.get('name')!r} has no "
                              "sparse_embedding_hparam.embedding_vec_size")
        dims.append(int(hparam["embedding_vec_size"]))
        s = inputs.get(layer.get("bottom"), {})
        queries.append(max(1, int(s.get("max_feature_num_per_sample", s.get("slot_num", 1)))))
    name = model_name or (data.get("solver") or {}).get("model_name") or clause.get("model")
    label = data_layer.get("label") or {}
    label_dim = label.get("label_dim", clause.get("label"))
    fields: dict[str, Any] = {
        "model": name or "model",
        "sparse_files": [resolve(s) for s in sparse],
        "dense_file": resolve(dense),
        "network_file": str(Path(path).resolve()),
        "maxnum_des_feature_per_sample": int((data_layer.get("dense") or {}).get("dense_dim", 0)),
        "maxnum_catfeature_query_per_table_per_sample": queries,
        "embedding_vecsize_per_table": dims,
        "embedding_table_names": [str(t.get("name") or t.get("top")) for t in tables],
        "slot_num": max(1, sum(int(s.get("slot_num", 1)) for s in inputs.values())),
    }
    if label_dim is not None:
        fields["label_dim"] = sum(label_dim) if isinstance(label_dim, list) else label_dim
    # The clause's settings under their ps.json names; absent ones take ModelConfig's defaults.
    for key, field in CLAUSE_FIELDS.items():
        if key not in clause:
            continue
        if field in fields and fields[field] != clause[key]:
            raise ConfigError(f"{path}: the 'inference' clause gives {field} twice, with "
                              f"different values ({fields[field]!r} and {key}: {clause[key]!r})")
        fields[field] = clause[key]
    given = {field: f"inference.{key}" for key, field in CLAUSE_FIELDS.items() if key in clause}
    return validate(ModelConfig, fields, str(path), given)


def input_key_bits(path: str | os.PathLike) -> int | None:
    """64 or 32 from an inference JSON's ``input_key_type`` ("I64" / "I32") or its solver's
    ``i64_input_key``; None when it says neither."""
    data = _read(path)
    kind = (data.get("inference") or {}).get("input_key_type")
    if kind is not None:
        return 64 if str(kind).upper() == "I64" else 32
    solver = data.get("solver") or {}
    if "i64_input_key" in solver:
        return 64 if solver["i64_input_key"] else 32
    return None


def load_model_source(
    path: str | os.PathLike, model_name: str
) -> tuple[PSConfig | None, ModelConfig]:
    """``(ps config or None, model config)`` of ``model_name`` from a ``ps.json`` or from an
    older inference JSON (then no ps config: its tiers are the caller's defaults)."""
    data = _read(path)
    if is_inference_json(data):
        return None, model_config_from_inference_json(path, model_name)
    config = load_ps_config(path)
    return config, config.model(model_name)
