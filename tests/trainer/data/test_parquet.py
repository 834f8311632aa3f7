import json
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from tierserve.trainer.data import DataFileError, DataReader, DataReaderSparseParam  # noqa: E402
from tierserve.trainer.data.filelist import write_file_list  # noqa: E402
from tierserve.trainer.data.parquet import (  # noqa: E402
    ParquetMetadata,
    default_column_names,
    find_parquet_metadata,
    iter_parquet_file,
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
        loaded = find_parquet_metadata(path)
        assert (loaded.labels, loaded.conts, loaded.cats) == (meta.labels, meta.conts, meta.cats)
        assert loaded.index == {c: i for i, c in enumerate(meta.columns)}
        parts = list(iter_parquet_file(path, loaded, chunk_records=33))
        assert [f for f, _ in parts] == [0, 33, 66, 99]
        assert Records.concat([r for _, r in parts]).equals(records)


def test_metadata_json_layout(tmp_path, make_records):
    records = make_records(np.random.default_rng(0), 5, 1, 2, 2, 1, True)
    _write(tmp_path, records, None)
    data = json.loads((tmp_path / "_metadata.json").read_text())
    assert data == {
        "file_stats": [{"file_name": "f.parquet", "num_rows": 5}],
        "labels": [{"col_name": "label", "index": 0}],
        "conts": [{"col_name": "I1", "index": 1}, {"col_name": "I2", "index": 2}],
        "cats": [{"col_name": "C1", "index": 3}, {"col_name": "C2", "index": 4}],
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
    with pytest.raises(DataFileError, match="_metadata.json: missing .*folder of the data files"):
        find_parquet_metadata(tmp_path / "nowhere" / "f.parquet")
    out_of_range = ParquetMetadata({}, meta.cats, meta.conts, meta.labels,
                                   {"label": 0, "I1": 1, "C1": 2, "C2": 9})
    with pytest.raises(DataFileError, match="field C2: _metadata.json gives index 9, but the "
                       "file has 4 columns"):
        list(iter_parquet_file(path, out_of_range))


def _hugectr_generator_files(folder, records, i64, nnz):
    """Files as HugeCTR's DataGenerator writes Parquet (data_generation_for_parquet): cudf
    columns without names (cudf calls them _col0, _col1, ...): labels, dense, then one column
    per slot (a list column where nnz > 1), keys uint32 or int64; _metadata.json beside them
    naming label0.., C<label_dim>.. with the columns' indices and file names with folders."""
    n, ld, dd, s = len(records), records.label.shape[1], records.dense.shape[1], records.slot_num
    kt = pa.int64() if i64 else pa.uint32()
    cols = [pa.array(records.label[:, j]) for j in range(ld)]
    cols += [pa.array(records.dense[:, j]) for j in range(dd)]
    for slot in range(s):
        keys, offsets = records.select_slots(slot, slot + 1)
        values = pa.array(keys, kt)
        cols.append(pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values)
                    if nnz[slot] > 1 else values)
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(cols, names=[f"_col{i}" for i in range(len(cols))]),
                   folder / "gen_0.parquet")
    meta = {
        "file_stats": [{"file_name": f"./{folder.parent.name}/{folder.name}/gen_0.parquet",
                        "num_rows": n}],
        "labels": [{"col_name": f"label{i}", "index": i} for i in range(ld)],
        "conts": [{"col_name": f"C{i}", "index": i} for i in range(ld, ld + dd)],
        "cats": [{"col_name": f"C{i}", "index": i} for i in range(ld + dd, ld + dd + s)],
    }
    (folder / "_metadata.json").write_text(json.dumps(meta))


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 30), label_dim=st.integers(1, 2), dense_dim=st.integers(0, 3),
       nnz=st.lists(st.integers(1, 3), min_size=1, max_size=4), i64=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_hugectr_layout_both_ways(tmp_path, make_records, n, label_dim, dense_dim, nnz, i64,
                                  seed):
    """HugeCTR's generator layout (lists beside train/, unnamed columns read by index) reads
    back; our writer's files read by index as HugeCTR reads them give the same values."""
    rng = np.random.default_rng(seed)
    s = len(nnz)
    records = make_records(rng, n, label_dim, dense_dim, s, max(nnz), False, 2**32)
    counts = np.minimum(np.maximum(records.counts(), 1), nnz)  # 1 .. nnz keys, as HugeCTR
    offsets = np.zeros(n * s + 1, np.int64)
    np.cumsum(counts.ravel(), out=offsets[1:])
    records = type(records)(records.label, records.dense,
                            rng.integers(0, 2**32, int(offsets[-1])), offsets, s)
    base = tmp_path / str(seed)
    _hugectr_generator_files(base / "train", records, i64, nnz)
    (base / "file_list.txt").write_text(f"1\n{base / 'train' / 'gen_0.parquet'}\n")
    sparse = [DataReaderSparseParam("s", list(nnz), False, s)]
    with DataReader("Parquet", base / "file_list.txt", 64, label_dim, dense_dim, sparse) as r:
        got = [b for b in r]
    keys = np.concatenate([b.sparse[0].keys for b in got])
    assert np.array_equal(keys, records.keys)
    assert np.array_equal(np.concatenate([b.label for b in got]), records.label)
    assert np.array_equal(np.concatenate([b.dense for b in got]), records.dense)
    # ours, parsed as HugeCTR does: _metadata.json beside the data file, columns by index
    labels, conts, cats = default_column_names(label_dim, dense_dim, s)
    meta = ParquetMetadata({"ours.parquet": n}, cats, conts, labels)
    path = write_parquet_file(base / "ours" / "ours.parquet", records, meta,
                              [c > 1 for c in nnz], i64)
    write_parquet_metadata(path.parent, meta)
    parsed = json.loads((path.parent / "_metadata.json").read_text())
    table = pq.read_table(path)
    column = [table.column(e["index"]).to_pylist() for e in parsed["cats"]]
    flat = [k for row in zip(*column) for v in row for k in (v if isinstance(v, list) else [v])]
    assert flat == records.keys.tolist()
    assert [table.column(e["index"]).to_pylist() for e in parsed["labels"]] == \
        records.label.T.tolist()
    key_type = "int64" if i64 else "uint32"
    assert {str(t).replace("list<element: ", "").rstrip(">")
            for t in (table.schema.field(e["index"]).type for e in parsed["cats"])} == {key_type}


