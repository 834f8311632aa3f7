"""The TensorFlow side of :mod:`bench.estimator.tf_peer`, run by the TensorFlow 2.15 virtual
environment's Python (it imports TensorFlow and numpy, never tierserve):

    python tf_peer_worker.py SPEC.json OUT_DIR

For each model of the spec: the parity run (``parity_steps`` steps on fixed batches from
TensorFlow's own initialisation; the per-step losses and the step-0 checkpoint's variables are
written to ``OUT_DIR/<model>.parity.npz`` with the held-out scores after them) and the
quality runs (``steps`` steps per seed on
shuffled batches, then the held-out scores and the training time), all in
``OUT_DIR/results.json``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tf_peer_models as models  # noqa: E402

tf.get_logger().setLevel("ERROR")
NS = SimpleNamespace(estimator=tf.estimator, fc=tf.feature_column,
                     numpy_input_fn=tf.compat.v1.estimator.inputs.numpy_input_fn,
                     adagrad=tf.keras.optimizers.legacy.Adagrad, run_config={},
                     absent_ids_as_initial=None)


class _LossHook(tf.estimator.SessionRunHook):
    def __init__(self, loss, into: list) -> None:
        self.loss, self.into = loss, into

    def before_run(self, run_context):
        return tf.estimator.SessionRunArgs(self.loss)

    def after_run(self, run_context, run_values):
        self.into.append(float(run_values.results))


def _recording(est, into: list):
    """``est`` with a hook that records each training step's loss."""
    def model_fn(features, labels, mode, config):
        spec = est.model_fn(features, labels, mode, config)
        if mode == tf.estimator.ModeKeys.TRAIN:
            spec = spec._replace(training_hooks=[*spec.training_hooks,
                                                 _LossHook(spec.loss, into)])
        return spec

    return tf.estimator.Estimator(model_fn, model_dir=est.model_dir, config=est.config)


def parity(name: str, kind: str, data: dict, spec: dict, out: Path) -> None:
    steps, batch = spec["parity_steps"], spec["batch"]
    rows = np.arange(steps * batch) % spec["train_rows"]
    model_dir = tempfile.mkdtemp(prefix=f"tf-{name}-")
    est = models.build(name, NS, model_dir, spec["parity_seed"], spec["meta"], parity=True)
    losses: list[float] = []
    fn = NS.numpy_input_fn(models.features(data, rows), models.labels_for(kind, data)[rows],
                           batch_size=batch, shuffle=False, num_epochs=1)
    _recording(est, losses).train(fn, steps=steps)
    reader = tf.train.load_checkpoint(os.path.join(model_dir, "model.ckpt-0"))
    variables = {f"var:{k}": reader.get_tensor(k)
                 for k in reader.get_variable_to_shape_map()}
    np.savez(out / f"{name}.parity.npz", losses=np.asarray(losses, np.float64),
             scores=np.asarray(models.held_out_scores(est, kind, NS, data, spec)), **variables)


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    threads = spec["threads"]
    NS.run_config = {"session_config": tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=threads, inter_op_parallelism_threads=threads)}
    data = dict(np.load(spec["data"], allow_pickle=False))
    results = {"tensorflow": tf.__version__}
    for name in spec["models"]:
        _, kind, in_quality = models.MODELS[name]
        t0 = time.perf_counter()
        if spec["parity_steps"]:
            parity(name, kind, data, spec, out)
        results[name] = (models.quality_runs(name, NS, data, spec, "tf")
                         if in_quality and spec["seeds"] else [])
        print(f"tensorflow {name}: {time.perf_counter() - t0:.1f}s", flush=True)
    (out / "results.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
