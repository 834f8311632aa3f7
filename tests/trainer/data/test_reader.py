import threading
import warnings

import numpy as np
import pytest

from tierserve.core.errors import ConfigError
from tierserve.trainer.data import (
    Check_t,
    DataFileError,
    DataGenerator,
    DataGeneratorParams,
    DataReader,
    DataReaderParams,
    DataReaderSparseParam,
    DataReaderType_t,
    create_data_reader,
    read_file_list,
)
from tierserve.trainer.data.norm import write_norm_file
from tierserve.trainer.data.records import Records

SLOTS = [50, 7, 300, 1000]
NUM_FILES, PER_FILE = 3, 200


def generate(tmp_path, fmt, nnz=(), variable=False, i64=False, check=Check_t.Sum):
    if fmt == "Parquet":
        pytest.importorskip("pyarrow")
    base = tmp_path / fmt
    source, eval_source = {
        "Norm": (base / "file_list.txt", base / "file_list_test.txt"),
        "Parquet": (base / "train" / "_file_list.txt", base / "val" / "_file_list.txt"),
        "Raw": (base / "train.bin", base / "test.bin"),
    }[fmt]
    params = DataGeneratorParams(
        format=fmt,
        label_dim=1,
        dense_dim=3,
        num_slot=len(SLOTS),
        i64_input_key=i64,
        source=str(source),
        eval_source=str(eval_source),
        slot_size_array=SLOTS,
        nnz_array=list(nnz),
        check_type=check,
        num_files=NUM_FILES,
        eval_num_files=1,
        num_samples_per_file=PER_FILE,
        num_samples=NUM_FILES * PER_FILE,
        eval_num_samples=PER_FILE,
        variable_nnz=variable,
        seed=7,
    )
    generator = DataGenerator(params)
    return generator, generator.generate()


def expected(generator, split="train"):
    if generator.params.format is DataReaderType_t.Raw:
        return generator.expected_records(split)
    files = NUM_FILES if split == "train" else 1
    return Records.concat([generator.expected_records(split, i) for i in range(files)])


def reader_params(dataset, slot_size_array=None, check=Check_t.Sum):
    return DataReaderParams(
        data_reader_type=dataset.format,
        source=[dataset.train.source],
        eval_source=dataset.eval.source,
        check_type=check,
        slot_size_array=dataset.reader_slot_size_array
        if slot_size_array is None
        else slot_size_array,
        # the generator writes Raw labels and dense values as int32 unless told otherwise,
        # the reader reads them as float32 unless told otherwise (both HugeCTR's defaults)
        float_label_dense=False,
    )


def sparse(nnz=None, fixed=True):
    return [DataReaderSparseParam("data1", nnz or 1, fixed, len(SLOTS))]


CASES = [
    ("Norm", (), False, False),
    ("Norm", (1, 3, 2, 1), True, True),
    ("Norm", (2, 2, 2, 2), False, False),
    ("Norm", (1, 3, 2, 1), False, False),
    ("Parquet", (), False, True),
    ("Parquet", (1, 3, 2, 1), True, True),
    ("Raw", (), False, False),
]


@pytest.mark.parametrize("fmt,nnz,variable,i64", CASES)
def test_reads_back_what_the_generator_wrote(tmp_path, from_batches, fmt, nnz, variable, i64):
    generator, dataset = generate(tmp_path, fmt, nnz, variable, i64)
    nnz_list = list(nnz) if nnz else None
    with create_data_reader(
        reader_params(dataset),
        64,
        1,
        3,
        sparse(nnz_list, not variable),
        i64_input_key=i64,
        chunk_records=50,
        num_workers=2,
    ) as reader:
        batches = list(reader)
        assert reader.is_eof() and reader.read_a_batch() is None
    assert [b.batch_size for b in batches] == [64] * 9 + [600 - 9 * 64]
    got = from_batches(batches, len(SLOTS))
    want = expected(generator)
    assert got.equals(want)
    for b in batches:
        assert b.label.dtype == b.dense.dtype == np.float32 and b.sparse[0].keys.dtype == np.int64
        assert b.sparse[0].row_offsets.dtype == np.int64 and b.sparse[0].row_offsets[0] == 0
    # the keys of slot s lie in [offset_s, offset_s + slot_size_array[s])
    offsets = np.concatenate([[0], np.cumsum(SLOTS)])
    slot_of_key = np.repeat(np.tile(np.arange(len(SLOTS)), len(got)), got.counts().ravel())
    assert (got.keys >= offsets[slot_of_key]).all() and (got.keys < offsets[slot_of_key + 1]).all()
    # the eval split too
    with create_data_reader(
        reader_params(dataset),
        1000,
        1,
        3,
        sparse(nnz_list, not variable),
        i64_input_key=i64,
        eval=True,
    ) as reader:
        assert from_batches(list(reader), len(SLOTS)).equals(expected(generator, "eval"))


