"""HugeCTR's MLPerf-only and embedding-training-cache objects, so scripts can build them:
``HybridEmbeddingParam`` (with ``CommunicationType`` and ``HybridEmbeddingType``),
``CreateETC`` and ``TrainPSType_t``.

A ``HybridEmbeddingParam`` given to ``SparseEmbedding`` warns once (the table is trained as
one table on one device, the same values); ``CreateETC`` is refused: tables live in host
memory, so there is no embedding training cache to configure.
"""

from __future__ import annotations

import enum
from typing import Any

from tierserve.ps.errors import ConfigError


class CommunicationType(enum.Enum):
    IB_NVLink = "IB_NVLink"
    IB_NVLink_Hier = "IB_NVLink_Hier"
    NVLink_SingleNode = "NVLink_SingleNode"


class HybridEmbeddingType(enum.Enum):
    Distributed = "Distributed"


class TrainPSType_t(enum.Enum):  # noqa: N801 - HugeCTR's name
    Staged = "Staged"
    Cached = "Cached"


class HybridEmbeddingParam:
    """HugeCTR's ``HybridEmbeddingParam(max_num_frequent_categories,
    max_num_infrequent_samples, p_dup_max, max_all_reduce_bandwidth, max_all_to_all_bandwidth,
    efficiency_bandwidth_ratio, communication_type, hybrid_embedding_type)``."""

    def __init__(self, max_num_frequent_categories: int, max_num_infrequent_samples: int,
                 p_dup_max: float, max_all_reduce_bandwidth: float,
                 max_all_to_all_bandwidth: float, efficiency_bandwidth_ratio: float,
                 communication_type: CommunicationType,
                 hybrid_embedding_type: HybridEmbeddingType) -> None:
        if not isinstance(communication_type, CommunicationType):
            raise ConfigError("HybridEmbeddingParam.communication_type must be a "
                              "hugectr.CommunicationType")
        if not isinstance(hybrid_embedding_type, HybridEmbeddingType):
            raise ConfigError("HybridEmbeddingParam.hybrid_embedding_type must be a "
                              "hugectr.HybridEmbeddingType")
        self.max_num_frequent_categories = int(max_num_frequent_categories)
        self.max_num_infrequent_samples = int(max_num_infrequent_samples)
        self.p_dup_max = float(p_dup_max)
        self.max_all_reduce_bandwidth = float(max_all_reduce_bandwidth)
        self.max_all_to_all_bandwidth = float(max_all_to_all_bandwidth)
        self.efficiency_bandwidth_ratio = float(efficiency_bandwidth_ratio)
        self.communication_type = communication_type
        self.hybrid_embedding_type = hybrid_embedding_type


def CreateETC(**kwargs: Any) -> None:  # noqa: N802 - HugeCTR's name
    """Refused: the embedding training cache moves parts of tables between SSD, host and GPU;
    tierserve keeps whole tables in host (or device) memory."""
    raise ConfigError(
        "CreateETC: the embedding training cache is not available; tables live in memory "
        "whole. Build the Model without etc (and load a saved table with load_sparse_weights)"
    )
