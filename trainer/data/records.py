"""Decoded records in memory, the form every format decodes to and every writer takes.

:class:`Records` holds ``n`` samples with all slots of all sparse inputs in one CSR
(row ``sample * slot_num + slot``).  :class:`SlotLayout` says how those slots split into
the ``DataReaderSparseParam`` inputs; it checks each decoded chunk (nnz limits, key ranges)
and adds the ``slot_size_array`` offsets.  :meth:`Records.to_batch` makes the model's
:class:`~tierserve.model.batch.Batch`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tierserve.core.errors import ConfigError
from tierserve.model.batch import Batch, SparseInput

from .errors import DataFileError
from .params import DataReaderSparseParam


@dataclass(frozen=True)
class Records:
    """``n`` samples: labels, dense features and the keys of every slot in one CSR."""

    label: np.ndarray  # float32 [n, label_dim]
    dense: np.ndarray  # float32 [n, dense_dim]
    keys: np.ndarray  # int64 [nnz]
    row_offsets: np.ndarray  # int64 [n * slot_num + 1], starts at 0
    slot_num: int

    def __len__(self) -> int:
        return int(self.label.shape[0])

    def counts(self) -> np.ndarray:
        """Keys per (sample, slot): int64 ``[n, slot_num]``."""
        return np.diff(self.row_offsets).reshape(len(self), self.slot_num)

    def slice(self, start: int, stop: int) -> Records:
        """Samples ``start:stop`` (label, dense and keys are views)."""
        s = self.slot_num
        lo, hi = int(self.row_offsets[start * s]), int(self.row_offsets[stop * s])
        return Records(
            self.label[start:stop],
            self.dense[start:stop],
            self.keys[lo:hi],
            self.row_offsets[start * s : stop * s + 1] - lo,
            s,
        )

    @staticmethod
    def concat(parts: Sequence[Records]) -> Records:
        """The samples of ``parts`` one after the other."""
        if len(parts) == 1:
            return parts[0]
        ends = np.cumsum([int(p.row_offsets[-1]) for p in parts])
        offsets = [parts[0].row_offsets[:-1]]
        offsets += [p.row_offsets[:-1] + e for p, e in zip(parts[1:], ends[:-1])]
        offsets.append(np.array([ends[-1]], dtype=np.int64))
        return Records(
            np.concatenate([p.label for p in parts]),
            np.concatenate([p.dense for p in parts]),
            np.concatenate([p.keys for p in parts]),
            np.concatenate(offsets),
            parts[0].slot_num,
        )

    def select_slots(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Keys and row offsets of slots ``start:stop`` only (a CSR of ``stop - start`` slots)."""
        n, s = len(self), self.slot_num
        if start == 0 and stop == s:
            return self.keys, self.row_offsets
        begins = self.row_offsets[:-1].reshape(n, s)[:, start:stop].ravel()
        counts = self.counts()[:, start:stop].ravel()
        offsets = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        index = np.repeat(begins - offsets[:-1], counts) + np.arange(offsets[-1], dtype=np.int64)
        return self.keys[index], offsets

    def equals(self, other: Records) -> bool:
        """Same shapes and values (dtype-insensitive for keys)."""
        return (
            self.slot_num == other.slot_num
            and np.array_equal(self.label, other.label)
            and np.array_equal(self.dense, other.dense)
            and np.array_equal(self.keys, other.keys)
            and np.array_equal(self.row_offsets, other.row_offsets)
        )


def fixed_records(
    label: np.ndarray, dense: np.ndarray, keys: np.ndarray, nnz_per_slot: Sequence[int]
) -> Records:
    """Records whose slot ``s`` holds ``nnz_per_slot[s]`` keys in every sample.

    ``keys`` is ``[n, sum(nnz_per_slot)]`` in slot order.
    """
    n = label.shape[0]
    counts = np.tile(np.asarray(nnz_per_slot, dtype=np.int64), n)
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return Records(
        np.ascontiguousarray(label, dtype=np.float32).reshape(n, -1),
        np.ascontiguousarray(dense, dtype=np.float32).reshape(n, -1),
        np.ascontiguousarray(keys, dtype=np.int64).reshape(-1),
        offsets,
        len(nnz_per_slot),
    )


def shared_vocabulary_sizes(slot_size_array: Sequence[int]) -> np.ndarray:
    """Each slot's vocabulary size, where an entry of 0 shares the vocabulary of the next
    non-zero entry (HugeCTR's reading of ``slot_size_array``: slot ``s``'s keys start at
    ``sum(slot_size_array[:s])``, so slots of size 0 start where the next one does, as in
    HugeCTR's DIN test).  Trailing zeros, with no vocabulary after them, are unbounded (-1)."""
    sizes = np.asarray(slot_size_array, dtype=np.int64)
    out = np.full(sizes.shape, -1, dtype=np.int64)
    nxt = -1
    for i in range(sizes.shape[0] - 1, -1, -1):  # per slot, not per key
        if sizes[i] > 0:
            nxt = sizes[i]
        out[i] = nxt
    return out


