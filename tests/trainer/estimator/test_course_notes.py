"""The TF Estimator course notes' examples (../shared/reference/tf_estimator_notes.md), run as
written apart from the import: ``tf.estimator`` / ``tf.feature_column`` are
``tierserve.trainer.estimator`` / ``feature_column``."""

from __future__ import annotations

import numpy as np
import pytest

from tierserve.trainer import estimator, feature_column
from tierserve.trainer.summary import read_scalars

HOUSES = {
    "sq_footage": [1000, 2000, 3000, 1000, 2000, 3000],
    "type": ["house", "house", "house", "apt", "apt", "apt"],
}
PRICES = [500, 1000, 1500, 700, 1300, 1900]


def featcols():
    return [
        feature_column.numeric_column("sq_footage"),
        # One-hot encoding
        feature_column.categorical_column_with_vocabulary_list("type", ["house", "apt"]),
    ]


def train_input_fn():
    features = {
        "sq_footage": [1000, 2000, 3000, 1000, 2000, 3000],
        "type": ["house", "house", "house", "apt", "apt", "apt"]}
    labels = [500, 1000, 1500, 700, 1300, 1900]
    return features, labels


def pred_input_fn():
    features = {
        "sq_footage": [1500, 1800],
        "type": ["house", "apt"]
    }
    return features


def test_linear_regressor_trains_100_steps_and_predicts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = estimator.LinearRegressor(featcols())
    model.train(train_input_fn, steps=100)
    predictions = model.predict(pred_input_fn)  # Generator
    values = [p["predictions"][0] for p in predictions]
    assert len(values) == 2
    # an independent reference: the linear model's formula over its own variables
    kernel = model.get_variable_value("linear/linear_model/dense/kernel")
    bias = model.get_variable_value("linear/linear_model/bias_weights")
    type_w = model.get_variable_value("linear/linear_model/type/weights")
    assert kernel.shape == (1, 1) and type_w.shape == (2, 1)
    expected = [1500 * kernel[0, 0] + type_w[0, 0] + bias[0],
                1800 * kernel[0, 0] + type_w[1, 0] + bias[0]]
    np.testing.assert_allclose(values, expected, rtol=1e-5)
    metrics = model.evaluate(train_input_fn, steps=1)
    assert metrics["global_step"] == 100
    # far better than predicting the mean price (variance 225,833)
    assert metrics["average_loss"] < 0.15 * np.var(PRICES)


def test_dnn_regressor_hidden_units_3_2(tmp_path):
    model = estimator.DNNRegressor(featcols(), hidden_units=[3, 2], model_dir=str(tmp_path))
    model.train(train_input_fn, steps=100)
    names = model.get_variable_names()
    assert model.get_variable_value("dnn/hiddenlayer_0/kernel").shape == (3, 3)  # sq + one-hot
    assert model.get_variable_value("dnn/hiddenlayer_1/kernel").shape == (3, 2)
    assert model.get_variable_value("dnn/logits/kernel").shape == (2, 1)
    assert "global_step" in names
    assert len(list(model.predict(pred_input_fn))) == 2
    # the notes' list of settings one can change
    tuned = estimator.DNNRegressor(feature_columns=[
        feature_column.numeric_column("sq_footage"),
        feature_column.indicator_column(featcols()[1])],
        hidden_units=[10, 5],
        activation_fn=estimator.nn.relu,
        dropout=0.2,
        optimizer='Adam', model_dir=str(tmp_path / "tuned"))
    tuned.train(train_input_fn, steps=20)
    assert tuned.evaluate(train_input_fn, steps=1)["global_step"] == 20


