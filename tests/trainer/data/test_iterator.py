"""TF1's one-shot iterator: get_next() values, however an input_fn arranges them, stand for
the rest of the pass; from_generator reads output_shapes in output_types' structure."""

import numpy as np
import pytest

from tierserve.core.errors import InvalidInputError
from tierserve.trainer import data
from tierserve.trainer.data.iterator import (
    NextFeatures,
    OutOfRangeError,
    make_one_shot_iterator,
    stream_of,
)


def rows(n):
    """DLRover's iris generator: a list of 4 values and a one-element label list per row."""
    for i in range(n):
        yield [str(i), "1.5", "2", "3"], [i % 3]


def iris_like(n, batch):
    return data.Dataset.from_generator(
        lambda: rows(n), output_types=(np.float32, np.int32), output_shapes=(4, 1)
    ).batch(batch)


def test_output_shapes_are_read_in_the_structure_of_output_types():
    # TensorFlow reads output_shapes=(4, 1) against two types as the shapes (4,) and (1,)
    (x, y), *_ = list(iris_like(5, 5))
    assert x.shape == (5, 4) and x.dtype == np.float32 and x[:, 0].tolist() == [0, 1, 2, 3, 4]
    assert y.shape == (5, 1) and y.dtype == np.int32
    with pytest.raises(InvalidInputError, match=r"component 1 has shape \(1,\).*\(2,\)"):
        list(data.Dataset.from_generator(lambda: rows(2), output_types=(np.float32, np.int32),
                                         output_shapes=(4, 2)))
    with pytest.raises(InvalidInputError, match="2 components"):
        data.Dataset.from_generator(lambda: rows(2), output_types=(np.float32, np.int32),
                                    output_shapes=(4,))
    # nested structures and None (any shape) work as in TensorFlow
    ds = data.Dataset.from_generator(
        lambda: ({"a": [1.0, 2.0], "b": i} for i in range(3)),
        output_types={"a": np.float32, "b": np.int64}, output_shapes={"a": [2], "b": None})
    assert [int(e["b"]) for e in ds] == [0, 1, 2]


def test_get_next_unpacked_into_a_dict_gives_the_rest_of_the_pass():
    it = make_one_shot_iterator(iris_like(23, 5))
    x, y = it.get_next()
    result = ({"x": x}, y)  # DLRover's input_fn: features = {"x": feature_values}
    got = list(stream_of(result))
    assert [len(lab) for _, lab in got] == [5, 5, 5, 5, 3]  # the whole pass, then the end
    first = np.concatenate([f["x"][:, 0] for f, _ in got])
    assert first.tolist() == list(range(23))
    assert np.concatenate([lab for _, lab in got]).reshape(-1).tolist() == [
        i % 3 for i in range(23)]
    assert type(got[0][0]["x"]) is np.ndarray  # plain arrays from here on


def test_popped_labels_and_constants_keep_their_place():
    ds = data.Dataset.from_tensor_slices(
        {"a": np.arange(6), "label": np.arange(6) * 10}).batch(4)
    feats = ds.make_one_shot_iterator().get_next()
    assert isinstance(feats, NextFeatures)
    labels = feats.pop("label")
    feats["w"] = np.ones(2)  # a constant added to every batch (as a constant tensor)
    got = list(stream_of((feats, labels)))
    assert [f["a"].tolist() for f, _ in got] == [[0, 1, 2, 3], [4, 5]]
    assert [lab.tolist() for _, lab in got] == [[0, 10, 20, 30], [40, 50]]
    assert all(sorted(f) == ["a", "w"] and f["w"].tolist() == [1, 1] for f, _ in got)


def test_constants_alone_are_not_a_stream_and_computed_values_are_refused():
    assert stream_of(({"x": np.ones(3)}, np.zeros(3))) is None
    x, y = iris_like(10, 5).make_one_shot_iterator().get_next()
    with pytest.raises(InvalidInputError, match="computed from iterator.get_next"):
        stream_of(({"x": x * 2}, y))
    with pytest.raises(InvalidInputError, match="computed from iterator.get_next"):
        stream_of(({"x": x[:, :2]}, y))
    other = iris_like(10, 5).make_one_shot_iterator().get_next()
    with pytest.raises(InvalidInputError, match="several iterators"):
        stream_of(({"x": x}, other[1]))


def test_the_iterator_raises_out_of_range_at_the_end():
    it = make_one_shot_iterator(data.Dataset.range(2))
    assert [int(it.get_next()), int(it.get_next())] == [0, 1]
    with pytest.raises(OutOfRangeError, match="End of sequence"):
        it.get_next()
