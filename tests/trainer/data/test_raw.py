import struct

import numpy as np
import pytest
from hugectr_layout import raw_bytes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tierserve.trainer.data import DataFileError
from tierserve.trainer.data.raw import iter_raw_file, write_raw_file
from tierserve.trainer.data.records import Records


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    n=st.integers(1, 60),
    label_dim=st.integers(1, 2),
    dense_dim=st.integers(0, 4),
    slot_num=st.integers(1, 5),
    float_label_dense=st.booleans(),
    chunk=st.integers(1, 70),
    seed=st.integers(0, 2**32 - 1),
)
def test_round_trip(tmp_path, n, label_dim, dense_dim, slot_num, float_label_dense, chunk, seed):
    rng = np.random.default_rng(seed)
    label = rng.integers(0, 2, (n, label_dim))
    keys = rng.integers(0, 2**31, (n, slot_num))
    if float_label_dense:
        dense = rng.standard_normal((n, dense_dim)).astype(np.float32)
        expected_dense = dense
    else:
        dense = rng.integers(0, 10**6, (n, dense_dim))
        expected_dense = np.log1p(dense.astype(np.float32))
    path = tmp_path / f"{seed}.bin"
    write_raw_file(path, label, dense, keys, float_label_dense)
    assert path.stat().st_size == n * 4 * (label_dim + dense_dim + slot_num)
    parts = list(
        iter_raw_file(str(path), label_dim, dense_dim, slot_num, float_label_dense, 0, chunk)
    )
    got = Records.concat([r for _, r in parts])
    assert np.array_equal(got.label, label.astype(np.float32))
    assert np.array_equal(got.dense, expected_dense)
    assert np.array_equal(got.keys, keys.ravel())
    assert np.array_equal(got.row_offsets, np.arange(n * slot_num + 1))


def test_num_samples_and_truncation(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "t.bin"
    write_raw_file(
        path, rng.integers(0, 2, (10, 1)), rng.integers(0, 9, (10, 2)), rng.integers(0, 5, (10, 3))
    )
    assert sum(len(r) for _, r in iter_raw_file(str(path), 1, 2, 3, False, num_samples=4)) == 4
    with pytest.raises(DataFileError, match="num_samples is 11 but the file holds 10") as err:
        list(iter_raw_file(str(path), 1, 2, 3, False, num_samples=11))
    assert err.value.record == 10
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(DataFileError, match="truncated: the last record has 19 of 24 bytes") as err:
        list(iter_raw_file(str(path), 1, 2, 3, False))
    assert err.value.record == 9 and str(path) in str(err.value)


def test_negative_int_dense_is_an_error(tmp_path):
    path = tmp_path / "neg.bin"
    write_raw_file(
        path, np.zeros((3, 1)), np.array([[1.0], [-2.0], [3.0]], np.float32), np.zeros((3, 1)), True
    )
    # the same bytes read as int32 give a huge negative number for -2.0f
    with pytest.raises(DataFileError, match="negative") as err:
        list(iter_raw_file(str(path), 1, 1, 1, False))
    assert err.value.record == 1 and err.value.field == "dense[0]"


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    n=st.integers(1, 40),
    label_dim=st.integers(1, 2),
    dense_dim=st.integers(0, 4),
    slot_num=st.integers(1, 5),
    float_label_dense=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_hugectr_layout_both_ways(tmp_path, n, label_dim, dense_dim, slot_num,
                                  float_label_dense, seed):
    """HugeCTR's Raw layout written in the test reads back; our writer writes those bytes."""
    rng = np.random.default_rng(seed)
    label = rng.integers(0, 2, (n, label_dim))
    keys = rng.integers(0, 2**31, (n, slot_num))
    dense = (rng.random((n, dense_dim)).astype(np.float32) if float_label_dense
             else rng.integers(0, 10**6, (n, dense_dim)))
    theirs = raw_bytes(label.tolist(), dense.tolist(), keys.tolist(), float_label_dense)
    path = tmp_path / f"{seed}.bin"
    path.write_bytes(theirs)
    got = Records.concat([r for _, r in iter_raw_file(
        str(path), label_dim, dense_dim, slot_num, float_label_dense)])
    assert np.array_equal(got.label, label.astype(np.float32))
    assert np.array_equal(got.dense, dense if float_label_dense
                          else np.log1p(dense.astype(np.float32)))
    assert np.array_equal(got.keys, keys.ravel())
    write_raw_file(path, label, dense, keys, float_label_dense)
    assert path.read_bytes() == theirs


@pytest.mark.parametrize("float_label_dense", [False, True])
def test_values_of_the_other_type_are_refused_naming_the_setting(tmp_path, float_label_dense):
    """The file does not say whether it holds int32 or float32: values that cannot be what
    the setting says are refused (int32 1 read as float is 1.4e-45, float 1.0 read as int is
    1065353216)."""
    n = 50
    labels = [[0]] * 30 + [[1]] * 20  # a first chunk of zeros alone says nothing
    dense = [[0, 0]] * n
    path = tmp_path / "f.bin"
    path.write_bytes(raw_bytes(labels, dense, [[3]] * n, not float_label_dense))
    want = "set float_label_dense=" + ("False" if float_label_dense else "True")
    with pytest.raises(DataFileError, match=want) as err:
        list(iter_raw_file(str(path), 1, 2, 1, float_label_dense, chunk_records=16))
    assert err.value.record == 30 and err.value.field == "label[0]"
    # dense alone gives int32 data away when read as float
    path.write_bytes(raw_bytes([[0]] * n, [[5, 0]] * n, [[3]] * n, False))
    with pytest.raises(DataFileError, match="int32 5; .*float_label_dense=False") as err:
        list(iter_raw_file(str(path), 1, 2, 1, True))
    assert err.value.field == "dense[0]"
    # a float label read as int: its bit pattern, however it is written
    path.write_bytes(struct.pack("<fiI", 0.25, 0, 3))
    with pytest.raises(DataFileError, match="float32 0.25"):
        list(iter_raw_file(str(path), 1, 1, 1, False))
