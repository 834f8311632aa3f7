import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tierserve.core.errors import CorruptModelFileError
from tierserve.model.dense_file import (
    dense_model_name,
    dense_optimizer_name,
    read_dense_file,
    write_dense_file,
)

shapes = st.lists(
    st.one_of(
        st.tuples(st.integers(0, 20)),
        st.tuples(st.integers(0, 12), st.sampled_from([1, 5, 512])),
    ),
    max_size=6,
)


@settings(max_examples=50, deadline=None)
@given(shapes, st.data())
def test_round_trip(tmp_path_factory, layer_shapes, data):
    arrays = [
        data.draw(hnp.arrays(np.float32, s, elements=st.floats(-1e3, 1e3, width=32)))
        for s in layer_shapes
    ]
    path = tmp_path_factory.mktemp("dense") / dense_model_name("dlrm", 10)
    write_dense_file(path, arrays)
    assert path.stat().st_size == 4 * sum(a.size for a in arrays)
    back = read_dense_file(path, layer_shapes)
    assert len(back) == len(arrays)
    for a, b in zip(arrays, back):
        assert b.shape == a.shape and b.dtype == np.float32
        np.testing.assert_array_equal(a, b)


def test_graph_order_is_concatenation(tmp_path):
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([6, 7, 8], dtype=np.float32)
    write_dense_file(tmp_path / "d", [w, b])
    assert (tmp_path / "d").read_bytes() == np.arange(9, dtype="<f4").tobytes()


def test_names():
    assert dense_model_name("dcn", 500) == "dcn_dense_500.model"
    assert dense_optimizer_name("dcn") == "dcn_opt_dense_0.model"


def test_wrong_size(tmp_path):
    write_dense_file(tmp_path / "d", [np.ones((3, 4), np.float32)])
    with pytest.raises(CorruptModelFileError, match="holds 12 float32 values; the graph needs 15"):
        read_dense_file(tmp_path / "d", [(3, 4), (3,)])
    with open(tmp_path / "d", "ab") as f:
        f.write(b"\0\0")
    with pytest.raises(CorruptModelFileError, match="not a whole number of float32"):
        read_dense_file(tmp_path / "d", [(3, 4)])


def test_missing_and_non_finite(tmp_path):
    with pytest.raises(CorruptModelFileError, match="does not exist"):
        read_dense_file(tmp_path / "nope", [(1,)])
    write_dense_file(tmp_path / "d", [np.array([1.0, np.inf], np.float32)])
    with pytest.raises(CorruptModelFileError, match="NaN or infinite"):
        read_dense_file(tmp_path / "d", [(2,)])