class SlotLayout:
    """How a dataset's slots map to sparse inputs, with their limits and key offsets.

    ``slot_size_array`` entries of 0 share the next slot's vocabulary
    (:func:`shared_vocabulary_sizes`)."""

    def __init__(
        self,
        label_dim: int,
        dense_dim: int,
        sparse_params: Sequence[DataReaderSparseParam],
        slot_size_array: Sequence[int] = (),
    ) -> None:
        if label_dim < 1 or dense_dim < 0:
            raise ConfigError(
                f"label_dim must be >= 1 and dense_dim >= 0, got {label_dim}, {dense_dim}"
            )
        self.label_dim = int(label_dim)
        self.dense_dim = int(dense_dim)
        self.sparse_params = list(sparse_params)
        bounds = np.cumsum([0] + [p.slot_num for p in self.sparse_params])
        self.slot_ranges = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
        self.slot_num = int(bounds[-1])
        self.slot_size_array = [int(x) for x in slot_size_array]
        if self.slot_size_array and len(self.slot_size_array) != self.slot_num:
            raise ConfigError(
                f"slot_size_array has {len(self.slot_size_array)} entries but the sparse "
                f"inputs have {self.slot_num} slots"
            )
        if any(x < 0 for x in self.slot_size_array):
            raise ConfigError(f"slot_size_array entries must be >= 0, got {self.slot_size_array}")
        self._sizes = shared_vocabulary_sizes(self.slot_size_array)
        self._sizes[self._sizes < 0] = np.iinfo(np.int64).max
        self._offsets = np.concatenate(
            [[0], np.cumsum(self.slot_size_array, dtype=np.int64)[:-1]]).astype(np.int64)

    def max_nnz(self) -> np.ndarray:
        """Per slot, the most keys a sample may hold there (int nnz_per_slot: its total)."""
        out = []
        for p in self.sparse_params:
            if isinstance(p.nnz_per_slot, list):
                out += p.nnz_per_slot
            else:
                out += [p.nnz_per_slot * p.slot_num] * p.slot_num
        return np.asarray(out, dtype=np.int64)

    def check(self, records: Records, file: str, first_record: int) -> Records:
        """Validate nnz limits and key ranges; return the records with slot offsets added.

        Errors name ``file``, the record (``first_record`` + index) and the slot.
        """
        n = len(records)
        if n == 0 or self.slot_num == 0:
            return records
        counts = records.counts()
        for p, (a, b) in zip(self.sparse_params, self.slot_ranges):
            # nnz_per_slot is a maximum whatever is_fixed_length says: in HugeCTR that flag
            # only picks a faster host-to-device copy when a batch has as many keys as the last
            part = counts[:, a:b]
            if isinstance(p.nnz_per_slot, list):
                limit = np.asarray(p.nnz_per_slot, dtype=np.int64)
                bad = part > limit
                if bad.any():
                    r, s = np.argwhere(bad)[0]
                    raise DataFileError(
                        file,
                        f"{part[r, s]} keys, but sparse input {p.sparse_name!r} allows "
                        f"at most {limit[s]} (nnz_per_slot)",
                        record=first_record + int(r),
                        slot=a + int(s),
                    )
            else:
                total = part.sum(axis=1)
                bad_rows = np.flatnonzero(total > p.max_nnz)
                if len(bad_rows):
                    r = int(bad_rows[0])
                    raise DataFileError(
                        file,
                        f"{total[r]} keys in sparse input {p.sparse_name!r}, more than "
                        f"nnz_per_slot * slot_num = {p.max_nnz}",
                        record=first_record + r,
                    )
        if not self.slot_size_array:
            return records
        slot_of_key = np.repeat(np.tile(np.arange(self.slot_num), n), counts.ravel())
        keys = records.keys
        bad = (keys < 0) | (keys >= self._sizes[slot_of_key])
        if bad.any():
            i = int(np.argmax(bad))
            row = int(np.searchsorted(records.row_offsets, i, side="right")) - 1
            slot = row % self.slot_num
            raise DataFileError(
                file,
                f"key {int(keys[i])} is outside [0, slot_size_array[{slot}] = "
                f"{self.slot_size_array[slot]})" if self.slot_size_array[slot] else
                f"key {int(keys[i])} is outside [0, {int(self._sizes[slot])}) (slot_size_array"
                f"[{slot}] = 0: the slot shares the next non-zero entry's vocabulary)",
                record=first_record + row // self.slot_num,
                slot=slot,
            )
        return Records(
            records.label,
            records.dense,
            keys + self._offsets[slot_of_key],
            records.row_offsets,
            records.slot_num,
        )

    def to_batch(self, records: Records) -> Batch:
        """The model's batch: one :class:`SparseInput` per sparse param."""
        sparse = []
        for a, b in self.slot_ranges:
            keys, offsets = records.select_slots(a, b)
            sparse.append(SparseInput(keys, offsets, b - a))
        return Batch(records.label, records.dense, tuple(sparse))
