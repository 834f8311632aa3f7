"""estimator.inputs: numpy_input_fn and pandas_input_fn with TensorFlow's semantics, and
batches() over what an input_fn returns."""

import itertools

import numpy as np
import pytest

from tierserve.core.errors import InvalidInputError
from tierserve.trainer import data
from tierserve.trainer.estimator import inputs

pd = pytest.importorskip("pandas")


def collect(input_fn):
    return list(inputs.batches(input_fn()))


def test_numpy_epochs_partial_batch_and_order():
    x = {"a": np.arange(10), "b": np.arange(10) * 1.5}
    y = np.arange(10) % 2
    batches = collect(inputs.numpy_input_fn(x, y, batch_size=4, num_epochs=1, shuffle=False))
    assert [len(lab) for _, lab in batches] == [4, 4, 2]  # the last, smaller batch is kept
    assert np.concatenate([f["a"] for f, _ in batches]).tolist() == list(range(10))
    assert np.concatenate([lab for _, lab in batches]).tolist() == y.tolist()
    two = collect(inputs.numpy_input_fn(x, y, batch_size=4, num_epochs=2, shuffle=False))
    assert [len(lab) for _, lab in two] == [4, 4, 4, 4, 4]  # epochs run on, as a queue did
    assert np.concatenate([f["a"] for f, _ in two]).tolist() == list(range(10)) * 2
    f, _ = two[0]
    assert sorted(f) == ["a", "b"] and f["b"].dtype == np.float64


def test_numpy_shuffle_permutes_each_epoch_and_pairs_stay_together():
    n = 500
    x = {"a": np.arange(n)}
    fn = inputs.numpy_input_fn(x, np.arange(n) * 10, batch_size=64, num_epochs=3, shuffle=True)
    batches = collect(fn)
    a = np.concatenate([f["a"] for f, _ in batches])
    labels = np.concatenate([lab for _, lab in batches])
    assert (labels == a * 10).all()
    for epoch in range(3):
        part = a[epoch * n : (epoch + 1) * n]
        assert sorted(part.tolist()) == list(range(n)) and part.tolist() != list(range(n))
    assert a[:n].tolist() != collect_a(fn)[:n]  # a new order on each call


def collect_a(fn):
    return np.concatenate([f["a"] for f, _ in collect(fn)]).tolist()


def test_numpy_forever_gives_full_batches():
    fn = inputs.numpy_input_fn(np.arange(7), batch_size=3, num_epochs=None, shuffle=False)
    first = list(itertools.islice(inputs.batches(fn()), 10))
    assert all(len(f) == 3 and lab is None for f, lab in first)
    assert np.concatenate([f for f, _ in first]).tolist() == (list(range(7)) * 5)[:30]


def test_numpy_input_errors():
    x = {"a": np.arange(4)}
    with pytest.raises(InvalidInputError, match="shuffle must be provided and explicitly set"):
        inputs.numpy_input_fn(x, np.arange(4))
    with pytest.raises(InvalidInputError, match="shuffle must be provided"):
        inputs.numpy_input_fn(x, np.arange(4), shuffle=1)
    with pytest.raises(InvalidInputError, match="length of tensors in x and y is mismatched"):
        inputs.numpy_input_fn(x, np.arange(5), shuffle=False)
    with pytest.raises(InvalidInputError, match=r"duplicate keys .* \['a'\]"):
        inputs.numpy_input_fn(x, {"a": np.arange(4)}, shuffle=False)
    with pytest.raises(InvalidInputError, match="num_epochs"):
        inputs.numpy_input_fn(x, shuffle=False, num_epochs=0)
    with pytest.raises(InvalidInputError, match="batch_size"):
        inputs.numpy_input_fn(x, shuffle=False, batch_size=0)
    with pytest.raises(InvalidInputError, match="num_threads"):
        inputs.numpy_input_fn(x, shuffle=False, num_threads=4)
    with pytest.raises(InvalidInputError, match="queue_capacity"):
        inputs.numpy_input_fn(x, shuffle=True, queue_capacity=0)


def test_numpy_target_column_and_label_dict():
    # a feature named like the target column does not clash (TensorFlow makes the key unique)
    x = {"target": np.arange(3)}
    ((f, lab),) = collect(inputs.numpy_input_fn(x, np.arange(3) + 7, shuffle=False))
    assert f["target"].tolist() == [0, 1, 2] and lab.tolist() == [7, 8, 9]
    ys = {"click": np.ones(3), "buy": np.zeros(3)}
    ((f, lab),) = collect(inputs.numpy_input_fn(x, ys, shuffle=False))
    assert sorted(lab) == ["buy", "click"] and lab["click"].tolist() == [1, 1, 1]