def test_checkpointing_restore_and_continue(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # Where to put the checkpoints
    model = estimator.LinearRegressor(featcols(), './model_trained')
    model.train(train_input_fn, steps=100)
    first = [p["predictions"][0] for p in model.predict(pred_input_fn)]
    # We can now restore and predict with the model
    trained_model = estimator.LinearRegressor(featcols(), './model_trained')
    predictions = trained_model.predict(pred_input_fn)
    assert [p["predictions"][0] for p in predictions] == first
    # Training also resumes from the last checkpoint
    model = estimator.LinearRegressor(featcols(), './model_trained')
    model.train(train_input_fn, steps=100)
    assert model.evaluate(train_input_fn, steps=1)["global_step"] == 200
    assert (tmp_path / "model_trained" / "model.ckpt-200.npz").exists()


def test_train_and_evaluate_with_run_config_train_spec_eval_spec(tmp_path):
    output_dir = str(tmp_path / "out")
    run_config = estimator.RunConfig(
        model_dir=output_dir,
        save_summary_steps=100,
        save_checkpoints_steps=2000
    )
    model = estimator.LinearRegressor(
        feature_columns=featcols(),
        config=run_config
    )

    def eval_input_fn():
        return train_input_fn()

    serving = estimator.export.build_raw_serving_input_receiver_fn(
        {"sq_footage": estimator.export.placeholder(np.float32, [None]),
         "type": estimator.export.placeholder(str, [None])})
    train_spec = estimator.TrainSpec(
        input_fn=train_input_fn,
        max_steps=5000
    )
    eval_spec = estimator.EvalSpec(
        input_fn=eval_input_fn,
        steps=100,          # Evals on 100 batches
        throttle_secs=600,  # Eval no more than every 10 min
        exporters=estimator.export.LatestExporter("houses", serving)
    )
    metrics, exports = estimator.train_and_evaluate(model, train_spec, eval_spec)
    # checkpoints at 2000 and 4000 come before EvalSpec's start_delay_secs (120 s): the one
    # evaluation (and export) is the final one, at 5000
    assert metrics["global_step"] == 5000
    assert [e.decode().rsplit("/", 1)[-1] for e in exports] == ["1"]
    assert metrics["average_loss"] < 0.15 * np.var(PRICES)
    # TensorBoard: loss every 100 steps under model_dir, the evaluation under eval/
    scalars = read_scalars(output_dir)
    assert [s for s, _ in scalars["loss"]] == list(range(100, 5001, 100))
    assert "learning_rate" in scalars and "global_step/sec" in scalars
    evals = read_scalars(f"{output_dir}/eval")
    assert [s for s, _ in evals["average_loss"]] == [5000]
    assert evals["average_loss"][-1][1] == pytest.approx(metrics["average_loss"], rel=1e-6)


def test_numpy_pandas_and_dataset_input_functions_train_the_estimator(tmp_path):
    from tierserve.trainer import data

    rng = np.random.default_rng(0)
    sq = rng.integers(500, 3000, 1000).astype(np.float32)
    kind = rng.choice(["house", "apt"], 1000)
    price = sq * 0.5 + (kind == "apt") * 100
    model = estimator.LinearRegressor(featcols(), str(tmp_path / "m"))

    def numpy_train_input_fn(sqrt, prop_type, price):
        return estimator.inputs.numpy_input_fn(
            x={'sq_footage': sqrt, 'type': prop_type},
            y=price,
            batch_size=128,
            num_epochs=10,
            shuffle=True,
            queue_capacity=1000
        )

    # Trains until input exhausted (10 epochs of 1,000 rows in batches of 128)
    model.train(numpy_train_input_fn(sq, kind, price))
    assert model.get_variable_value("global_step") == 79  # ceil(10 * 1,000 / 128)
    model.train(numpy_train_input_fn(sq, kind, price), steps=5)
    assert model.get_variable_value("global_step") == 84
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"sq_footage": sq, "type": kind, "price": price})
    model.train(estimator.inputs.pandas_input_fn(x=df, y=df['price'], batch_size=128,
                                                 num_epochs=1, shuffle=True))
    assert model.get_variable_value("global_step") == 84 + 8

    for i in range(3):  # sharded CSV files
        rows = range(i * 100, i * 100 + 100)
        (tmp_path / f"train.csv-{i}").write_text(
            "".join(f"{int(sq[j])},{kind[j]},{price[j]}\n" for j in rows))

    def decode_line(row):
        cols = data.decode_csv(row, record_defaults=[[0], ['house'], [0.0]])
        features = {
            'sq_footage': cols[0],
            'type': cols[1]
        }
        label = cols[2]     # price
        return features, label

    dataset = data.Dataset.list_files(str(tmp_path / 'train.csv-*')) \
        .flat_map(data.TextLineDataset) \
        .map(decode_line)
    dataset = dataset.shuffle(1000).repeat(15).batch(128)

    def input_fn():
        features, label = dataset.make_one_shot_iterator().get_next()
        return features, label

    model.train(input_fn)
    assert model.get_variable_value("global_step") == 92 + 36  # 15 * 300 rows / 128, rounded up
    result = model.evaluate(input_fn)
    assert result["average_loss"] < 0.15 * np.var(price)
