"""Each rank reads its own share: a data reader sharded for rank r of N hands out exactly rank
r's rows of every global batch the unsharded reader makes (Norm, Raw, Parquet; repeat and
epoch mode; chunks and files that cross batch boundaries; the placeholder of an empty
share), without the whole batch being assembled and sliced."""

from __future__ import annotations

import numpy as np
import pytest

from tierserve.trainer.data import (
    Check_t,
    DataGenerator,
    DataGeneratorParams,
    DataReader,
    DataReaderSparseParam,
)
from tierserve.trainer.data.shard import BatchShares
from tierserve.trainer.distributed.reader import Placeholder, ShardedReader, share, slice_batch
from tierserve.trainer.hugectr.adapters import ReaderHandle

SLOTS = [50, 7, 300]
FILES, PER_FILE = 3, 200  # 600 records


@pytest.fixture(scope="module", params=["Norm", "Raw", "Parquet"])
def source(request, tmp_path_factory):
    fmt = request.param
    if fmt == "Parquet":
        pytest.importorskip("pyarrow")
    base = tmp_path_factory.mktemp(f"shard_{fmt}")
    src, eval_src = {
        "Norm": (base / "file_list.txt", base / "file_list_test.txt"),
        "Parquet": (base / "train" / "_file_list.txt", base / "val" / "_file_list.txt"),
        "Raw": (base / "train.bin", base / "test.bin"),
    }[fmt]
    DataGenerator(
        DataGeneratorParams(
            format=fmt,
            label_dim=1,
            dense_dim=2,
            num_slot=len(SLOTS),
            i64_input_key=fmt != "Raw",
            source=str(src),
            eval_source=str(eval_src),
            slot_size_array=SLOTS,
            nnz_array=[] if fmt == "Raw" else [1, 3, 2],
            variable_nnz=fmt != "Raw",
            check_type=Check_t.Sum,
            num_files=FILES,
            eval_num_files=1,
            num_samples_per_file=PER_FILE,
            num_samples=FILES * PER_FILE,
            eval_num_samples=PER_FILE,
            seed=3,
        )
    ).generate()
    nnz = 1 if fmt == "Raw" else 3
    return fmt, str(src), [DataReaderSparseParam("s", nnz, fmt == "Raw", len(SLOTS))], fmt != "Raw"


def _reader(source, batch, repeat):
    fmt, src, sparse, i64 = source
    return DataReader(
        fmt,
        src,
        batch,
        1,
        2,
        sparse,
        check_type=Check_t.Sum,
        i64_input_key=i64,
        repeat_dataset=repeat,
        chunk_records=45,
        num_workers=2,
    )


def _same(got, want):
    assert np.array_equal(got.label, want.label)
    assert np.array_equal(got.dense, want.dense)
    for g, w in zip(got.sparse, want.sparse):
        assert np.array_equal(g.keys, w.keys)
        assert np.array_equal(g.row_offsets, w.row_offsets)


@pytest.mark.parametrize(
    "repeat,batch,ranks",
    [
        (True, 64, 2),  # batches span the files and the end of the source
        (True, 1, 2),  # fewer samples in a batch than ranks: rank 1 always a placeholder
        (False, 128, 3),  # the last batch short (88 samples)
        (False, 599, 2),  # the last batch holds one sample: rank 1's share is empty
    ],
)
def test_each_rank_reads_its_share_of_every_global_batch(source, repeat, batch, ranks):
    whole = _reader(source, batch, repeat)
    sharded = [_reader(source, batch, repeat) for _ in range(ranks)]
    for r, reader in enumerate(sharded):
        reader.shard(r, ranks)
    try:
        for _ in range(40 if repeat else 10**6):
            want = whole.read_a_batch()
            got = [reader.read_a_batch() for reader in sharded]
            if want is None:
                assert got == [None] * ranks
                assert all(reader.is_eof() for reader in sharded)
                break
            for r, part in enumerate(got):
                lo, hi = share(want.batch_size, r, ranks)
                assert isinstance(part, Placeholder) == (hi == lo)
                _same(part, slice_batch(want, lo, hi) if hi > lo else slice_batch(want, 0, 1))
        else:
            assert repeat
        # set_source starts the pass again from the first global batch
        for reader in (whole, *sharded):
            reader.set_source("")
        first = whole.read_a_batch()
        lo, hi = share(first.batch_size, ranks - 1, ranks)
        if hi > lo:
            _same(sharded[-1].read_a_batch(), slice_batch(first, lo, hi))
    finally:
        for reader in (whole, *sharded):
            reader.close()


def test_the_model_handle_asks_the_reader_for_its_share(source):
    reader = _reader(source, 64, True)
    handle = ShardedReader(ReaderHandle(reader), 1, 2)
    try:
        assert handle.selects
        batch = handle.next_batch()
        assert batch.batch_size == 32 and not handle.placeholder
        # the reader itself hands out the share: nothing was assembled whole and sliced
        assert reader.read_a_batch().batch_size == 32
    finally:
        reader.close()


def test_shares_of_a_record_stream_follow_global_batches():
    """The selection arithmetic alone: 3 files of 5, 2 and 6 records in batches of 4."""
    shares = BatchShares([5, 2, 6], 4, 1, 2, repeat=False)
    # global records 0..12: batches [0..3] [4..7] [8..11] [12]; rank 1 keeps 2,3 6,7 10,11
    # and, of the last batch of one sample, nothing (rank 0's) -> a placeholder of sample 12
    kept = [shares.prefix[t] + shares.keep(t, 0, n) for t, n in enumerate(shares.counts)]
    assert np.concatenate(kept).tolist() == [2, 3, 6, 7, 10, 11, 12]
    assert [shares.need(b) for b in range(5)] == [
        (2, False),
        (2, False),
        (2, False),
        (1, True),
        (0, False),
    ]
    cycled = BatchShares([5, 2, 6], 4, 0, 2, repeat=True)  # 13 records: the second cycle
    # the second pass starts mid-batch (13 % 4 = 1): records 13, 16 and 17 are rank 0's
    assert (cycled.keep(3, 0, 5) + 13).tolist() == [13, 16, 17]
