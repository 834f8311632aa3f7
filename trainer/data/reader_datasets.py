"""Datasets over the trainer's Norm, Raw and Parquet files (through its ``DataReader``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from tierserve.core.errors import InvalidInputError

from .dataset import Dataset
from .dataset_blocks import CHUNK, _Block, _BlockIter, _flatten, _GenIter

# -- readers of the trainer's Norm, Raw and Parquet files ----------------------------------


class _ReaderDataset(Dataset):
    """(features, label) elements from the trainer's data reader.

    ``features``: ``"dense"`` float32 [dense_dim] and, per sparse input, its keys under its
    name: int64 [slot_num] when each slot holds one key (``nnz_per_slot=1``), else int64
    [slot_num, nnz_per_slot]; a slot's missing keys are -1.  ``label``: float32 [label_dim].
    Reader options (``check_type``, ``slot_size_array``, ``num_workers``, ...) are
    :class:`~tierserve.trainer.data.reader.DataReader`'s.
    """

    reader_type = ""

    def __init__(
        self,
        source: Any,
        label_dim: int,
        dense_dim: int,
        sparse_params: Sequence[Any],
        **options: Any,
    ) -> None:
        from .reader import DataReader

        if "repeat_dataset" in options:
            raise InvalidInputError(
                f"{type(self).__name__}: repeat_dataset is not an option here; use .repeat()"
            )
        self.args = (self.reader_type, source, CHUNK, label_dim, dense_dim, list(sparse_params))
        self.options = options
        DataReader(*self.args, **self.options).close()  # check the settings now

    def _blocks(self) -> _BlockIter:
        from .reader import DataReader

        reader = DataReader(*self.args, **self.options)
        params = self.args[5]

        def blocks() -> Iterator[_Block]:
            try:
                for batch in reader:
                    features = {"dense": batch.dense}
                    for p, sparse in zip(params, batch.sparse):
                        features[p.sparse_name] = _padded_keys(sparse, p.nnz_per_slot)
                    leaves, tree = _flatten((features, batch.label))
                    yield _Block(tree, leaves)
            finally:
                reader.close()

        return _GenIter(blocks())


def _padded_keys(sparse: Any, nnz: int) -> np.ndarray:
    n, s = sparse.batch_size, sparse.slot_num
    counts = np.diff(sparse.row_offsets)
    out = np.full((n * s, nnz), -1, dtype=np.int64)
    rows = np.repeat(np.arange(n * s), counts)
    pos = np.arange(len(sparse.keys)) - np.repeat(sparse.row_offsets[:-1], counts)
    out[rows, pos] = sparse.keys
    return out.reshape(n, s) if nnz == 1 else out.reshape(n, s, nnz)


class NormDataset(_ReaderDataset):
    """Samples of a Norm file list (see :class:`_ReaderDataset` for the elements)."""

    reader_type = "Norm"


class RawDataset(_ReaderDataset):
    """Samples of a Raw file (see :class:`_ReaderDataset` for the elements)."""

    reader_type = "Raw"


class ParquetDataset(_ReaderDataset):
    """Samples of a Parquet file list (see :class:`_ReaderDataset` for the elements)."""

    reader_type = "Parquet"
