"""Parquet files as a Dataset of named columns (HybridBackend's from_parquet): rows equal
pyarrow's own reading of the files, list columns stay per row, bad input is named."""

import numpy as np
import pytest

from tierserve.core.errors import ConfigError
from tierserve.trainer.data import Dataset
from tierserve.trainer.data.errors import DataFileError
from tierserve.trainer.data.tabular import Field, from_parquet

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def write(path, n, start=0, row_group_size=7):
    rng = np.random.default_rng(start)
    table = pa.table({
        "label": pa.array((np.arange(start, start + n) % 2).astype(np.int32)),
        "Price": pa.array(rng.normal(size=n).astype(np.float32)),
        "cat": pa.array([f"c{i % 5}" for i in range(start, start + n)]),
        "tags": pa.array([list(range(i % 4)) for i in range(start, start + n)],
                         pa.list_(pa.int64())),
        "pair": pa.array([[i, -i] for i in range(start, start + n)], pa.list_(pa.int64())),
    })
    pq.write_table(table, path, row_group_size=row_group_size)
    return table


def test_rows_and_batches_equal_pyarrows_reading(tmp_path):
    a = write(tmp_path / "a.parquet", 20)
    b = write(tmp_path / "b.parquet", 9, start=20)
    ds = from_parquet([str(tmp_path / "a.parquet"), tmp_path / "b.parquet"])
    rows = list(ds)
    expect = a.to_pylist() + b.to_pylist()
    assert len(rows) == 29
    for got, want in zip(rows, expect):
        assert int(got["label"]) == want["label"] and str(got["cat"]) == want["cat"]
        assert float(got["Price"]) == pytest.approx(want["Price"])
        assert got["tags"].tolist() == want["tags"] and got["pair"].tolist() == want["pair"]
    (batch, *_), = [list(ds.batch(8, drop_remainder=True))]
    assert batch["label"].shape == (8,) and batch["cat"].dtype.kind == "U"
    assert batch["tags"].dtype == object and [t.tolist() for t in batch["tags"]] == [
        r["tags"] for r in expect[:8]]
    assert len(list(ds.batch(8, drop_remainder=True))) == 3  # 29 rows: the last 5 dropped


def test_fields_case_dense_lists_partitions_and_filename_datasets(tmp_path):
    table = write(tmp_path / "a.parquet", 21)  # row groups of 7: 3 of them
    path = str(tmp_path / "a.parquet")
    rows = list(from_parquet(path, fields=["price", Field("pair", "float32")],
                             field_ignore_case=True, to_dense=True).batch(21))
    (batch,) = rows
    assert sorted(batch) == ["pair", "price"]
    np.testing.assert_allclose(batch["price"], table.column("Price").to_numpy())
    assert batch["pair"].dtype == np.float32 and batch["pair"].shape == (21, 2)
    np.testing.assert_array_equal(batch["pair"][:, 0], np.arange(21))
    padded = next(iter(from_parquet(path, fields=["tags"], to_dense=[2]).batch(4)))["tags"]
    np.testing.assert_array_equal(padded, [[0, 0], [0, 0], [0, 1], [0, 1]])  # padded and cut
    with pytest.raises(DataFileError, match="field tags: to_dense: rows have"):
        list(from_parquet(path, fields=["tags"], to_dense=True))
    parts = [[int(r["label"]) for r in from_parquet(path, fields=["pair"],
                                                   partition_count=2, partition_index=k)
              .map(lambda r: {"label": r["pair"][0]})] for k in (0, 1)]
    assert parts == [list(range(0, 7)) + list(range(14, 21)), list(range(7, 14))]
    names = Dataset.from_tensor_slices(np.array([path, path]))
    assert len(list(from_parquet(names, fields=["label"]))) == 42


def test_bad_input_is_named(tmp_path):
    write(tmp_path / "a.parquet", 5)
    path = str(tmp_path / "a.parquet")
    with pytest.raises(DataFileError, match="no column 'nope'"):
        list(from_parquet(path, fields=["nope"]))
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(DataFileError, match="junk.parquet: not a readable Parquet file"):
        list(from_parquet(str(tmp_path / "junk.parquet")))
    pq.write_table(pa.table({"x": pa.array([1, None, 3])}), tmp_path / "nulls.parquet")
    with pytest.raises(DataFileError, match="record 1, field x: missing value"):
        list(from_parquet(str(tmp_path / "nulls.parquet")))
    with pytest.raises(ConfigError, match="num_parallel_reads=4"):
        from_parquet(path, num_parallel_reads=4)
    with pytest.raises(ConfigError, match="skip_corrupted_data"):
        from_parquet(path, skip_corrupted_data=True)
    with pytest.raises(ConfigError, match="partition_index 2"):
        from_parquet(path, partition_count=2, partition_index=2)
