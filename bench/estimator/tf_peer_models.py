"""The models of the TensorFlow peer benchmark (:mod:`bench.estimator.tf_peer`), written once
against a namespace that is either TensorFlow's or tierserve's, so the two runs build the
same script with only the imports changed.

This module imports neither TensorFlow nor tierserve: ``bench/estimator/tf_peer_worker.py``
loads it into the TensorFlow virtual environment by path.

``ns`` carries ``estimator`` (``tf.estimator`` or ``tierserve.trainer.estimator``),
``fc`` (``tf.feature_column`` or ``tierserve.trainer.feature_column``) and
``numpy_input_fn``.  ``meta`` holds what the data decided (vocabularies, bucket boundaries),
computed once by the driver and given to both runs.
"""

from __future__ import annotations

import tempfile
import time
from typing import Any

INTS = [f"I{i}" for i in range(1, 14)]
CATS = [f"C{i}" for i in range(1, 27)]
HASH_BUCKETS = 1000
EMBEDDING_DIM = 8
HIDDEN = [64, 32]
#: log1p-scaled integer features are cut at these points by the bucketized columns
BOUNDARIES = [0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0]


def _columns(ns: Any, meta: dict) -> dict[str, list]:
    fc = ns.fc
    nums = [fc.numeric_column(k) for k in INTS]
    buckets = [fc.bucketized_column(fc.numeric_column(k), BOUNDARIES) for k in INTS[:4]]
    # C6 and C9 go through vocabularies (one column per feature name, as TF requires)
    hashed = [fc.categorical_column_with_hash_bucket(k, HASH_BUCKETS) for k in CATS
              if k not in ("C6", "C9")]
    # a vocabulary with OOV buckets, one whose out-of-vocabulary values have no id
    vocab_oov = fc.categorical_column_with_vocabulary_list("C9", meta["vocab_C9"],
                                                           num_oov_buckets=2)
    vocab = fc.categorical_column_with_vocabulary_list("C6", meta["vocab_C6"])
    crossed = [fc.crossed_column(["C1", "C2"], 1000),
               fc.crossed_column([fc.bucketized_column(fc.numeric_column("I1"), BOUNDARIES),
                                  "C6"], 500)]
    return {
        "nums": nums, "buckets": buckets, "hashed": hashed, "crossed": crossed,
        "vocab": [vocab_oov, vocab],
        "indicators": [fc.indicator_column(vocab_oov), fc.indicator_column(vocab)],
        "embeddings": [fc.embedding_column(c, EMBEDDING_DIM) for c in hashed],
    }


def _wide(c: dict) -> list:
    return c["nums"] + c["buckets"] + c["hashed"] + c["crossed"] + c["vocab"]


def _deep(c: dict) -> list:
    return c["nums"] + c["embeddings"] + c["indicators"]


#: name -> (what it shows, label kind: binary / regression / 3-class, in the AUC part)
MODELS: dict[str, tuple[str, str, bool]] = {
    "linear": ("LinearClassifier, optimizer 'Ftrl' (default)", "binary", True),
    "linear_none": ("LinearClassifier, optimizer=None (Ftrl at min(0.2, 1/sqrt(n)))", "binary",
                    False),
    "dnn": ("DNNClassifier, 'Adagrad' (default), weight_column", "binary", True),
    "dnn_adam_bn": ("DNNClassifier, 'Adam', batch_norm (dropout 0.1 in the AUC part)",
                    "binary", True),
    "issue": ("the issue's script: DNNLinearCombinedClassifier, numeric + hash-bucket "
              "embedding columns, 'Ftrl' + 'Adam'", "binary", True),
    "wide_deep": ("DNNLinearCombinedClassifier, 'Ftrl' + 'Adam', crosses, buckets", "binary",
                  True),
    "wide_deep_default": ("DNNLinearCombinedClassifier, defaults", "binary", True),
    "dnn_3class": ("DNNClassifier n_classes=3, 'Adagrad', tf.keras-style Adagrad object",
                   "3class", False),
    "linear_regressor": ("LinearRegressor, 'Ftrl' (default)", "regression", True),
    "dnn_regressor": ("DNNRegressor, 'SGD', label_dimension=2", "regression2", True),
    "wide_deep_regressor": ("DNNLinearCombinedRegressor, 'Ftrl' + 'Adagrad' (defaults)",
                            "regression", True),
}


