"""DLRover's elastic iris pattern: a ShardingClient built with DLRover's arguments feeds a
generator shard by shard, ElasticDataShardReportHook reports each trained batch, and every
record is trained on once per epoch; ReportModelInfoHook logs what DLRover's master gets."""

import logging

import numpy as np
import pytest

from tierserve.core.errors import ConfigError
from tierserve.trainer import tf
from tierserve.trainer.elastic import (
    ElasticDataShardReportHook,
    ReportModelInfoHook,
    ShardingClient,
)

ROWS = 150
BATCH = 32


def model_fn(features, labels, mode, params):
    logits = tf.layers.dense(tf.feature_column.input_layer(
        features, [tf.feature_column.numeric_column("x", shape=(4,))]), 3)
    loss = tf.losses.sparse_softmax_cross_entropy(labels=labels, logits=logits)
    return tf.estimator.EstimatorSpec(
        mode, loss=loss, train_op=tf.train.AdagradOptimizer(0.1).minimize(loss))


def test_shards_are_trained_once_per_epoch_and_reported(tmp_path, caplog):
    client = ShardingClient(dataset_name="iris_data", batch_size=BATCH, num_epochs=3,
                            dataset_size=ROWS, num_minibatches_per_shard=2)
    seen = np.zeros(ROWS, dtype=np.int64)

    def train_generator():
        while True:
            shard = client.fetch_shard()
            if not shard:
                break
            for i in range(shard.start, shard.end):
                seen[i] += 1
                yield [float(i % 5), 1.0, 2.0, 3.0], [i % 3]

    def input_fn():
        ds = tf.data.Dataset.from_generator(train_generator, output_types=(tf.float32, tf.int32),
                                            output_shapes=(4, 1)).shuffle(100).batch(BATCH)
        x, y = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
        return {"x": x}, y

    est = tf.estimator.Estimator(model_fn, str(tmp_path),
                                 config=tf.estimator.RunConfig(save_summary_steps=0))
    with caplog.at_level(logging.INFO, "tierserve.trainer.elastic"):
        est.train(input_fn, hooks=[ElasticDataShardReportHook(client), ReportModelInfoHook()])
    assert (seen == 3).all()  # each record once per epoch
    assert est.get_variable_value("global_step") == -(-3 * ROWS // BATCH)
    assert client.dispatcher.finished() and client.dispatcher.pending() == 0
    logged = caplog.text
    assert "2 dense variables (15 values)" in logged and "steps/s" in logged


def test_dlrovers_constructor_needs_the_dataset_description():
    with pytest.raises(ConfigError, match="dataset_name, batch_size, num_epochs and "
                                          "dataset_size"):
        ShardingClient(dataset_name="x", batch_size=4)
    with pytest.raises(ConfigError, match="task_type 'evaluation'"):
        ShardingClient("x", batch_size=4, num_epochs=1, dataset_size=10,
                       task_type="evaluation")
    client = ShardingClient("named", batch_size=4, num_epochs=1, dataset_size=10)
    assert client.dispatcher.name == "named" and client.fetch_shard().end == 8
