import numpy as np
import pytest

from tierserve.trainer.data import DataReaderSparseParam
from tierserve.trainer.data.records import Records


def random_records(rng, n, label_dim, dense_dim, slot_num, max_nnz, fixed, key_high=2**31):
    """Random records; ``fixed``: every slot holds ``max_nnz`` keys, else 0..max_nnz."""
    if fixed:
        counts = np.full((n, slot_num), max_nnz)
    else:
        counts = rng.integers(0, max_nnz + 1, (n, slot_num))
    offsets = np.zeros(n * slot_num + 1, dtype=np.int64)
    np.cumsum(counts.ravel(), out=offsets[1:])
    return Records(
        rng.standard_normal((n, label_dim)).astype(np.float32),
        rng.standard_normal((n, dense_dim)).astype(np.float32),
        rng.integers(0, key_high, int(offsets[-1])).astype(np.int64),
        offsets,
        slot_num,
    )


def batches_to_records(batches, slot_num):
    """Concatenate the batches of a one-sparse-input reader back into Records."""
    return Records.concat(
        [
            Records(b.label, b.dense, b.sparse[0].keys, b.sparse[0].row_offsets, slot_num)
            for b in batches
        ]
    )


@pytest.fixture
def make_records():
    return random_records


@pytest.fixture
def from_batches():
    return batches_to_records


@pytest.fixture
def one_hot26():
    return [DataReaderSparseParam("data1", 1, True, 26)]
