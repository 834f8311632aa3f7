"""The tf.data-style Dataset: pipelines over CSV shards equal a plain read, shuffle is
TensorFlow's buffer algorithm, memory is bounded by the buffers, bad records name file/line."""

import csv
import gzip
import threading
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierserve.core.errors import InvalidInputError
from tierserve.server.errors import http_status
from tierserve.trainer import data
from tierserve.trainer.data import (
    AUTOTUNE,
    CSVRecordError,
    DataReaderSparseParam,
    Dataset,
    DecodeCSVError,
    NormDataset,
    TextLineDataset,
    decode_csv,
    write_file_list,
)
from tierserve.trainer.data.norm import write_norm_file

TYPES = ["house", "apt", "condo"]


def write_shards(folder, shards=4, rows=250, seed=0):
    """CSV shards train.csv-<k> of (sq_footage int, type str, price float)."""
    rng = np.random.default_rng(seed)
    paths = []
    for k in range(shards):
        path = folder / f"train.csv-{k:02d}"
        with open(path, "w") as f:
            for _ in range(rows):
                sq = int(rng.integers(300, 5000))
                kind = TYPES[int(rng.integers(0, 3))]
                price = round(float(rng.normal(sq * 0.3, 50)), 3)
                f.write(f"{sq},{kind},{price}\n")
        paths.append(path)
    return paths


def reference_rows(paths):
    """The straightforward read: csv module, one row at a time."""
    rows = []
    for path in sorted(paths):
        with open(path, newline="") as f:
            for sq, kind, price in csv.reader(f):
                rows.append((int(sq), kind, np.float32(float(price))))
    return rows


def decode_line(row):  # the course notes' decode_line, with float price
    cols = decode_csv(row, record_defaults=[[0], ["house"], [0.0]])
    features = {"sq_footage": cols[0], "type": cols[1]}
    label = cols[2]
    return features, label


def rows_of(batches):
    out = []
    for features, label in batches:
        out.extend(zip(features["sq_footage"].tolist(), features["type"].tolist(), label.tolist()))
    return [(int(a), str(b), np.float32(c)) for a, b, c in out]


def test_sharded_csv_pipeline_equals_a_plain_read(tmp_path):
    paths = write_shards(tmp_path)
    want = reference_rows(paths)
    pattern = str(tmp_path / "train.csv-*")

    ordered = (
        Dataset.list_files(pattern, shuffle=False)
        .flat_map(TextLineDataset)
        .map(decode_line)
        .batch(128)
        .prefetch(2)
    )
    batches = list(ordered)
    assert [len(b[1]) for b in batches] == [128] * 7 + [1000 - 7 * 128]  # last batch kept
    assert rows_of(batches) == want
    f, label = batches[0]
    assert f["sq_footage"].dtype == np.int32 and label.dtype == np.float32
    assert f["type"].dtype.kind == "U"

    shuffled = (
        Dataset.list_files(pattern, seed=3)
        .flat_map(TextLineDataset)
        .map(decode_line)
        .shuffle(300, seed=5)
        .repeat(2)
        .batch(128)
        .prefetch(AUTOTUNE)
    )
    got = rows_of(shuffled)
    assert len(got) == 2000
    assert sorted(got) == sorted(want + want)  # every row, each epoch
    assert got[:1000] != want and sorted(got[:1000]) == sorted(want)
    assert got[:1000] != got[1000:]  # reshuffled each iteration


def test_batch_then_map_decodes_a_whole_batch_at_once(tmp_path):
    paths = write_shards(tmp_path, shards=2, rows=100)
    calls = []

    def decode_batch(rows):
        calls.append(len(rows))
        return decode_line(rows)

    ds = TextLineDataset([str(p) for p in paths]).batch(64).map(decode_batch)
    assert rows_of(ds) == reference_rows(paths)
    assert calls == [64, 64, 64, 8]


