"""HugeCTR's MLPerf-only objects, so scripts can build them: ``HybridEmbeddingParam`` (with
``CommunicationType`` and ``HybridEmbeddingType``).  ``CreateETC`` and ``TrainPSType_t`` (the
embedding training cache) live in :mod:`tierserve.trainer.hugectr.etc_params` and are re-exported here.

A ``HybridEmbeddingParam`` given to ``SparseEmbedding`` warns once (the table is trained as
one table on one device, the same values).
"""

from __future__ import annotations

import enum

from tierserve.core.errors import ConfigError
from tierserve.trainer.hugectr.etc_params import CreateETC, TrainPSType_t  # noqa: F401 - re-exported (HugeCTR's names)


class CommunicationType(enum.Enum):
    IB_NVLink = "IB_NVLink"
    IB_NVLink_Hier = "IB_NVLink_Hier"
    NVLink_SingleNode = "NVLink_SingleNode"


class HybridEmbeddingType(enum.Enum):
    Distributed = "Distributed"


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

