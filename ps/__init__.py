"""tierserve's hierarchical parameter server: tiers, formats, configuration and updates."""

from .config import (
    DatabaseOverflowPolicy_t,
    DatabaseType_t,
    PSConfig,
    UpdateSourceType_t,
    load_ps_config,
    parse_ps_config,
)
from .errors import (
    BackendUnavailableError,
    ConfigError,
    CorruptModelFileError,
    InvalidInputError,
    MalformedMessageError,
    NotFoundError,
    NotReadyError,
    TierserveError,
)
from .params import PersistentDatabaseParams, UpdateSourceParams, VolatileDatabaseParams
from .sparse_file import SparseTable, read_sparse_model, write_sparse_model
from .table_tag import parse_table_tag, table_tag
from .update_message import decode_update, encode_update

__all__ = [
    "BackendUnavailableError",
    "ConfigError",
    "CorruptModelFileError",
    "DatabaseOverflowPolicy_t",
    "DatabaseType_t",
    "InvalidInputError",
    "MalformedMessageError",
    "NotFoundError",
    "NotReadyError",
    "PSConfig",
    "PersistentDatabaseParams",
    "SparseTable",
    "TierserveError",
    "UpdateSourceParams",
    "UpdateSourceType_t",
    "VolatileDatabaseParams",
    "decode_update",
    "encode_update",
    "load_ps_config",
    "parse_ps_config",
    "parse_table_tag",
    "read_sparse_model",
    "table_tag",
    "write_sparse_model",
]