def test_course_notes_numpy_and_pandas_input_fns():
    sqft = np.array([1000, 2000, 3000, 1000, 2000, 3000])
    kind = np.array(["house", "house", "house", "apt", "apt", "apt"])
    price = np.array([500, 1000, 1500, 700, 1300, 1900], dtype=np.float32)

    def numpy_train_input_fn(sqrt, prop_type, price):
        return inputs.numpy_input_fn(
            x={"sq_footage": sqrt, "type": prop_type},
            y=price,
            batch_size=128,
            num_epochs=10,
            shuffle=True,
            queue_capacity=1000,
        )

    batches = collect(numpy_train_input_fn(sqft, kind, price))
    assert len(batches) == 1 and len(batches[0][1]) == 60
    f, lab = batches[0]
    pairs = sorted(zip(f["sq_footage"].tolist(), f["type"].tolist(), lab.tolist()))
    assert pairs == sorted(list(zip(sqft.tolist(), kind.tolist(), price.tolist())) * 10)

    df = pd.DataFrame({"sq_footage": sqft, "type": kind, "price": price})

    def panda_train_input_fn(df):
        return inputs.pandas_input_fn(
            x=df,
            y=df["price"],
            batch_size=4,
            num_epochs=10,
            shuffle=True,
            queue_capacity=1000,
        )

    batches = collect(panda_train_input_fn(df))
    assert [len(lab) for _, lab in batches] == [4] * 15
    f, lab = batches[0]
    assert sorted(f) == ["price", "sq_footage", "type"]
    assert (f["price"] == lab).all()  # x's own price column, and y, travel together


def test_pandas_semantics_and_errors():
    df = pd.DataFrame({"a": [1, 2, 3, 4, 5], "b": ["x", "y", "z", "x", "y"]}, index=[5, 6, 7, 8, 9])
    y = pd.Series([0.5, 1.5, 2.5, 3.5, 4.5], index=df.index)
    batches = collect(inputs.pandas_input_fn(df, y, batch_size=2, num_epochs=1, shuffle=False))
    assert [lab.tolist() for _, lab in batches] == [[0.5, 1.5], [2.5, 3.5], [4.5]]
    assert batches[0][0]["b"].tolist() == ["x", "y"]
    ((f, lab),) = collect(inputs.pandas_input_fn(df, batch_size=8, shuffle=False))
    assert lab is None and f["a"].tolist() == [1, 2, 3, 4, 5]
    multi = pd.DataFrame({"p": [1, 2, 3, 4, 5], "q": [5, 4, 3, 2, 1]}, index=df.index)
    ((f, lab),) = collect(inputs.pandas_input_fn(df, multi, batch_size=8, shuffle=False))
    assert sorted(lab) == ["p", "q"] and lab["q"].tolist() == [5, 4, 3, 2, 1]

    with pytest.raises(InvalidInputError, match="index for x and y are mismatched"):
        inputs.pandas_input_fn(df, pd.Series([1, 2, 3, 4, 5]), shuffle=False)
    with pytest.raises(InvalidInputError, match="cannot use name 'a' for target column"):
        inputs.pandas_input_fn(df, y, shuffle=False, target_column="a")
    named = collect(inputs.pandas_input_fn(df, y, shuffle=False, target_column="label"))
    assert named[0][1].tolist() == y.tolist()
    with pytest.raises(InvalidInputError, match="shuffle must be provided"):
        inputs.pandas_input_fn(df, y)
    with pytest.raises(InvalidInputError, match="x must be a pandas DataFrame"):
        inputs.pandas_input_fn({"a": [1]}, shuffle=False)


def test_batches_of_every_input_fn_form(tmp_path):
    one = inputs.batches(({"sq_footage": [1000, 2000]}, [500, 1000]))
    ((f, lab),) = list(one)
    assert f["sq_footage"].tolist() == [1000, 2000] and lab.tolist() == [500, 1000]
    ((f, lab),) = list(inputs.batches({"sq_footage": [1500, 1800]}))
    assert lab is None and f["sq_footage"].tolist() == [1500, 1800]
    with pytest.raises(InvalidInputError, match="input_fn must return"):
        inputs.batches(42)

    # the course notes' Dataset input_fn: make_one_shot_iterator().get_next() inside it
    path = tmp_path / "train.csv-0"
    path.write_text("".join(f"{i},house,{i * 2}\n" for i in range(10)))

    def decode_line(row):
        cols = data.decode_csv(row, record_defaults=[[0], ["house"], [0]])
        return {"sq_footage": cols[0], "type": cols[1]}, cols[2]

    dataset = (
        data.Dataset.list_files(str(tmp_path / "train.csv-*"))
        .flat_map(data.TextLineDataset)
        .map(decode_line)
    )
    dataset = dataset.shuffle(1000).repeat(15).batch(128)

    def input_fn():
        features, label = dataset.make_one_shot_iterator().get_next()
        return features, label

    got = list(inputs.batches(input_fn()))
    assert [len(lab) for _, lab in got] == [128, 22]  # 150 rows: the whole stream, not one batch
    sq = np.concatenate([f["sq_footage"] for f, _ in got])
    assert (np.concatenate([lab for _, lab in got]) == sq * 2).all()
    assert sorted(sq.tolist()) == sorted(list(range(10)) * 15)


