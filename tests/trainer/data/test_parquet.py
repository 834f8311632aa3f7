import json

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from tierserve.trainer.data import DataFileError  # noqa: E402
from tierserve.trainer.data.parquet import (  # noqa: E402
    ParquetMetadata,
    default_column_names,
    iter_parquet_file,
    load_parquet_metadata,
    write_parquet_file,
    write_parquet_metadata,
)
from tierserve.trainer.data.records import Records  # noqa: E402


def _write(tmp_path, records, list_slots, i64=True):
    labels, conts, cats = default_column_names(
        records.label.shape[1], records.dense.shape[1], records.slot_num
    )
    meta = ParquetMetadata({"f.parquet": len(records)}, cats, conts, labels)
    path = write_parquet_file(tmp_path / "f.parquet", records, meta, list_slots, i64)
    write_parquet_metadata(tmp_path, meta)
    return str(path), meta


@pytest.mark.parametrize("i64", [True, False])
def test_round_trip_one_hot_and_multi_hot(tmp_path, make_records, i64):
    rng = np.random.default_rng(3)
    one_hot = make_records(rng, 100, 1, 3, 4, 1, True)
    # slots 0 and 2 multi-hot with 0..3 keys, slots 1 and 3 one-hot
    multi = make_records(rng, 100, 2, 0, 4, 3, False)
    counts = multi.counts()
    counts[:, [1, 3]] = 1
    offsets = np.zeros(401, dtype=np.int64)
    np.cumsum(counts.ravel(), out=offsets[1:])
    multi = Records(multi.label, multi.dense, rng.integers(0, 2**31, offsets[-1]), offsets, 4)
    for records, lists in ((one_hot, None), (multi, [True, False, True, False])):
        path, meta = _write(tmp_path, records, lists, i64)
        loaded = load_parquet_metadata(tmp_path / "_file_list.txt")
        assert loaded == meta
        parts = list(iter_parquet_file(path, loaded, chunk_records=33))
        assert [f for f, _ in parts] == [0, 33, 66, 99]
        assert Records.concat([r for _, r in parts]).equals(records)


def test_metadata_json_layout(tmp_path, make_records):
    records = make_records(np.random.default_rng(0), 5, 1, 2, 2, 1, True)
    _write(tmp_path, records, None)
    data = json.loads((tmp_path / "_metadata.json").read_text())
    assert data == {
        "file_stats": [{"file_name": "f.parquet", "num_rows": 5}],
        "cats": [{"col_name": "C1", "index": 3}, {"col_name": "C2", "index": 4}],
        "conts": [{"col_name": "I1", "index": 1}, {"col_name": "I2", "index": 2}],
        "labels": [{"col_name": "label", "index": 0}],
    }
    assert pq.read_schema(tmp_path / "f.parquet").names == ["label", "I1", "I2", "C1", "C2"]


def test_errors_name_file_and_column(tmp_path, make_records):
    records = make_records(np.random.default_rng(0), 6, 1, 1, 2, 1, True)
    path, meta = _write(tmp_path, records, None)
    wrong = ParquetMetadata({"f.parquet": 7}, meta.cats, meta.conts, meta.labels)
    with pytest.raises(DataFileError, match="holds 6 rows but _metadata.json file_stats says 7"):
        list(iter_parquet_file(path, wrong))
    missing = ParquetMetadata({}, ["C1", "C9"], meta.conts, meta.labels)
    with pytest.raises(DataFileError, match="field C9: column listed in _metadata.json is missing"):
        list(iter_parquet_file(path, missing))
    table = pq.read_table(path)
    table = table.set_column(1, "I1", pa.array([1.0, 2.0, None, 4.0, 5.0, 6.0], pa.float32()))
    pq.write_table(table, path)
    with pytest.raises(DataFileError, match="record 2, field I1: missing value"):
        list(iter_parquet_file(path, meta))
    with pytest.raises(DataFileError, match="_metadata.json.*missing"):
        load_parquet_metadata(tmp_path / "nowhere" / "_file_list.txt")