def tf_shuffle_reference(values, buffer_size, seed, pulls):
    """TensorFlow's shuffle buffer one element at a time, with the draws the block
    implementation makes (one per input row, in order; a permutation to drain)."""
    rng = np.random.default_rng(int(np.random.default_rng(seed).integers(2**63)))
    buf, out, pos = list(values[:buffer_size]), [], buffer_size
    if len(buf) == buffer_size:
        while pos < len(values):
            m = min(pulls, len(values) - pos)
            for slot, v in zip(rng.integers(0, buffer_size, m).tolist(), values[pos : pos + m]):
                out.append(buf[slot])
                buf[slot] = v
            pos += m
    return out + [buf[i] for i in rng.permutation(len(buf))]


@pytest.mark.parametrize("n,buffer_size,batch", [(1000, 100, 7), (1000, 10, 64), (50, 80, 8)])
def test_shuffle_is_tensorflows_buffer_algorithm(n, buffer_size, batch):
    got = np.concatenate(list(Dataset.range(n).shuffle(buffer_size, seed=11).batch(batch)))
    assert got.tolist() == tf_shuffle_reference(list(range(n)), buffer_size, 11, batch)


def test_shuffle_buffer_of_one_keeps_order_and_seeds_repeat():
    assert list(Dataset.range(20).shuffle(1)) == list(range(20))
    ds = Dataset.range(100).shuffle(30, seed=1, reshuffle_each_iteration=False)
    assert list(ds) == list(ds) != list(range(100))
    again = Dataset.range(100).shuffle(30, seed=1)
    assert list(again) == list(Dataset.range(100).shuffle(30, seed=1))


def test_memory_is_bounded_by_the_buffers(tmp_path):
    """A file 40x larger than the shuffle buffer: rows decoded but not yet delivered never
    exceed buffer + batch (prefetch adds its batches)."""
    path = tmp_path / "big.csv"
    rows = 20_000
    with open(path, "w") as f:
        f.writelines(f"{i},apt,{i}.5\n" for i in range(rows))
    buffer_size, batch = 500, 32
    lock = threading.Lock()
    entered = [0]

    def counted(row):
        with lock:
            entered[0] += 1
        return decode_line(row)

    def peak_held(ds):
        delivered, peak, seen = 0, 0, set()
        for features, _ in ds:
            with lock:
                peak = max(peak, entered[0] - delivered)
            delivered += len(features["sq_footage"])
            seen.update(features["sq_footage"].tolist())
        assert delivered == rows and len(seen) == rows
        return peak

    base = TextLineDataset(str(path)).map(counted).shuffle(buffer_size, seed=0).batch(batch)
    assert peak_held(base) <= buffer_size + batch

    entered[0] = 0
    prefetched = base.prefetch(2)
    # two queued batches, one waiting to be queued, the one being handed over
    assert peak_held(prefetched) <= buffer_size + batch * (2 + 2)


def test_wrong_number_of_fields_names_file_and_line(tmp_path):
    paths = write_shards(tmp_path, shards=3, rows=100)
    lines = paths[1].read_text().splitlines()
    lines[56] += ",extra"
    paths[1].write_text("\n".join(lines) + "\n")
    pattern = str(tmp_path / "train.csv-*")
    pipelines = {
        "per element": Dataset.list_files(pattern, shuffle=False)
        .flat_map(TextLineDataset)
        .map(decode_line)
        .shuffle(50)
        .batch(16)
        .prefetch(2),
        "per batch": Dataset.list_files(pattern, shuffle=False)
        .flat_map(TextLineDataset)
        .shuffle(50)
        .batch(16)
        .map(decode_line, num_parallel_calls=AUTOTUNE),
    }
    for name, ds in pipelines.items():
        with pytest.raises(CSVRecordError) as info:
            list(ds)
        err = info.value
        assert (err.file, err.line) == (str(paths[1]), 57), name
        assert f"{paths[1]}, line 57" in str(err) and "expected 3 fields, got 4" in str(err)
        assert http_status(err) == 400


