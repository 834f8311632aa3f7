"""``hugectr.inference``: HugeCTR's inference API under the trainer's import line.

``import tierserve.trainer as hugectr`` makes ``hugectr.inference`` this module, imported only
when a script first touches it (the trainer does not import the server otherwise).  It holds
the current API (``InferenceParams``, ``InferenceModel``, ``CreateInferenceSession``, the tier
parameter objects, the HPS lookup API ``HPS`` / ``ParameterServerConfig``) and the older one
(``CreateParameterServer``, ``CreateEmbeddingCache``, ``InferenceSession``), which also read
the older document's inference JSON (an ``inference`` clause and ``layers``).
"""

from __future__ import annotations

import os
from typing import Any

from tierserve.cache.model_cache import CreateEmbeddingCache
from tierserve.ps.config_base import (
    DatabaseHashMapAlgorithm_t,
    DatabaseOverflowPolicy_t,
    DatabaseType_t,
    UpdateSourceType_t,
)
from tierserve.ps.hierarchy import CreateParameterServer
from tierserve.ps.params import PersistentDatabaseParams, UpdateSourceParams, VolatileDatabaseParams
from tierserve.server.hps import HPS, ParameterServerConfig
from tierserve.server.inference_model import InferenceParams

from .inference_model import InferenceModel, InferenceSession

__all__ = [
    "CreateEmbeddingCache",
    "CreateInferenceSession",
    "CreateParameterServer",
    "DatabaseHashMapAlgorithm_t",
    "DatabaseOverflowPolicy_t",
    "DatabaseType_t",
    "HPS",
    "InferenceModel",
    "InferenceParams",
    "InferenceSession",
    "ParameterServerConfig",
    "PersistentDatabaseParams",
    "UpdateSourceParams",
    "UpdateSourceType_t",
    "VolatileDatabaseParams",
]


def CreateInferenceSession(  # noqa: N802 - HugeCTR's name
    model_config_path: str | os.PathLike, inference_params: InferenceParams
) -> Any:
    """HugeCTR's ``CreateInferenceSession(model_config_path, inference_params)``: an
    :class:`InferenceSession` (``predict(dense_feature, embeddingcolumns, row_ptrs)``) over an
    :class:`InferenceModel` built from the params, on device ``inference_params.device_id``
    (as HugeCTR's session; ``deployed_devices`` is the :class:`InferenceModel`'s)."""
    if "device_id" in inference_params.model_fields_set:
        inference_params = inference_params.model_copy(
            update={"deployed_devices": [inference_params.device_id]})
    return InferenceSession.from_model(InferenceModel(model_config_path, inference_params))
