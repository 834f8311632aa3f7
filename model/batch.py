"""The unit every data reader yields and the model consumes: one mini-batch.

Sparse inputs are in CSR form per sparse input (HugeCTR's layout): for ``batch_size`` samples
and ``slot_num`` slots, row ``r = sample * slot_num + slot`` owns
``keys[row_offsets[r]:row_offsets[r + 1]]``.  Keys already include the slot offsets from
``slot_size_array`` when the reader applies them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SparseInput:
    """One sparse input (``DataReaderSparseParam``) of a batch, as CSR."""

    keys: np.ndarray  # int64 (or int32 when i64_input_key is False) [nnz]
    row_offsets: np.ndarray  # int64 [batch_size * slot_num + 1], starts at 0
    slot_num: int

    @property
    def batch_size(self) -> int:
        return (len(self.row_offsets) - 1) // self.slot_num


@dataclass(frozen=True)
class Batch:
    """Labels, dense features and sparse inputs of ``batch_size`` samples."""

    label: np.ndarray  # float32 [batch_size, label_dim]
    dense: np.ndarray  # float32 [batch_size, dense_dim]
    sparse: tuple[SparseInput, ...]

    @property
    def batch_size(self) -> int:
        return int(self.label.shape[0])