def test_a_field_of_the_wrong_type_names_the_column_and_line(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("1000,house,500\n2000,apt,1000\n")
    swapped = TextLineDataset(str(path)).map(lambda r: decode_csv(r, [[0], [0], [0]]))
    with pytest.raises(CSVRecordError) as info:
        list(swapped)
    assert info.value.line == 1 and info.value.column == 1
    assert "'house' is not a valid int32" in str(info.value)


@pytest.mark.parametrize(
    "defaults,column,words",
    [
        ([[0], [None], [0]], 1, "None"),
        ([[0], ["x"], [{}]], 2, "dict"),
        ([[0], [1, 2], [0]], 1, "at most one value"),
        ([[0], [True], [0]], 1, "True"),
        ([np.array([], dtype=np.int16), ["x"], [0]], 0, "int16"),
    ],
)
def test_a_bad_record_default_names_the_column(defaults, column, words):
    with pytest.raises(InvalidInputError) as info:
        decode_csv("1,a,2", defaults)
    assert f"column {column}" in str(info.value) and words in str(info.value)


def test_decode_csv_semantics():
    cols = decode_csv(
        np.array([["1,2.5,x", ",,"], ['3,"4.5","y,z"', "7,1e3,"]]), [[9], [0.0], ["d"]]
    )
    assert cols[0].tolist() == [[1, 9], [3, 7]] and cols[0].dtype == np.int32
    np.testing.assert_array_equal(cols[1], np.float32([[2.5, 0.0], [4.5, 1000.0]]))
    assert cols[2].tolist() == [["x", "d"], ["y,z", "d"]]
    with pytest.raises(DecodeCSVError, match="record 1, column 1: field '4,5' is not a valid"):
        decode_csv(["1,2,y", '1,"4,5",y'], [[0], [0.0], ["d"]])
    with pytest.raises(DecodeCSVError, match="expected 3 fields, got 4"):  # no quote handling
        decode_csv('1,"4,5",y', [[0], [0.0], ["d"]], use_quote_delim=False)
    # required column, select_cols, na_value, delimiter, scalars
    with pytest.raises(DecodeCSVError, match="record 1, column 0: the field is empty"):
        decode_csv(["1", ""], [np.array([], np.int64)])
    a, c = decode_csv("5;x;NA", [[0], [1.5]], field_delim=";", select_cols=[0, 2], na_value="NA")
    assert (a, c) == (5, np.float32(1.5)) and isinstance(a, np.int32)
    with pytest.raises(DecodeCSVError, match="at least 3 fields"):
        decode_csv("5;x", [[0], [1.5]], field_delim=";", select_cols=[0, 2])
    with pytest.raises(DecodeCSVError, match="out of range for int32"):
        decode_csv("99999999999", [[0]])
    assert decode_csv("99999999999", [np.int64(0)])[0] == 99999999999


def test_list_files(tmp_path):
    paths = write_shards(tmp_path, shards=6, rows=1)
    names = sorted(str(p) for p in paths)
    assert list(Dataset.list_files(str(tmp_path / "*.csv-*"), shuffle=False)) == names
    shuffled = Dataset.list_files(str(tmp_path / "*.csv-*"), seed=2)
    first, second = list(shuffled), list(shuffled)
    assert sorted(first) == names and first != names and first != second
    both = Dataset.list_files([str(paths[0]), str(tmp_path / "train.csv-0[0-2]")], shuffle=False)
    assert list(both) == names[:3]
    with pytest.raises(InvalidInputError, match="no files matched pattern '.*nothing-\\*'"):
        Dataset.list_files(str(tmp_path / "nothing-*"))


def test_compressed_text_and_missing_file(tmp_path):
    text = "a,1\nb,2\nc,3"  # no final newline: the last line still counts
    (tmp_path / "t.gz").write_bytes(gzip.compress(text.encode()))
    (tmp_path / "t.z").write_bytes(zlib.compress(text.encode()))
    (tmp_path / "t.txt").write_text(text.replace("\n", "\r\n"))
    want = ["a,1", "b,2", "c,3"]
    assert list(TextLineDataset(str(tmp_path / "t.gz"), compression_type="GZIP")) == want
    assert list(TextLineDataset(str(tmp_path / "t.z"), "ZLIB", buffer_size=7)) == want
    assert list(TextLineDataset(str(tmp_path / "t.txt"))) == want
    with pytest.raises(data.DataFileError, match="cannot open"):
        list(TextLineDataset(str(tmp_path / "missing.txt")))
    with pytest.raises(InvalidInputError, match="compression_type"):
        TextLineDataset(str(tmp_path / "t.txt"), compression_type="BZ2")


def test_transformations_match_python():
    xs = list(range(23))
    assert [int(v) for v in Dataset.range(23).take(5)] == xs[:5]
    assert [int(v) for v in Dataset.range(23).skip(20)] == xs[20:]
    assert list(Dataset.range(23).take(-1)) == xs and list(Dataset.range(23).skip(-1)) == []
    for k in range(3):
        assert [int(v) for v in Dataset.range(23).shard(3, k)] == xs[k::3]
    assert [int(v) for v in Dataset.range(5).repeat(3)] == list(range(5)) * 3
    forever = Dataset.range(3).repeat()
    assert [int(v) for v in forever.take(10)] == [0, 1, 2] * 3 + [0]
    assert list(Dataset.range(0).repeat()) == []
    assert [b.tolist() for b in Dataset.range(7).batch(3)] == [[0, 1, 2], [3, 4, 5], [6]]
    assert [b.tolist() for b in Dataset.range(7).batch(3, drop_remainder=True)] == [
        [0, 1, 2],
        [3, 4, 5],
    ]
    assert [int(v) for v in Dataset.range(7).batch(3).unbatch()] == list(range(7))
    assert [int(v) for v in Dataset.range(10).filter(lambda v: v % 4 == 1)] == [1, 5, 9]
    assert [int(v) for v in Dataset.range(3).concatenate(Dataset.range(2))] == [0, 1, 2, 0, 1]


def tf_interleave_reference(inputs, cycle, block):
    """TensorFlow's InterleaveDataset (interleave_dataset_op.cc), one element at a time."""
    inputs, slots = iter(inputs), [None] * cycle
    index = taken = 0
    end_of_input, out = False, []
    while not end_of_input or any(s is not None for s in slots):
        if slots[index] is not None:
            value = next(slots[index], None)
            if value is not None:
                out.append(value)
                taken += 1
                if taken == block:
                    index, taken = (index + 1) % cycle, 0
                continue
            slots[index] = None
            index, taken = (index + 1) % cycle, 0
        elif not end_of_input:
            nxt = next(inputs, None)
            if nxt is None:
                end_of_input = True
            else:
                slots[index] = iter(nxt)
        else:
            index, taken = (index + 1) % cycle, 0
    return out


@pytest.mark.parametrize("parallel", [None, 2])
@pytest.mark.parametrize("cycle,block", [(1, 1), (3, 1), (2, 4), (4, 3), (8, 2)])
def test_interleave_is_tensorflows_order(cycle, block, parallel):
    lengths = [3000, 0, 17, 2500, 1, 64, 999, 5, 2048, 0, 300]
    inner = [list(range(1000 * 100 * k, 1000 * 100 * k + n)) for k, n in enumerate(lengths)]
    want = tf_interleave_reference(inner, cycle, block)
    ds = Dataset.range(len(lengths)).interleave(
        lambda k: Dataset.from_tensor_slices(np.array(inner[int(k)], dtype=np.int64)),
        cycle_length=cycle,
        block_length=block,
        num_parallel_calls=parallel,
    )
    assert [int(v) for v in ds] == want
    batched = np.concatenate(list(ds.batch(100))).tolist()
    assert batched == want


def test_parallel_reads_interleave_lines(tmp_path):
    paths = []
    for k, n in enumerate([500, 20, 700, 0, 90]):
        path = tmp_path / f"part-{k}.txt"
        path.write_text("".join(f"{k}:{i}\n" for i in range(n)))
        paths.append(str(path))
    lines = [[f"{k}:{i}" for i in range(n)] for k, n in enumerate([500, 20, 700, 0, 90])]
    got = list(TextLineDataset(paths, num_parallel_reads=3))
    assert got == tf_interleave_reference(lines, 3, 1)
    assert list(TextLineDataset(paths, num_parallel_reads=AUTOTUNE).batch(64).unbatch()) != []
    good = tmp_path / "good.csv"
    good.write_text("".join(f"{i},{i}\n" for i in range(100)))
    bad = tmp_path / "bad.csv"
    bad.write_text("1,2\n3\n")
    ds = TextLineDataset([str(good), str(bad)], num_parallel_reads=2).map(
        lambda r: decode_csv(r, [[0], [0]])
    )
    with pytest.raises(CSVRecordError) as info:
        list(ds)
    assert (info.value.file, info.value.line) == (str(bad), 2)
    with pytest.raises(InvalidInputError, match="num_parallel_reads"):
        TextLineDataset(paths, num_parallel_reads=0)


def test_nested_batches_and_structures():
    nested = list(Dataset.range(8).batch(2).batch(2))
    assert [n.tolist() for n in nested] == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    with pytest.raises(InvalidInputError, match="different shapes"):  # as TensorFlow
        list(Dataset.range(7).batch(2).batch(2))
    ds = Dataset.from_tensor_slices(
        ({"a": np.arange(6), "b": np.arange(12).reshape(6, 2)}, np.arange(6) * 10)
    )
    (f, y), *_ = list(ds.batch(4))
    assert (
        f["a"].tolist() == [0, 1, 2, 3] and f["b"].shape == (4, 2) and y.tolist() == [0, 10, 20, 30]
    )
    zipped = list(Dataset.zip((Dataset.range(3), Dataset.from_tensor_slices(["x", "y", "z", "w"]))))
    assert [(int(a), str(b)) for a, b in zipped] == [(0, "x"), (1, "y"), (2, "z")]
    gen = Dataset.from_generator(
        lambda: ((i, [i, i]) for i in range(5)), output_types=(np.float32, np.int64)
    )
    first = next(iter(gen.batch(5)))
    assert first[0].dtype == np.float32 and first[1].shape == (5, 2)
    with pytest.raises(InvalidInputError, match="output_shapes"):
        list(Dataset.from_generator(lambda: iter([[1, 2]]), output_shapes=(3,)))
    batches = Dataset.from_batches(lambda: ({"k": np.arange(i * 3, i * 3 + 3)} for i in range(3)))
    assert [int(e["k"]) for e in batches] == list(range(9))
    with pytest.raises(InvalidInputError, match="first dimensions differ"):
        Dataset.from_tensor_slices({"a": np.arange(3), "b": np.arange(4)})
    with pytest.raises(InvalidInputError, match="different shapes"):
        list(Dataset.from_generator(lambda: iter([[1, 2], [1, 2, 3]])).batch(2))


def test_one_shot_iterator_and_map_arguments():
    ds = Dataset.from_tensor_slices((np.arange(4), np.arange(4) * 2)).map(lambda a, b: a + b)
    it = ds.make_one_shot_iterator()
    assert [int(it.get_next()) for _ in range(4)] == [0, 3, 6, 9]
    with pytest.raises(data.dataset.OutOfRangeError):
        it.get_next()


def test_prefetch_raises_in_the_consumer_and_stops_when_abandoned():
    def boom(v):
        if v == 40:
            raise ValueError("bad element 40")
        return v

    with pytest.raises(ValueError, match="bad element 40"):
        list(Dataset.range(100).map(boom).prefetch(3))
    before = threading.active_count()
    for _ in range(5):
        it = iter(Dataset.range(10**6).batch(10).prefetch(2))
        next(it)
        it.close()
    from tests.polling import until

    assert until(lambda: threading.active_count() <= before, timeout=5)


def test_norm_dataset_gives_what_was_written(tmp_path, make_records):
    rng = np.random.default_rng(3)
    records = make_records(rng, 300, 1, 4, 5, 1, True)
    path = write_norm_file(tmp_path / "part0.data", records)
    file_list = write_file_list(tmp_path / "file_list.txt", [str(path)])
    one_hot = [DataReaderSparseParam("data1", 1, True, 5)]
    ds = NormDataset(str(file_list), 1, 4, one_hot, check_type="Sum")
    got = list(ds.batch(128))
    assert [len(y) for _, y in got] == [128, 128, 44]
    features = {k: np.concatenate([f[k] for f, _ in got]) for k in ("dense", "data1")}
    np.testing.assert_array_equal(features["dense"], records.dense)
    np.testing.assert_array_equal(np.concatenate([y for _, y in got]), records.label)
    np.testing.assert_array_equal(features["data1"], records.keys.reshape(300, 5))
    multi = make_records(rng, 50, 1, 2, 3, 2, False)
    path = write_norm_file(tmp_path / "m.data", multi)
    fl = write_file_list(tmp_path / "m.txt", [str(path)])
    ds = NormDataset(str(fl), 1, 2, [DataReaderSparseParam("s", 2, False, 3)], check_type="Sum")
    keys = np.concatenate([f["s"] for f, _ in ds.batch(20)])
    assert keys.shape == (50, 3, 2)
    counts = multi.counts()
    np.testing.assert_array_equal((keys >= 0).sum(axis=2), counts)
    np.testing.assert_array_equal(keys[keys >= 0], multi.keys)


def test_one_record_decodes_as_in_a_batch():
    """decode_csv of one str (Python parsing) equals the same record decoded in an array."""
    records = [
        "1,2.5,x,7",
        ",,,",
        '3,"4.5","y,z",-2',
        "7,1e3,,2147483647",
        " 8 , -0.25 ,a b,NA",
        "9,inf,\u00e9,0",
    ]
    defaults = [[5], [0.0], ["d"], np.array([1], dtype=np.int64)]
    batch = decode_csv(np.array(records), defaults, na_value="NA")
    for i, record in enumerate(records):
        one = decode_csv(record, defaults, na_value="NA")
        for col, value in zip(batch, one):
            assert type(value) is type(col[i]) and value == col[i], (record, value, col[i])
    for bad in ["1,2,x", "1,x,y,2", "99999999999,1,a,1", '1,"2,a,1']:
        with pytest.raises(DecodeCSVError) as one:
            decode_csv(bad, defaults)
        with pytest.raises(DecodeCSVError) as many:
            decode_csv(np.array(["1,1,a,1", bad]), defaults)
        assert many.value.record == 1 and one.value.column == many.value.column
        assert one.value.problem.split(":")[0] == many.value.problem.split(":")[0]


@pytest.mark.parametrize("fmt", ["Raw", "Parquet"])
def test_raw_and_parquet_datasets_give_what_the_generator_wrote(tmp_path, fmt):
    from tierserve.trainer.data import (
        DataGenerator,
        DataGeneratorParams,
        ParquetDataset,
        RawDataset,
    )
    from tierserve.trainer.data.records import Records

    if fmt == "Parquet":
        pytest.importorskip("pyarrow")
    slots = [50, 7, 300]
    source = tmp_path / ("train.bin" if fmt == "Raw" else "train/_file_list.txt")
    params = DataGeneratorParams(
        format=fmt,
        label_dim=1,
        dense_dim=2,
        num_slot=len(slots),
        i64_input_key=False,
        source=str(source),
        eval_source=str(tmp_path / ("test.bin" if fmt == "Raw" else "val/_file_list.txt")),
        slot_size_array=slots,
        num_files=2,
        eval_num_files=1,
        num_samples_per_file=150,
        num_samples=300,
        eval_num_samples=10,
        seed=3,
    )
    generator = DataGenerator(params)
    generated = generator.generate()
    if fmt == "Raw":
        want = generator.expected_records("train")
    else:
        want = Records.concat([generator.expected_records("train", i) for i in range(2)])
    kind = RawDataset if fmt == "Raw" else ParquetDataset
    ds = kind(
        generated.train.source,
        1,
        2,
        [DataReaderSparseParam("data1", 1, True, len(slots))],
        slot_size_array=generated.reader_slot_size_array,
        float_label_dense=False,
    )
    got = list(ds.shuffle(64, seed=1).batch(100))
    assert [len(y) for _, y in got] == [100, 100, 100]
    dense = np.concatenate([f["dense"] for f, _ in got])
    keys = np.concatenate([f["data1"] for f, _ in got])
    label = np.concatenate([y for _, y in got])
    # the same rows in another order: compare rows sorted the same way
    rows = np.column_stack([keys, dense, label]).astype(np.float64)
    want_rows = np.column_stack([want.keys.reshape(300, len(slots)), want.dense, want.label])
    np.testing.assert_allclose(
        rows[np.lexsort(rows.T[::-1])], want_rows[np.lexsort(want_rows.T[::-1])], rtol=1e-6
    )
    assert not np.array_equal(rows, want_rows)  # shuffled


_OPS = st.one_of(
    st.tuples(st.just("take"), st.integers(-1, 40)),
    st.tuples(st.just("skip"), st.integers(-1, 40)),
    st.tuples(st.just("shard"), st.integers(1, 4), st.integers(0, 3)),
    st.tuples(st.just("rebatch"), st.integers(1, 9)),
    st.tuples(st.just("repeat"), st.integers(0, 3)),
    st.tuples(st.just("filter"), st.integers(2, 4)),
    st.tuples(st.just("map"), st.integers(-5, 5)),
    st.tuples(st.just("concat"), st.integers(0, 20)),
    st.tuples(st.just("interleave"), st.integers(1, 4), st.integers(1, 3)),
)


def _apply(op, ds, ref):
    kind = op[0]
    if kind == "take":
        return ds.take(op[1]), ref if op[1] < 0 else ref[: op[1]]
    if kind == "skip":
        return ds.skip(op[1]), [] if op[1] < 0 else ref[op[1] :]
    if kind == "shard":
        n, i = op[1], op[2] % op[1]
        return ds.shard(n, i), ref[i::n]
    if kind == "rebatch":
        return ds.batch(op[1]).unbatch(), ref
    if kind == "repeat":
        return ds.repeat(op[1]), ref * op[1]
    if kind == "filter":
        return ds.filter(lambda v: v % op[1] == 0), [v for v in ref if v % op[1] == 0]
    if kind == "map":
        return ds.map(lambda v: v + op[1]), [v + op[1] for v in ref]
    if kind == "concat":
        return ds.concatenate(Dataset.range(op[1])), ref + list(range(op[1]))
    cycle, block = op[1], op[2]
    out = ds.interleave(lambda v: Dataset.range(v % 5), cycle_length=cycle, block_length=block)
    return out, tf_interleave_reference([list(range(v % 5)) for v in ref], cycle, block)


@settings(max_examples=60, deadline=None, database=None)
@given(n=st.integers(0, 60), ops=st.lists(_OPS, max_size=5), batch=st.integers(1, 16))
def test_random_pipelines_equal_python_lists(n, ops, batch):
    ds, ref = Dataset.range(n), list(range(n))
    for op in ops:
        ds, ref = _apply(op, ds, ref)
    assert [int(v) for v in ds] == ref
    batches = [b.tolist() for b in ds.batch(batch)]
    assert batches == [ref[i : i + batch] for i in range(0, len(ref), batch)]


@settings(max_examples=60, deadline=None, database=None)
@given(
    n=st.integers(0, 300), size=st.integers(1, 60), batch=st.integers(1, 40), seed=st.integers(0, 9)
)
def test_shuffle_equals_tensorflows_algorithm_for_any_sizes(n, size, batch, seed):
    got = [int(v) for b in Dataset.range(n).shuffle(size, seed=seed).batch(batch) for v in b]
    assert got == tf_shuffle_reference(list(range(n)), size, seed, batch)
