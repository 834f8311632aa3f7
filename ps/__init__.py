"""tierserve's hierarchical parameter server: tiers, formats, configuration and updates."""

from tierserve.core.errors import (
    BackendUnavailableError,
    ConfigError,
    CorruptModelFileError,
    InvalidInputError,
    MalformedMessageError,
    NotFoundError,
    NotReadyError,
    TierserveError,
)

from .config import PSConfig, load_ps_config, parse_ps_config
from .config_base import (
    DatabaseHashMapAlgorithm_t,
    DatabaseOverflowPolicy_t,
    DatabaseType_t,
    UpdateSourceType_t,
)
from .eviction import EvictionPolicy, make_policy
from .hierarchy import CreateParameterServer, HierarchicalParameterServer, ServedModel, TableSpec
from .params import PersistentDatabaseParams, UpdateSourceParams, VolatileDatabaseParams
from .sparse_file import SparseTable, read_sparse_model, write_sparse_model
from .stats import LatencyHistogram, TierStats
from .table_tag import parse_table_tag, table_tag
from .tier import Tier
from .tier_registry import create_tier
from .update_message import decode_update, encode_update

__all__ = [
    "BackendUnavailableError",
    "ConfigError",
    "CreateParameterServer",
    "CorruptModelFileError",
    "DatabaseHashMapAlgorithm_t",
    "DatabaseOverflowPolicy_t",
    "DatabaseType_t",
    "EvictionPolicy",
    "HierarchicalParameterServer",
    "InvalidInputError",
    "LatencyHistogram",
    "MalformedMessageError",
    "NotFoundError",
    "NotReadyError",
    "PSConfig",
    "PersistentDatabaseParams",
    "ServedModel",
    "SparseTable",
    "TableSpec",
    "Tier",
    "TierStats",
    "TierserveError",
    "UpdateSourceParams",
    "UpdateSourceType_t",
    "VolatileDatabaseParams",
    "decode_update",
    "create_tier",
    "encode_update",
    "load_ps_config",
    "make_policy",
    "parse_ps_config",
    "parse_table_tag",
    "read_sparse_model",
    "table_tag",
    "write_sparse_model",
]
