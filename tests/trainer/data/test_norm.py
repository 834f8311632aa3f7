import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tierserve.trainer.data import Check_t, DataFileError
from tierserve.trainer.data.norm import (
    HEADER_SIZE,
    iter_norm_file,
    read_norm_header,
    write_norm_file,
)
from tierserve.trainer.data.records import Records


def read_all(path, records, check, i64, chunk=7):
    parts = list(
        iter_norm_file(
            path,
            records.label.shape[1],
            records.dense.shape[1],
            records.slot_num,
            check,
            i64,
            chunk,
        )
    )
    assert [first for first, _ in parts] == list(range(0, len(records), chunk))
    return Records.concat([r for _, r in parts])


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    n=st.integers(1, 40),
    label_dim=st.integers(1, 2),
    dense_dim=st.integers(0, 3),
    slot_num=st.integers(1, 4),
    max_nnz=st.integers(0, 3),
    fixed=st.booleans(),
    check=st.sampled_from([Check_t.Sum, Check_t.Non]),
    i64=st.booleans(),
    chunk=st.integers(1, 50),
    seed=st.integers(0, 2**32 - 1),
)
def test_round_trip(
    tmp_path,
    make_records,
    n,
    label_dim,
    dense_dim,
    slot_num,
    max_nnz,
    fixed,
    check,
    i64,
    chunk,
    seed,
):
    rng = np.random.default_rng(seed)
    high = 2**62 if i64 else 2**32
    records = make_records(rng, n, label_dim, dense_dim, slot_num, max_nnz, fixed, high)
    path = tmp_path / f"{seed}.data"
    write_norm_file(path, records, check, i64)
    header = read_norm_header(path)
    assert header == {
        "error_check": int(check is Check_t.Sum),
        "number_of_records": n,
        "label_dim": label_dim,
        "dense_dim": dense_dim,
        "slot_num": slot_num,
    }
    got = read_all(path, records, check, i64, chunk)
    assert got.equals(records)
    assert got.keys.dtype == np.int64


def test_exact_byte_layout(tmp_path):
    """One record, checksum mode, 32-bit keys: the reference's struct layout byte for byte."""
    label, dense = np.float32(1.0), np.float32(0.5)
    records = Records(
        np.array([[label]]), np.array([[dense]]), np.array([7, 8, 9]), np.array([0, 1, 3]), 2
    )
    path = tmp_path / "one.data"
    write_norm_file(path, records, Check_t.Sum, i64_input_key=False)
    raw = path.read_bytes()
    header = np.frombuffer(raw[:HEADER_SIZE], "<i8")
    assert list(header) == [1, 1, 1, 1, 2, 0, 0, 0]
    payload = (
        label.tobytes()
        + dense.tobytes()
        + np.array([1, 7], "<i4").tobytes()
        + np.array([2], "<i4").tobytes()
        + np.array([8, 9], "<u4").tobytes()
    )
    expected = np.int32(len(payload)).tobytes() + payload + bytes([sum(payload) % 256])
    assert raw[HEADER_SIZE:] == expected


def _dataset(tmp_path, make_records, fixed, check=Check_t.Sum, n=50):
    records = make_records(np.random.default_rng(1), n, 1, 2, 3, 2, fixed)
    path = tmp_path / "d.data"
    write_norm_file(path, records, check, False)
    return records, path


@pytest.mark.parametrize("fixed", [True, False])
def test_checksum_failure_names_file_and_record(tmp_path, make_records, fixed):
    records, path = _dataset(tmp_path, make_records, fixed)
    raw = bytearray(path.read_bytes())
    # flip a byte in the label of record 17
    sizes = 4 + 4 * 3 + 4 * 3 + 4 * records.counts().sum(axis=1) + 1
    pos = HEADER_SIZE + int(sizes[:17].sum()) + 4
    raw[pos] ^= 0x40
    path.write_bytes(bytes(raw))
    with pytest.raises(DataFileError, match="checksum mismatch") as err:
        read_all(path, records, Check_t.Sum, False, chunk=1000)
    assert err.value.file == str(path) and err.value.record == 17
    assert str(path) in str(err.value) and "record 17" in str(err.value)


@pytest.mark.parametrize("fixed", [True, False])
@pytest.mark.parametrize("check", [Check_t.Sum, Check_t.Non])
def test_truncated_file(tmp_path, make_records, fixed, check):
    records, path = _dataset(tmp_path, make_records, fixed, check)
    raw = path.read_bytes()
    path.write_bytes(raw[:-3])
    with pytest.raises(DataFileError, match="truncated") as err:
        read_all(path, records, check, False, chunk=16)
    assert err.value.record == 49 and str(path) in str(err.value)
    path.write_bytes(raw[:40])
    with pytest.raises(DataFileError, match="truncated header"):
        read_all(path, records, check, False)


def test_header_mismatch_and_trailing_bytes(tmp_path, make_records):
    records, path = _dataset(tmp_path, make_records, True, Check_t.Sum)
    with pytest.raises(DataFileError, match="error_check"):
        read_all(path, records, Check_t.Non, False)
    with pytest.raises(DataFileError, match="field dense_dim: header says 2, the reader expects 5"):
        list(iter_norm_file(path, 1, 5, 3, Check_t.Sum, False))
    path.write_bytes(path.read_bytes() + b"xyz")
    with pytest.raises(DataFileError, match="3 bytes after the last of its 50 records"):
        read_all(path, records, Check_t.Sum, False)


def test_variable_length_decode_is_vectorised_enough(tmp_path, make_records):
    """Multi-hot records of varying length decode without per-key Python work."""
    import time

    records = make_records(np.random.default_rng(2), 20000, 1, 13, 26, 3, fixed=False)
    path = tmp_path / "v.data"
    write_norm_file(path, records, Check_t.Sum, True)
    start = time.perf_counter()
    got = read_all(path, records, Check_t.Sum, True, chunk=4096)
    elapsed = time.perf_counter() - start
    assert got.equals(records)
    assert elapsed < 1.5  # about 0.1 s unloaded; a per-key Python loop takes many seconds


@pytest.mark.parametrize("i64", [False, True])
def test_the_key_width_a_file_reads_as_is_detected_and_named(tmp_path, make_records, i64):
    """Issue 13: 32-bit Norm files read as 64-bit failed with 'truncated' and no hint."""
    from tierserve.trainer.data.norm import detect_key_bits

    records = make_records(np.random.default_rng(1), 50, 1, 2, 3, 2, False)
    path = write_norm_file(tmp_path / "f.data", records, Check_t.Sum, i64)
    assert detect_key_bits(path, 1, 2, 3, Check_t.Sum) == (64 if i64 else 32)
    with pytest.raises(DataFileError, match=f"reads as {64 if i64 else 32}-bit keys: set "
                       f"i64_input_key={i64}"):
        read_all(path, records, Check_t.Sum, not i64)
