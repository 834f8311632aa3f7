"""A wide-and-deep ``DNNLinearCombinedClassifier`` trained by the Estimator API, run by the
distributed Estimator tests under ``mpiexec -n N`` and as one process.  Settings from the
environment: ``MODEL_DIR``; ``OUT`` (an .npz the chief writes: every variable from the newest
checkpoint and the evaluation metrics; each rank also writes ``OUT.rank<r>.npz`` with the
ids its wide table holds); ``BATCH`` (global batch), ``EPOCHS``, ``ROWS``; ``SHARDED_INPUT``
(the input_fn takes ``input_context`` and reads its own share with ``Dataset.shard``);
``TRAIN_AND_EVALUATE`` (a FinalExporter's export; the chief writes ``OUT`` with what it
returned and its predictions of the first 16 rows); ``CHECKPOINT_SECS`` (checkpoints by time,
else every 6 steps); ``CHIEF_STOP_AT`` (a hook on the chief alone asks to stop at that step);
``DIE_AT`` / ``DIE_RANK`` (that rank kills itself at that step)."""

import os
import signal

import numpy as np

from tierserve.trainer import estimator
from tierserve.trainer import feature_column as fc
from tierserve.trainer.data.dataset import Dataset
from tierserve.trainer.estimator import export, hooks

env = os.environ.get
ROWS = int(env("ROWS", "1025"))
BATCH = int(env("BATCH", "128"))
EPOCHS = int(env("EPOCHS", "2"))

rng = np.random.default_rng(11)
x = rng.normal(size=ROWS).astype(np.float32)
kind = rng.choice(["a", "b", "c", "d", "e"], size=ROWS)
user = rng.integers(0, 400, size=ROWS).astype(np.int64)
label = ((x + (kind == "a") - (user % 3 == 0) + 0.3 * rng.normal(size=ROWS)) > 0.3).astype(
    np.float32)
FEATURES = {"x": x, "kind": kind, "user": user}


def train_input_fn():
    ds = Dataset.from_tensor_slices(({**FEATURES}, label))
    return ds.repeat(EPOCHS).batch(BATCH)


def sharded_train_input_fn(input_context):
    ds = Dataset.from_tensor_slices(({**FEATURES}, label)).repeat(EPOCHS)
    ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return ds.batch(input_context.get_per_replica_batch_size(BATCH))


def eval_input_fn():
    return Dataset.from_tensor_slices(({**FEATURES}, label)).batch(int(env("EVAL_BATCH", "200")))


class DieAt(hooks.SessionRunHook):
    def after_run(self, run_context, run_values):
        if run_context.session.global_step == int(env("DIE_AT")) and \
                env("PMI_RANK") == env("DIE_RANK", "1"):  # MPICH's rank variable
            os.kill(os.getpid(), signal.SIGKILL)


class StopAt(hooks.SessionRunHook):
    """Requests a stop at a step: given to the chief only (the ranks must still agree)."""

    def after_run(self, run_context, run_values):
        if run_context.session.global_step >= int(env("CHIEF_STOP_AT")):
            run_context.request_stop()


kind_col = fc.categorical_column_with_vocabulary_list("kind", ["a", "b", "c", "d", "e"])
user_col = fc.categorical_column_with_hash_bucket("user", 1000, dtype="int64")
saving = ({"save_checkpoints_secs": float(env("CHECKPOINT_SECS"))} if env("CHECKPOINT_SECS")
          else {"save_checkpoints_steps": 6})
config = estimator.RunConfig(save_summary_steps=0, tf_random_seed=5, **saving)
est = estimator.DNNLinearCombinedClassifier(
    model_dir=env("MODEL_DIR"), linear_feature_columns=[kind_col, user_col],
    dnn_feature_columns=[fc.numeric_column("x"), fc.embedding_column(kind_col, 4),
                         fc.embedding_column(user_col, 8)],
    dnn_hidden_units=[16, 8], dnn_optimizer="Adagrad", config=config)

out = env("OUT")
train_fn = sharded_train_input_fn if env("SHARDED_INPUT") else train_input_fn
train_hooks = [DieAt()] if env("DIE_AT") else []
if env("CHIEF_STOP_AT") and config.is_chief:
    train_hooks.append(StopAt())
if env("TRAIN_AND_EVALUATE"):
    receiver = export.build_parsing_serving_input_receiver_fn(fc.make_parse_example_spec(
        [fc.numeric_column("x"), kind_col, user_col]))
    result, exports = est.train_and_evaluate(
        estimator.TrainSpec(train_fn, hooks=train_hooks),
        estimator.EvalSpec(eval_input_fn, steps=None, start_delay_secs=0, throttle_secs=600,
                           exporters=[export.FinalExporter("wide_deep", receiver)]))
    first = {k: v[:16] for k, v in FEATURES.items()}
    predicted = np.array([p["logistic"][0] for p in est.predict(lambda: first)])
    if config.is_chief:
        np.savez(out, auc=result["auc"], global_step=result["global_step"],
                 exports=np.asarray([e.decode() for e in exports]), predicted=predicted)
    else:
        assert result is None and exports == [], (result, exports)
else:
    est.train(train_fn, hooks=train_hooks)
    metrics = est.evaluate(eval_input_fn)
    local = [t for t in est._store.tables.values()]
    held = np.concatenate([np.asarray(getattr(t, "local", t).keys) for t in local])
    np.savez(f"{out}.rank{config.global_id_in_cluster}.npz", held=held,
             is_chief=config.is_chief, task_type=config.task_type,
             workers=config.num_worker_replicas, auc=metrics["auc"], loss=metrics["loss"])
    if config.is_chief:
        names = est.get_variable_names()
        np.savez(out, names=np.asarray(names), auc=metrics["auc"], loss=metrics["loss"],
                 average_loss=metrics["average_loss"], accuracy=metrics["accuracy"],
                 global_step=metrics["global_step"],
                 **{f"v:{n}": est.get_variable_value(n) for n in names})