def build(name: str, ns: Any, model_dir: str, seed: int, meta: dict, parity: bool) -> Any:
    """Estimator ``name`` of :data:`MODELS` (``parity``: dropout off)."""
    E = ns.estimator
    c = _columns(ns, meta)
    config = E.RunConfig(tf_random_seed=seed, save_checkpoints_steps=100000,
                         save_checkpoints_secs=None, keep_checkpoint_max=3,
                         log_step_count_steps=100000, save_summary_steps=100000,
                         **ns.run_config)
    common = {"model_dir": model_dir, "config": config}
    if name == "linear":
        return E.LinearClassifier(feature_columns=_wide(c), **common)
    if name == "linear_none":
        return E.LinearClassifier(feature_columns=_wide(c), optimizer=None, **common)
    if name == "dnn":
        return E.DNNClassifier(hidden_units=HIDDEN, feature_columns=_deep(c),
                               weight_column="w", **common)
    if name == "dnn_adam_bn":
        return E.DNNClassifier(hidden_units=HIDDEN, feature_columns=_deep(c), optimizer="Adam",
                               batch_norm=True, dropout=None if parity else 0.1, **common)
    if name == "issue":
        hashed = [ns.fc.categorical_column_with_hash_bucket(k, HASH_BUCKETS) for k in CATS]
        return E.DNNLinearCombinedClassifier(
            linear_feature_columns=hashed, linear_optimizer="Ftrl",
            dnn_feature_columns=c["nums"] + [ns.fc.embedding_column(h, EMBEDDING_DIM)
                                             for h in hashed],
            dnn_optimizer="Adam", dnn_hidden_units=HIDDEN, **common)
    if name == "wide_deep":
        return E.DNNLinearCombinedClassifier(
            linear_feature_columns=c["hashed"] + c["crossed"] + c["buckets"],
            linear_optimizer="Ftrl", dnn_feature_columns=_deep(c), dnn_optimizer="Adam",
            dnn_hidden_units=HIDDEN, **common)
    if name == "wide_deep_default":
        return E.DNNLinearCombinedClassifier(
            linear_feature_columns=c["hashed"] + c["crossed"] + c["buckets"],
            dnn_feature_columns=_deep(c), dnn_hidden_units=HIDDEN, **common)
    if name == "dnn_3class":
        return E.DNNClassifier(hidden_units=HIDDEN, feature_columns=_deep(c), n_classes=3,
                               optimizer=ns.adagrad(0.05), **common)
    if name == "linear_regressor":
        return E.LinearRegressor(feature_columns=c["nums"] + c["hashed"], **common)
    if name == "dnn_regressor":
        return E.DNNRegressor(hidden_units=HIDDEN, feature_columns=_deep(c), optimizer="SGD",
                              label_dimension=2, **common)
    if name == "wide_deep_regressor":
        return E.DNNLinearCombinedRegressor(
            linear_feature_columns=c["hashed"] + c["crossed"], dnn_feature_columns=_deep(c),
            dnn_hidden_units=HIDDEN, **common)
    raise KeyError(name)


def labels_for(kind: str, data: dict) -> Any:
    """The label array of a model's kind from the data dict."""
    if kind == "3class":
        return data["label3"]
    if kind == "regression2":
        return data["label2"]
    return data["label"]


def scores(kind: str, predictions: list[dict]) -> list[float]:
    """Per-example scores whose AUC against the 0/1 label is reported."""
    if kind == "binary":
        return [float(p["logistic"][0]) for p in predictions]
    if kind == "3class":
        return [float(p["probabilities"][1]) for p in predictions]
    return [float(p["predictions"][0]) for p in predictions]


def features(data: dict, rows: Any) -> dict:
    """The feature arrays of ``rows`` (everything but the labels)."""
    return {k: v[rows] for k, v in data.items() if not k.startswith("label")}


def held_out_scores(est: Any, kind: str, ns: Any, data: dict, spec: dict) -> list[float]:
    """``est``'s scores of the held-out rows (those after ``spec['train_rows']``)."""
    test = list(range(spec["train_rows"], len(data["label"])))
    pred = ns.numpy_input_fn(features(data, test), batch_size=spec["batch"], shuffle=False,
                             num_epochs=1)
    return scores(kind, list(est.predict(pred)))


def quality_runs(name: str, ns: Any, data: dict, spec: dict, prefix: str) -> list[dict]:
    """Model ``name`` trained ``spec['steps']`` steps of shuffled training rows from its own
    initialisation, once per seed: the training time and the held-out scores of each."""
    kind = MODELS[name][1]
    train = list(range(spec["train_rows"]))
    out = []
    for seed in spec["seeds"]:
        est = build(name, ns, tempfile.mkdtemp(prefix=f"{prefix}-{name}-{seed}-"), seed,
                    spec["meta"], parity=False)
        fn = ns.numpy_input_fn(features(data, train), labels_for(kind, data)[train],
                               batch_size=spec["batch"], shuffle=True, num_epochs=None)
        t0 = time.perf_counter()
        est.train(fn, steps=spec["steps"])
        seconds = time.perf_counter() - t0
        run = {"seed": seed, "train_seconds": seconds,
               "scores": held_out_scores(est, kind, ns, data, spec)}
        if ns.absent_ids_as_initial is not None:  # tierserve: also as TensorFlow reads them
            with ns.absent_ids_as_initial():
                run["scores_tf_absent"] = held_out_scores(est, kind, ns, data, spec)
        out.append(run)
    return out
