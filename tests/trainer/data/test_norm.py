import struct
import warnings

import numpy as np
import pytest
from hugectr_layout import Sample, norm_bytes, norm_header, parse_norm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tierserve.trainer.data import Check_t, DataFileError
from tierserve.trainer.data.norm import (
    FRAMED_HEADER_SIZE,
    LegacyNormHeaderWarning,
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
    """One record, checksum mode, 32-bit keys, byte for byte as HugeCTR's DataWriter<Sum>
    writes it: the header is a frame of its own ([int32 64][64 bytes][byte sum])."""
    label, dense = np.float32(1.0), np.float32(0.5)
    records = Records(
        np.array([[label]]), np.array([[dense]]), np.array([7, 8, 9]), np.array([0, 1, 3]), 2
    )
    path = tmp_path / "one.data"
    write_norm_file(path, records, Check_t.Sum, i64_input_key=False)
    raw = path.read_bytes()
    header = np.array([1, 1, 1, 1, 2, 0, 0, 0], "<i8").tobytes()
    assert raw[:FRAMED_HEADER_SIZE] == b"\x40\0\0\0" + header + bytes([sum(header) % 256])
    payload = (
        label.tobytes()
        + dense.tobytes()
        + np.array([1, 7], "<i4").tobytes()
        + np.array([2], "<i4").tobytes()
        + np.array([8, 9], "<u4").tobytes()
    )
    expected = np.int32(len(payload)).tobytes() + payload + bytes([sum(payload) % 256])
    assert raw[FRAMED_HEADER_SIZE:] == expected


def test_exact_byte_layout_without_checksums(tmp_path):
    """Check_t.Non: the bare 64-byte header, then the bare record."""
    records = Records(np.array([[0.0]], np.float32), np.zeros((1, 0), np.float32),
                      np.array([5]), np.array([0, 1]), 1)
    path = write_norm_file(tmp_path / "one.data", records, Check_t.Non, i64_input_key=True)
    assert path.read_bytes() == (np.array([0, 1, 1, 0, 1, 0, 0, 0], "<i8").tobytes()
                                 + bytes(4) + np.array([1], "<i4").tobytes()
                                 + np.array([5], "<i8").tobytes())


def _samples(records: Records) -> list[Sample]:
    counts, out, at = records.counts(), [], 0
    keys = records.keys.tolist()
    for i in range(len(records)):
        slots = []
        for c in counts[i].tolist():
            slots.append(keys[at : at + c])
            at += c
        out.append(Sample(records.label[i].tolist(), records.dense[i].tolist(), slots))
    return out


_layout_cases = dict(
    n=st.integers(0, 25),
    label_dim=st.integers(1, 2),
    dense_dim=st.integers(0, 3),
    slot_num=st.integers(1, 4),
    max_nnz=st.integers(0, 3),
    check=st.sampled_from([Check_t.Sum, Check_t.Non]),
    i64=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(**_layout_cases)
def test_hugectr_layout_both_ways(
    tmp_path, make_records, n, label_dim, dense_dim, slot_num, max_nnz, check, i64, seed
):
    """HugeCTR's layout, written from its DataWriter in the test, reads back; our writer's
    bytes are exactly those bytes and HugeCTR's CheckSum / CheckNone reader parses them."""
    rng = np.random.default_rng(seed)
    records = make_records(rng, n, label_dim, dense_dim, slot_num, max_nnz, False,
                           2**63 if i64 else 2**32)
    check_sum = check is Check_t.Sum
    theirs = norm_bytes(_samples(records), label_dim, dense_dim, slot_num, check_sum, i64)
    path = tmp_path / f"{seed}.data"
    path.write_bytes(theirs)
    assert read_all(path, records, check, i64).equals(records) if n else not list(
        iter_norm_file(path, label_dim, dense_dim, slot_num, check, i64))
    write_norm_file(path, records, check, i64)
    ours = path.read_bytes()
    assert ours == theirs
    header, samples = parse_norm(ours, check_sum, slot_num, i64)
    assert header == (int(check_sum), n, label_dim, dense_dim, slot_num, 0, 0, 0)
    assert [s.slots for s in samples] == [s.slots for s in _samples(records)]
    assert np.array_equal(np.array([s.label for s in samples], np.float32).reshape(n, label_dim),
                          records.label)


def test_a_file_as_criteo2hugectr_writes_it_is_read(tmp_path):
    """criteo2hugectr (Check_t::Sum, uint32 keys, W&D: a wide slot of 2 keys, then 26 one-key
    slots) wrote files tierserve refused with 'field error_check: header says 4294967360'."""
    rng = np.random.default_rng(4)
    samples = [Sample([float(i % 2)], rng.random(13).tolist(),
                      [rng.integers(0, 2**32, 2).tolist()]
                      + [[int(k)] for k in rng.integers(0, 2**32, 26)]) for i in range(300)]
    path = tmp_path / "train0.data"
    path.write_bytes(norm_bytes(samples, 1, 13, 27, True, False))
    assert read_norm_header(path)["error_check"] == 1
    [(first, got)] = list(iter_norm_file(path, 1, 13, 27, Check_t.Sum, False, chunk_records=512))
    assert first == 0 and len(got) == 300
    assert got.keys.tolist() == [k for s in samples for slot in s.slots for k in slot]
    assert np.array_equal(got.dense, np.array([s.dense for s in samples], np.float32))


def test_files_with_the_bare_header_of_older_tierserve_still_read_with_a_warning(
    tmp_path, make_records
):
    records = make_records(np.random.default_rng(3), 20, 1, 2, 3, 2, False)
    framed = norm_bytes(_samples(records), 1, 2, 3, True, False)
    path = tmp_path / "old.data"
    path.write_bytes(norm_header(True, 20, 1, 2, 3) + framed[FRAMED_HEADER_SIZE:])
    with pytest.warns(LegacyNormHeaderWarning, match="HugeCTR cannot read it"):
        assert read_all(path, records, Check_t.Sum, False).equals(records)
    with warnings.catch_warnings():  # once per folder
        warnings.simplefilter("error")
        read_all(path, records, Check_t.Sum, False)


def test_header_checksum_and_garbage_header_are_named(tmp_path, make_records):
    records = make_records(np.random.default_rng(3), 5, 1, 2, 3, 2, False)
    path = write_norm_file(tmp_path / "f.data", records, Check_t.Sum, False)
    raw = bytearray(path.read_bytes())
    raw[4 + 8] ^= 1  # number_of_records, inside the header's frame
    path.write_bytes(bytes(raw))
    with pytest.raises(DataFileError, match="header checksum mismatch"):
        read_all(path, records, Check_t.Sum, False)
    path.write_bytes(struct.pack("<q", 7) + bytes(80))
    with pytest.raises(DataFileError, match="not a Norm header"):
        read_all(path, records, Check_t.Sum, False)


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
    pos = FRAMED_HEADER_SIZE + int(sizes[:17].sum()) + 4
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
    with pytest.raises(DataFileError, match="error_check.*set check_type=Check_t.Sum"):
        read_all(path, records, Check_t.Non, False)
    records, non = _dataset(tmp_path / "non", make_records, True, Check_t.Non)
    with pytest.raises(DataFileError, match="error_check.*set check_type=Check_t.Non"):
        read_all(non, records, Check_t.Sum, False)
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
    keys = int(records.row_offsets[-1])
    start = time.perf_counter()
    got = read_all(path, records, Check_t.Sum, True, chunk=4096)
    elapsed = time.perf_counter() - start
    assert got.equals(records)
    # Against the cheapest Python loop with one iteration per key, timed beside it (so a
    # loaded machine slows both): decoding takes 5-8 such loops here; doing any work per key
    # in Python would take far more.
    start = time.perf_counter()
    for _ in range(keys):
        pass
    python_loop = time.perf_counter() - start
    assert elapsed < 25 * python_loop, (elapsed, python_loop)


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