def test_metadata_beside_the_file_list_only_is_used_with_a_warning(tmp_path, make_records):
    """tierserve once wanted _metadata.json beside the file list; HugeCTR reads it beside the
    data files."""
    records = make_records(np.random.default_rng(1), 8, 1, 1, 2, 1, True)
    labels, conts, cats = default_column_names(1, 1, 2)
    meta = ParquetMetadata({"f.parquet": 8}, cats, conts, labels)
    path = write_parquet_file(tmp_path / "data" / "f.parquet", records, meta, None, True)
    write_parquet_metadata(tmp_path, meta)
    write_file_list(tmp_path / "list.txt", [path])
    sparse = [DataReaderSparseParam("s", 1, True, 2)]
    with (pytest.warns(UserWarning, match="HugeCTR reads it from the data files' folder only"),
          DataReader("Parquet", tmp_path / "list.txt", 8, 1, 1, sparse) as reader):
        assert np.array_equal(next(iter(reader)).sparse[0].keys, records.keys)
    (tmp_path / "_metadata.json").rename(tmp_path / "data" / "_metadata.json")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with DataReader("Parquet", tmp_path / "list.txt", 8, 1, 1, sparse) as reader:
            assert np.array_equal(next(iter(reader)).sparse[0].keys, records.keys)


def test_columns_are_read_by_index_as_hugectr_reads_them(tmp_path, make_records):
    records = make_records(np.random.default_rng(2), 6, 1, 1, 2, 1, True)
    path, meta = _write(tmp_path, records, None)
    swapped = ParquetMetadata({}, ["C1", "C2"], ["I1"], ["label"],
                              {"label": 0, "I1": 1, "C1": 3, "C2": 2}, source="m.json")
    with pytest.warns(UserWarning, match="column 'C1' has index 3 but is column 2"):
        got = Records.concat([r for _, r in iter_parquet_file(path, swapped)])
    assert np.array_equal(got.keys.reshape(6, 2), records.keys.reshape(6, 2)[:, ::-1])