@pytest.mark.timeout(120)  # an input_fn read as one batch repeated would train forever
def test_an_estimator_trains_until_the_input_ends(tmp_path):
    """The course notes' input_fns drive Estimator.train: one step per batch, to the end."""
    estimator = pytest.importorskip("tierserve.trainer.estimator")
    if not hasattr(estimator, "LinearRegressor"):
        pytest.skip("the Estimator is not there yet")
    from tierserve.trainer import feature_column

    for k in range(2):
        (tmp_path / f"train.csv-{k}").write_text(
            "".join(f"{1000 + 100 * i},{'house' if i % 2 else 'apt'},{500 + i}\n" for i in range(5))
        )

    def decode_line(row):
        cols = data.decode_csv(row, record_defaults=[[0.0], ["house"], [0.0]])
        return {"sq_footage": cols[0], "type": cols[1]}, cols[2]

    dataset = (
        data.Dataset.list_files(str(tmp_path / "train.csv-*"))
        .flat_map(data.TextLineDataset)
        .map(decode_line)
    )
    dataset = dataset.shuffle(1000).repeat(15).batch(32)  # 150 rows: 5 batches

    def input_fn():
        features, label = dataset.make_one_shot_iterator().get_next()
        return features, label

    featcols = [
        feature_column.numeric_column("sq_footage"),
        feature_column.categorical_column_with_vocabulary_list("type", ["house", "apt"]),
    ]
    model = estimator.LinearRegressor(featcols, str(tmp_path / "model"))
    model.train(input_fn)
    assert model.get_variable_value("global_step") == 5

    sqft = np.array([1000, 2000, 3000, 1000, 2000, 3000], dtype=np.float32)
    kind = np.array(["house", "house", "house", "apt", "apt", "apt"])
    price = np.array([500, 1000, 1500, 700, 1300, 1900], dtype=np.float32)
    df = pd.DataFrame({"sq_footage": sqft, "type": kind, "price": price})
    model.train(
        inputs.pandas_input_fn(x=df, y=df["price"], batch_size=16, num_epochs=10, shuffle=True)
    )  # 60 rows: 4 more steps
    assert model.get_variable_value("global_step") == 9
    model.train(
        inputs.numpy_input_fn(
            {"sq_footage": sqft, "type": kind}, price, batch_size=128, num_epochs=None, shuffle=True
        ),
        steps=3,
    )
    assert model.get_variable_value("global_step") == 12


@pytest.mark.timeout(120)  # read as one constant batch, training never ended
def test_get_next_unpacked_into_a_dict_trains_to_the_end_of_the_data(tmp_path):
    """DLRover's iris input_fn: ``x, y = iterator.get_next(); return {"x": x}, y``."""
    from tierserve.trainer import estimator
    from tierserve.trainer import feature_column as fc

    def gen():
        for i in range(100):
            yield [float(i % 7), 1.0, 2.0, float(i % 3)], [i % 2]

    def input_fn():
        ds = data.Dataset.from_generator(
            gen, output_types=(np.float32, np.int32), output_shapes=((4,), (1,))
        ).shuffle(10).batch(8)
        x, y = ds.make_one_shot_iterator().get_next()
        return {"x": x}, y

    def model_fn(features, labels, mode):
        logits = estimator.layers.dense(
            fc.input_layer(features, [fc.numeric_column("x", shape=(4,))]), 1)
        loss = estimator.losses.sigmoid_cross_entropy(labels, logits)
        return estimator.EstimatorSpec(
            mode, loss=loss, train_op=estimator.train.GradientDescentOptimizer(0.1).minimize(loss),
            eval_metric_ops={"n": estimator.metrics.mean(labels)})

    est = estimator.Estimator(model_fn, str(tmp_path),
                              config=estimator.RunConfig(save_summary_steps=0))
    est.train(input_fn)
    assert est.get_variable_value("global_step") == 13  # ceil(100 / 8) batches, then the end
    metrics = est.evaluate(input_fn)
    assert metrics["n"] == pytest.approx(0.5)  # every row evaluated once: 50 of 100 are 1
