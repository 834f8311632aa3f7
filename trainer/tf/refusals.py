"""What ``tierserve.trainer.tf`` refuses on purpose, and what to use instead: Keras (layers,
models, losses, ``model_to_estimator``), DeepRec's EmbeddingVariable, TF1 sessions, and ops
whose nearest supported form is worth naming."""

from __future__ import annotations

KERAS = ("Keras layers and models are not supported: tierserve's trainer runs model_fn "
         "graphs, not Keras")
KERAS_INSTEAD = ("tf.layers / tf.compat.v1.layers (dense, dropout, batch_normalization) in a "
                 "model_fn, tf.losses for losses, or a pre-made Estimator")
EMBEDDING_VARIABLE = ("DeepRec's EmbeddingVariable is not supported (tierserve's embedding "
                      "tables already hold any id, grow on demand and are sharded over "
                      "mpiexec ranks)")
EV_INSTEAD = ("tf.feature_column.categorical_column_with_hash_bucket (or _with_identity) "
              "with tf.feature_column.embedding_column")
SESSION = "TF1 sessions are not supported: training runs through an Estimator"


#: top-level ``tf.<name>`` refused on purpose: (why, instead)
TF_REFUSED: dict[str, tuple[str, str | None]] = {
    "EmbeddingVariableOption": (EMBEDDING_VARIABLE, EV_INSTEAD),
    "get_embedding_variable": (EMBEDDING_VARIABLE, EV_INSTEAD),
    "CounterFilter": (EMBEDDING_VARIABLE, EV_INSTEAD),
    "CBFFilter": (EMBEDDING_VARIABLE, EV_INSTEAD),
    "GlobalStepEvict": (EMBEDDING_VARIABLE, EV_INSTEAD),
    "L2WeightEvict": (EMBEDDING_VARIABLE, EV_INSTEAD),
    "InitializerOption": (EMBEDDING_VARIABLE, EV_INSTEAD),
    "partitioned_variables": ("variable partitioning is not supported (a dense variable "
                              "lives whole in each process; embedding tables shard over "
                              "mpiexec ranks)", None),
    "fixed_size_partitioner": ("variable partitioning is not supported (a dense variable "
                               "lives whole in each process; embedding tables shard over "
                               "mpiexec ranks)", None),
    "Session": (SESSION, "tf.estimator.Estimator"),
    "InteractiveSession": (SESSION, "tf.estimator.Estimator"),
    "ConfigProto": (SESSION, "tf.estimator.RunConfig"),
    "placeholder_with_default": ("placeholder_with_default is not supported", "tf.placeholder "
                                 "in a serving input receiver"),
}

#: ``tf.<name>`` not supported, with the closest supported form
TF_HINTS = {
    "matmul": "tf.layers.dense (a learned matrix) or tf.multiply + tf.reduce_sum",
    "tensordot": "tf.layers.dense",
    "gather": "tf.feature_column.embedding_column (ids to vectors)",
    "boolean_mask": "weights in the loss (a 0/1 weight per example)",
    "where": "a 0/1 mask multiplied in (tf.multiply)",
    "stack": "tf.concat",
    "square": "tf.multiply(x, x)",
    "log": "a loss of tf.losses (they take logits)",
    "exp": "tf.nn.softmax / tf.sigmoid",
    "sqrt": "tf.multiply",
    "random_uniform_initializer": "initializer=lambda shape: np.random.uniform(lo, hi, shape)",
    "random_normal_initializer": "initializer=lambda shape: np.random.normal(0, sd, shape)",
    "truncated_normal_initializer": "kernel_initializer='glorot_normal'",
    "glorot_normal_initializer": "kernel_initializer='glorot_normal'",
    "glorot_uniform_initializer": "kernel_initializer='glorot_uniform'",
    "zeros_initializer": "bias_initializer='zeros'",
}

#: ``tf.feature_column.<name>`` refused on purpose
FEATURE_COLUMN_REFUSED = {
    "categorical_column_with_embedding": (EMBEDDING_VARIABLE, EV_INSTEAD),
    "categorical_column_with_adaptive_embedding": (EMBEDDING_VARIABLE, EV_INSTEAD),
    "sequence_categorical_column_with_embedding": (EMBEDDING_VARIABLE, EV_INSTEAD),
}

#: ``tf.train.<name>`` refused on purpose
TRAIN_REFUSED = {
    "MonitoredTrainingSession": (SESSION, "tf.estimator.Estimator(model_fn).train"),
    "MonitoredSession": (SESSION, "tf.estimator.Estimator(model_fn).train"),
    "Saver": ("tf.train.Saver is not supported: the Estimator checkpoints model_dir itself",
              "RunConfig(save_checkpoints_steps=..., keep_checkpoint_max=...)"),
    "ProfilerHook": ("tf.train.ProfilerHook is not supported (no TensorFlow timeline here)",
                     None),
}
