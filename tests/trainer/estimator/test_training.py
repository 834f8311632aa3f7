"""Estimator.train's TensorFlow semantics: steps add, max_steps is absolute and does nothing
once reached, training stops when the input ends; checkpoints resume exactly after a restart,
retention keeps the newest, a model_dir of another structure is refused; session hooks."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tierserve.core.errors import ConfigError
from tierserve.trainer import estimator
from tierserve.trainer import feature_column as fc
from tierserve.trainer.estimator import hooks as H

RNG = np.random.default_rng(7)
N = 64
FEATURES = {
    "x": RNG.normal(size=N).astype(np.float32),
    "kind": RNG.choice(["a", "b", "c", "d"], size=N),
}
LABELS = ((FEATURES["x"] > 0) ^ (FEATURES["kind"] == "a")).astype(np.float32)


def batch_fn():
    return dict(FEATURES), LABELS


def columns(dim: int = 4):
    kind = fc.categorical_column_with_vocabulary_list("kind", ["a", "b", "c", "d"])
    return [fc.numeric_column("x")], [fc.numeric_column("x"), fc.embedding_column(kind, dim)], [
        kind]


def wide_deep(model_dir, hidden=(8,), dim=4, **config):
    _, deep, wide = columns(dim)
    cfg = estimator.RunConfig(save_summary_steps=0, **config)
    return estimator.DNNLinearCombinedClassifier(
        model_dir=str(model_dir), linear_feature_columns=wide, dnn_feature_columns=deep,
        dnn_hidden_units=list(hidden), config=cfg)


def variables(est) -> dict[str, np.ndarray]:
    return {n: est.get_variable_value(n) for n in est.get_variable_names()}


def test_steps_add_and_max_steps_is_absolute(tmp_path):
    est = wide_deep(tmp_path)
    est.train(batch_fn, steps=5)
    est.train(batch_fn, steps=5)
    assert est.get_variable_value("global_step") == 10
    before = variables(est)
    est.train(batch_fn, max_steps=8)  # already past 8: nothing happens
    after = variables(est)
    assert after.keys() == before.keys()
    for k in before:
        np.testing.assert_array_equal(after[k], before[k])
    assert sorted(p.name for p in tmp_path.glob("model.ckpt-*")) == [
        "model.ckpt-10.npz", "model.ckpt-5.npz"]
    est.train(batch_fn, max_steps=13)
    assert est.get_variable_value("global_step") == 13
    with pytest.raises(ConfigError, match="steps or max_steps"):
        est.train(batch_fn, steps=1, max_steps=20)
    with pytest.raises(ConfigError, match="steps must be positive"):
        est.train(batch_fn, steps=0)


def test_training_stops_when_the_input_ends(tmp_path):
    est = wide_deep(tmp_path)

    def three_batches():
        for i in range(3):
            j = slice(i * 16, (i + 1) * 16)
            yield {k: v[j] for k, v in FEATURES.items()}, LABELS[j]

    est.train(three_batches, steps=100)
    assert est.get_variable_value("global_step") == 3
    est.train(three_batches)  # no limit: one pass of the input
    assert est.get_variable_value("global_step") == 6


def test_resume_after_restart_equals_uninterrupted_training(tmp_path):
    straight = wide_deep(tmp_path / "straight")
    straight.train(batch_fn, steps=12)
    first = wide_deep(tmp_path / "restarted")
    first.train(batch_fn, steps=5)
    del first
    # a new process would build a new Estimator over the same model_dir
    second = wide_deep(tmp_path / "restarted")
    assert second.get_variable_value("global_step") == 5
    second.train(batch_fn, steps=7)
    a, b = variables(straight), variables(second)
    assert a.keys() == b.keys() and len(a) > 5
    for k in a:  # optimizer state (Adagrad, Ftrl, per table row too) came back exactly
        np.testing.assert_allclose(b[k], a[k], rtol=0, atol=1e-6, err_msg=k)
    assert second.evaluate(batch_fn, steps=1)["loss"] == pytest.approx(
        straight.evaluate(batch_fn, steps=1)["loss"], abs=1e-6)


def test_checkpoint_retention_keeps_the_newest(tmp_path):
    est = wide_deep(tmp_path, save_checkpoints_steps=1, keep_checkpoint_max=2)
    est.train(batch_fn, steps=5)
    assert sorted(p.name for p in tmp_path.glob("model.ckpt-*")) == [
        "model.ckpt-4.npz", "model.ckpt-5.npz"]
    index = json.loads((tmp_path / "checkpoint").read_text())
    assert index["model_checkpoint_path"] == "model.ckpt-5.npz"
    assert index["all_model_checkpoint_paths"] == ["model.ckpt-4.npz", "model.ckpt-5.npz"]
    with pytest.raises(ConfigError, match="not both"):
        estimator.RunConfig(save_checkpoints_steps=10, save_checkpoints_secs=10)


@pytest.mark.parametrize("change", [dict(hidden=(16,)), dict(hidden=(8, 4)), dict(dim=6)])
def test_model_dir_of_another_structure_is_refused(tmp_path, change):
    wide_deep(tmp_path).train(batch_fn, steps=2)
    changed = wide_deep(tmp_path, **change)
    with pytest.raises(estimator.StructureError, match="Pick a new model_dir"):
        changed.train(batch_fn, steps=2)
    with pytest.raises(estimator.StructureError, match=str(tmp_path.name)):
        list(wide_deep(tmp_path, **change).predict(lambda: dict(FEATURES)))
    # the same structure still resumes
    wide_deep(tmp_path).train(batch_fn, steps=1)


def test_hooks_run_in_order_and_stop_training(tmp_path):
    calls = []

    class Recorder(H.SessionRunHook):
        def begin(self):
            calls.append("begin")

        def after_create_session(self, session, coord):
            calls.append(f"session@{session.global_step}")

        def before_run(self, run_context):
            calls.append("before")
            return H.SessionRunArgs({"loss": "loss", "step": "global_step"})

        def after_run(self, run_context, run_values):
            calls.append(("after", run_values.results["step"]))
            assert np.isfinite(run_values.results["loss"])

        def end(self, session):
            calls.append(f"end@{session.global_step}")

    logger = H.LoggingTensorHook(["loss", "global_step"], every_n_iter=2)
    saver_dir = tmp_path / "extra"
    saver = H.CheckpointSaverHook(str(saver_dir), save_steps=2)
    est = wide_deep(tmp_path / "m")
    est.train(batch_fn, hooks=[Recorder(), H.StopAtStepHook(num_steps=3), logger, saver],
              steps=100)
    assert est.get_variable_value("global_step") == 3
    assert calls == ["begin", "session@0", "before", ("after", 1), "before", ("after", 2),
                     "before", ("after", 3), "end@3"]
    assert [entry["global_step"] for entry in logger.logged] == [1, 3]
    assert sorted(p.name for p in saver_dir.glob("model.ckpt-*")) == [
        "model.ckpt-2.npz", "model.ckpt-3.npz"]
    est.train(batch_fn, hooks=[H.StopAtStepHook(last_step=5)])
    assert est.get_variable_value("global_step") == 5


def test_warm_start_copies_matching_variables(tmp_path):
    source = wide_deep(tmp_path / "source")
    source.train(batch_fn, steps=4)
    _, deep, wide = columns()
    warm = estimator.DNNLinearCombinedClassifier(
        model_dir=str(tmp_path / "warm"), linear_feature_columns=wide,
        dnn_feature_columns=deep, dnn_hidden_units=[8],
        warm_start_from=estimator.WarmStartSettings(str(tmp_path / "source"), "dnn/.*"))
    list(warm.predict(lambda: dict(FEATURES)))  # builds the model: warm start applies
    for name in source.get_variable_names():
        if name.startswith("dnn/"):
            np.testing.assert_array_equal(warm.get_variable_value(name),
                                          source.get_variable_value(name), err_msg=name)
    # the linear part was not warm-started: still its initial (zero) weights
    assert not np.any(warm.get_variable_value("linear/linear_model/kind/weights"))
    assert np.any(source.get_variable_value("linear/linear_model/kind/weights"))
    warm.train(batch_fn, steps=1)
    assert warm.get_variable_value("global_step") == 1


def test_tables_keep_training_after_evaluate_and_predict(tmp_path):
    est = wide_deep(tmp_path)
    list(est.predict(lambda: dict(FEATURES)))  # a predict-only program first
    est.train(batch_fn, steps=2)
    est.evaluate(batch_fn, steps=1)
    name = "dnn/input_from_feature_columns/input_layer/kind_embedding/embedding_weights"
    before = est.get_variable_value(name)
    est.train(batch_fn, steps=2)
    after = est.get_variable_value(name)
    assert np.abs(after - before).max() > 1e-4  # the table still trains
    # and the programs built before read the trained table
    preds = [p["logistic"][0] for p in est.predict(lambda: dict(FEATURES))]
    fresh = wide_deep(tmp_path)  # a new Estimator restores the checkpoint
    assert preds == pytest.approx([p["logistic"][0] for p in fresh.predict(
        lambda: dict(FEATURES))], abs=1e-6)


def test_tf_random_seed_sets_the_initial_weights(tmp_path):
    def first_kernel(seed, name):
        est = wide_deep(tmp_path / name, tf_random_seed=seed)
        list(est.predict(lambda: dict(FEATURES)))
        return est.get_variable_value("dnn/hiddenlayer_0/kernel"), est.get_variable_value(
            "dnn/input_from_feature_columns/input_layer/kind_embedding/embedding_weights")

    a, b, c = first_kernel(1, "a"), first_kernel(1, "b"), first_kernel(2, "c")
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert not np.allclose(a[0], c[0]) and not np.allclose(a[1], c[1])
