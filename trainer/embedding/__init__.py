"""Sparse embedding tables: the hash index, the pooling arithmetic and the trainable table.

``combine`` (forward pooling of CSR rows) is free of training state so the inference server
can reuse it; :class:`EmbeddingTable` is what a ``hugectr.SparseEmbedding`` layer trains.
"""

from tierserve.model.combine import (
    CsrLayout,
    combine,
    embedding_gradients,
    scatter_sum,
    unique_rows,
)

from .key_index import KeyIndex
from .table import (
    Embedding_t,
    EmbeddingTable,
    key_uniform,
    max_rows_for_workspace,
    read_sparse_optimizer_file,
    write_sparse_optimizer_file,
)

__all__ = [
    "CsrLayout",
    "EmbeddingTable",
    "Embedding_t",
    "KeyIndex",
    "key_uniform",
    "combine",
    "embedding_gradients",
    "max_rows_for_workspace",
    "read_sparse_optimizer_file",
    "scatter_sum",
    "unique_rows",
    "write_sparse_optimizer_file",
]