@pytest.mark.parametrize("fmt", ["Parquet", "Raw"])
def test_slot_size_array_offsets(tmp_path, from_batches, fmt):
    generator, dataset = generate(tmp_path, fmt)
    with create_data_reader(reader_params(dataset, slot_size_array=[]), 600, 1, 3, sparse()) as r:
        local = from_batches(list(r), len(SLOTS))
    with create_data_reader(reader_params(dataset), 600, 1, 3, sparse()) as r:
        shifted = from_batches(list(r), len(SLOTS))
    shift = np.tile(np.concatenate([[0], np.cumsum(SLOTS)[:-1]]), len(local))
    assert np.array_equal(shifted.keys - local.keys, shift)


def test_key_beyond_slot_size_names_file_record_and_slot(tmp_path):
    generator, dataset = generate(tmp_path, "Raw")
    want = expected(generator)
    small = list(SLOTS)
    small[2] = 3  # slot 2 draws keys from [0, 300)
    first_bad = int(np.argmax(want.keys.reshape(-1, 4)[:, 2] - 50 - 7 >= 3))
    match = r"slot 2: key \d+ is outside \[0, slot_size_array\[2\] = 3\)"
    with (
        create_data_reader(reader_params(dataset, small), 64, 1, 3, sparse()) as reader,
        pytest.raises(DataFileError, match=match) as err,
    ):
        list(reader)
    assert err.value.file == dataset.train.source and err.value.slot == 2
    assert err.value.record == first_bad
    # Norm keys are global already: giving slot_size_array again is caught the same way
    _, norm = generate(tmp_path, "Norm")
    with (
        create_data_reader(reader_params(norm, SLOTS), 64, 1, 3, sparse()) as reader,
        pytest.raises(DataFileError, match="outside") as err,
    ):
        list(reader)
    assert err.value.file == read_file_list(norm.train.source)[0]


def _reading_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("data-reader")}


def test_epoch_and_repeat_modes(tmp_path, from_batches):
    earlier = _reading_threads()  # readers of other tests' models, alive until collected
    generator, dataset = generate(tmp_path, "Norm")
    want = expected(generator)
    with create_data_reader(reader_params(dataset), 256, 1, 3, sparse()) as reader:
        sizes = []
        while not reader.is_eof():
            sizes.append(reader.read_a_batch().batch_size)
        assert sizes == [256, 256, 88]
        assert reader.read_a_batch() is None and reader.is_eof()
    with create_data_reader(
        reader_params(dataset), 256, 1, 3, sparse(), repeat_dataset=True, chunk_records=70
    ) as reader:
        batches = [reader.read_a_batch() for _ in range(7)]  # 1792 samples: 3 passes minus 8
        assert not reader.is_eof()
    assert all(b.batch_size == 256 for b in batches)
    cycled = Records.concat([want, want, want])
    assert from_batches(batches, 4).equals(cycled.slice(0, 1792))
    # closing stops the reading threads (this test's; others' may still be alive)
    assert not _reading_threads() - earlier


def test_set_source_and_is_eof(tmp_path, from_batches):
    generator, dataset = generate(tmp_path, "Norm")
    reader = DataReader(
        "Norm", dataset.train.source, 500, 1, 3, sparse(), check_type="Sum", num_workers=3
    )
    assert not reader.is_eof()
    assert from_batches(list(reader), 4).equals(expected(generator))
    assert reader.is_eof()
    reader.set_source(dataset.eval.source)
    assert not reader.is_eof() and reader.source == [dataset.eval.source]
    assert from_batches(list(reader), 4).equals(expected(generator, "eval"))
    assert reader.is_eof()
    reader.set_source()  # "" restarts the current source
    first = reader.read_a_batch()
    assert first.batch_size == 200 and reader.is_eof()
    reader.close()
    assert reader.read_a_batch() is None


def test_a_list_of_sources_is_read_in_order(tmp_path, from_batches):
    generator, dataset = generate(tmp_path, "Norm")
    train, evals = expected(generator), expected(generator, "eval")
    sources = [dataset.eval.source, dataset.train.source]
    with DataReader("Norm", sources, 128, 1, 3, sparse(), check_type="Sum") as reader:
        assert from_batches(list(reader), 4).equals(Records.concat([evals, train]))


def test_several_sparse_inputs_split_the_slots(tmp_path):
    generator, dataset = generate(tmp_path, "Norm", (1, 3, 2, 1), variable=True)
    want = expected(generator)
    params = [
        DataReaderSparseParam("wide", 1, True, 1),
        DataReaderSparseParam("deep", [3, 2, 1], False, 3),
    ]
    with create_data_reader(reader_params(dataset), 600, 1, 3, params) as reader:
        (batch,) = list(reader)
    wide, deep = batch.sparse
    assert (wide.slot_num, deep.slot_num) == (1, 3) and wide.batch_size == deep.batch_size == 600
    for got, (a, b) in ((wide, (0, 1)), (deep, (1, 4))):
        keys, offsets = want.select_slots(a, b)
        assert np.array_equal(got.keys, keys) and np.array_equal(got.row_offsets, offsets)


