"""The embedding cache in front of the parameter server, on numpy (CPU) or cupy (GPU).

- :class:`EmbeddingCache`: one table on one device (dynamic or static).
- :class:`ModelEmbeddingCache` and :func:`CreateEmbeddingCache`: every table of a model.
- :class:`ParameterServerLike` / :class:`UpdateNotifier`: what the cache needs from the
  parameter server (``tierserve.ps.hierarchy.HierarchicalParameterServer`` is both).
"""

from .embedding_cache import EmbeddingCache
from .metrics import CacheMetrics
from .model_cache import CreateEmbeddingCache, ModelEmbeddingCache
from .protocols import ParameterServerLike, UpdateListener, UpdateNotifier
from .set_associative import SetAssociativeTable
from .static_table import StaticTable

__all__ = [
    "CacheMetrics",
    "CreateEmbeddingCache",
    "EmbeddingCache",
    "ModelEmbeddingCache",
    "ParameterServerLike",
    "SetAssociativeTable",
    "StaticTable",
    "UpdateListener",
    "UpdateNotifier",
]
