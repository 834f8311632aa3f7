import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tierserve.core.errors import CorruptModelFileError, InvalidInputError
from tierserve.ps.sparse_file import (
    read_sparse_model,
    sparse_model_name,
    sparse_optimizer_name,
    write_sparse_model,
)

dims = st.sampled_from([1, 2, 7, 16, 512])


@st.composite
def tables(draw):
    dim = draw(dims)
    n = draw(st.integers(0, 40))
    key_dtype = draw(st.sampled_from([np.int32, np.int64]))
    info = np.iinfo(key_dtype)
    keys = draw(
        hnp.arrays(key_dtype, n, elements=st.integers(int(info.min), int(info.max)), unique=True)
    )
    emb = draw(hnp.arrays(np.float32, (n, dim), elements=st.floats(width=32)))
    with_slots = draw(st.booleans())
    slots = np.arange(n, dtype=np.int64) % 26 if with_slots else None
    return keys, emb, slots, dim


@settings(max_examples=60, deadline=None)
@given(tables())
def test_round_trip(tmp_path_factory, table):
    keys, emb, slots, dim = table
    folder = tmp_path_factory.mktemp("sparse") / sparse_model_name("", 0)
    write_sparse_model(folder, keys, emb, slots)
    for mmap in (True, False):
        back = read_sparse_model(folder, dim, key_dtype=keys.dtype, mmap=mmap)
        assert back.keys.dtype == keys.dtype
        np.testing.assert_array_equal(back.keys, keys)
        assert back.embeddings.shape == (len(keys), dim)
        np.testing.assert_array_equal(back.embeddings, emb)
        if slots is None:
            assert back.slot_ids is None
        else:
            np.testing.assert_array_equal(back.slot_ids, slots)
    if len(keys):
        assert read_sparse_model(folder).dim == dim  # inferred from the file sizes
    assert os.path.getsize(folder / "key") == 8 * len(keys)
    assert os.path.getsize(folder / "emb_vector") == 4 * len(keys) * dim


def test_file_bytes_are_little_endian_in_key_order(tmp_path):
    keys = np.array([7, -1, 2**40], dtype=np.int64)
    emb = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], dtype=np.float32)
    write_sparse_model(tmp_path / "t", keys, emb)
    raw_keys = (tmp_path / "t" / "key").read_bytes()
    assert raw_keys == b"".join(int(k).to_bytes(8, "little", signed=True) for k in keys)
    assert (tmp_path / "t" / "emb_vector").read_bytes() == emb.astype("<f4").tobytes()


def test_names():
    assert sparse_model_name("wdl", 1, 2000) == "wdl1_sparse_2000.model"
    assert sparse_optimizer_name("wdl", 0) == "wdl0_opt_sparse_0.model"


def test_rewrite_replaces_whole_folder(tmp_path):
    folder = tmp_path / "t"
    write_sparse_model(folder, np.arange(3), np.ones((3, 2), np.float32), np.zeros(3))
    write_sparse_model(folder, np.arange(5), np.zeros((5, 4), np.float32))
    back = read_sparse_model(folder)
    assert len(back) == 5 and back.dim == 4 and back.slot_ids is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]  # no temp folders left


def test_failed_write_leaves_old_model(tmp_path):
    folder = tmp_path / "t"
    write_sparse_model(folder, np.arange(3), np.ones((3, 2), np.float32))
    with pytest.raises(InvalidInputError, match="slot_ids"):
        write_sparse_model(folder, np.arange(3), np.ones((3, 2), np.float32), np.zeros(2))
    assert len(read_sparse_model(folder)) == 3


def _model(tmp_path, n=4, dim=3):
    folder = tmp_path / "m"
    write_sparse_model(folder, np.arange(n), np.ones((n, dim), np.float32), np.arange(n))
    return folder


def test_truncated_key_file(tmp_path):
    folder = _model(tmp_path)
    with open(folder / "key", "r+b") as f:
        f.truncate(8 * 4 - 3)
    with pytest.raises(CorruptModelFileError, match=r"key has 29 bytes, not a multiple"):
        read_sparse_model(folder)


def test_vector_count_disagrees_with_keys(tmp_path):
    folder = _model(tmp_path)
    with open(folder / "emb_vector", "r+b") as f:
        f.truncate(4 * 3 * 3)  # three rows for four keys
    with pytest.raises(CorruptModelFileError, match="emb_vector holds 9 floats; 4 keys x dim 3"):
        read_sparse_model(folder, 3)
    with pytest.raises(CorruptModelFileError, match="not a multiple of the 4 keys"):
        read_sparse_model(folder)


def test_vector_file_not_whole_floats(tmp_path):
    folder = _model(tmp_path)
    with open(folder / "emb_vector", "ab") as f:
        f.write(b"\0")
    with pytest.raises(CorruptModelFileError, match="not a multiple of the 4-byte float32"):
        read_sparse_model(folder)


def test_missing_files(tmp_path):
    with pytest.raises(CorruptModelFileError, match="does not exist"):
        read_sparse_model(tmp_path / "nope")
    folder = _model(tmp_path)
    (folder / "emb_vector").unlink()
    with pytest.raises(CorruptModelFileError, match="emb_vector is missing"):
        read_sparse_model(folder)


def test_slot_ids_count_mismatch(tmp_path):
    folder = _model(tmp_path)
    with open(folder / "slot_id", "r+b") as f:
        f.truncate(16)
    with pytest.raises(CorruptModelFileError, match="2 slot ids for 4 keys"):
        read_sparse_model(folder)


def test_int32_narrowing_refuses_wide_keys(tmp_path):
    write_sparse_model(tmp_path / "t", np.array([2**40]), np.ones((1, 1), np.float32))
    with pytest.raises(CorruptModelFileError, match="do not fit int32"):
        read_sparse_model(tmp_path / "t", key_dtype=np.int32)


def test_bad_arguments(tmp_path):
    with pytest.raises(InvalidInputError, match="1-D integer"):
        write_sparse_model(tmp_path / "t", np.ones(2, np.float32), np.ones((2, 1), np.float32))
    with pytest.raises(InvalidInputError, match=r"shape \[2, dim\]"):
        write_sparse_model(tmp_path / "t", np.arange(2), np.ones((3, 1), np.float32))