def test_nnz_limits(tmp_path):
    _, dataset = generate(tmp_path, "Norm", (1, 3, 2, 1), variable=True)
    for params, match in [
        (sparse([1, 2, 2, 1], False), r"slot 1: 3 keys, but sparse input 'data1' allows at most 2"),
        (sparse([1, 2, 2, 1], True), r"slot 1: 3 keys, but sparse input 'data1' allows at most 2"),
        (sparse(1, False), r"more than nnz_per_slot \* slot_num = 4"),
        (sparse(1, True), r"more than nnz_per_slot \* slot_num = 4"),
    ]:
        with (
            create_data_reader(reader_params(dataset), 64, 1, 3, params) as reader,
            pytest.raises(DataFileError, match=match),
        ):
            list(reader)


def test_errors_surface_in_order_from_the_workers(tmp_path):
    generator, dataset = generate(tmp_path, "Norm")
    files = read_file_list(dataset.train.source)
    with open(files[1], "r+b") as f:  # truncate the second file
        f.truncate(f.seek(0, 2) - 10)
    with create_data_reader(reader_params(dataset), 100, 1, 3, sparse(), num_workers=3) as reader:
        got = [reader.read_a_batch() for _ in range(2)]
        assert sum(b.batch_size for b in got) == 200  # all of file 0 arrives first
        with pytest.raises(DataFileError, match="truncated") as err:
            list(reader)
    assert err.value.file == files[1] and err.value.record == PER_FILE - 1
    assert reader.read_a_batch() is None


def test_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="one-hot"):
        DataReader("Raw", "x.bin", 8, 1, 1, [DataReaderSparseParam("d", 2, True, 1)])
    with pytest.raises(ConfigError, match="slot_size_array has 2 entries"):
        DataReader("Norm", "x.txt", 8, 1, 1, sparse(), slot_size_array=[1, 2])
    with pytest.raises(ConfigError, match="no eval_source"):
        create_data_reader(
            DataReaderParams(data_reader_type="Norm", source="a.txt"), 8, 1, 1, sparse(), eval=True
        )
    with pytest.raises(DataFileError, match="file list does not exist"):
        DataReader("Norm", tmp_path / "none.txt", 8, 1, 1, sparse()).read_a_batch()
    (tmp_path / "bad.txt").write_text("3\na.data\n")
    with pytest.raises(DataFileError, match="first line says 3 files but 1 paths follow"):
        DataReader("Norm", tmp_path / "bad.txt", 8, 1, 1, sparse()).read_a_batch()


def test_a_file_list_as_hugectr_generator_writes_it(tmp_path, monkeypatch, make_records):
    """HugeCTR's DataGenerator (v3.9 on) lists each Norm file twice, with paths relative to
    where it ran; HugeCTR's FileList takes the count's worth, so each file is read once."""
    monkeypatch.chdir(tmp_path)
    records = make_records(np.random.default_rng(0), 10, 1, 3, 4, 1, True)
    for i in range(2):
        write_norm_file(tmp_path / "d" / "train" / f"gen_{i}.data", records, Check_t.Sum)
    names = "./d/train/gen_0.data\n./d/train/gen_1.data\n"
    (tmp_path / "d" / "file_list.txt").write_text("2\n" + names + names)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        files = read_file_list("./d/file_list.txt")
    assert files == ["d/train/gen_0.data", "d/train/gen_1.data"]
    with DataReader("Norm", "./d/file_list.txt", 64, 1, 3, sparse(),
                    check_type="Sum") as reader:
        assert sum(b.batch_size for b in reader) == 20
    (tmp_path / "d" / "other.txt").write_text("1\n" + names)
    with pytest.warns(UserWarning, match="the 1 lines after them are ignored"):
        assert read_file_list(tmp_path / "d" / "other.txt") == ["d/train/gen_0.data"]


@pytest.mark.parametrize("nnz", [[1, 3, 2, 1], 3])
def test_is_fixed_length_takes_slots_with_fewer_keys(tmp_path, nnz):
    """nnz_per_slot is a maximum, is_fixed_length or not (HugeCTR's flag only selects a faster
    copy): Criteo W&D scripts declare wide_data with 30 keys per slot and fixed length."""
    generator, dataset = generate(tmp_path, "Norm", (1, 3, 2, 1), variable=True)
    got = {}
    for fixed in (True, False):
        with create_data_reader(reader_params(dataset), 128, 1, 3, sparse(nnz, fixed)) as reader:
            got[fixed] = [(b.sparse[0].keys, b.sparse[0].row_offsets) for b in reader]
    want = expected(generator)
    keys = np.concatenate([k for k, _ in got[True]])
    assert np.array_equal(keys, want.keys[: len(keys)]) and len(keys) == len(want.keys)
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(got[True], got[False]))
