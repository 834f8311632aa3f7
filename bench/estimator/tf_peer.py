"""Benchmark: tierserve's Estimator against TensorFlow 2.15's on the same scripts and data.

    python -m bench.estimator.tf_peer --install     # once: TF 2.15 into its own venv
    python -m bench.estimator.tf_peer               # every model, 3 seeds
    python -m bench.estimator.tf_peer --models wide_deep,dnn --seeds 0,1,2,3,4

TensorFlow is never a dependency of the project: ``--install`` creates
``~/.cache/tierserve/tf215-venv`` (``tensorflow-cpu==2.15.1``, ``tensorflow-estimator==2.15.0``,
Python 3.11) and the TensorFlow side runs there (``tf_peer_worker.py``); ``--tf-python``
points at another interpreter with them.

The models (``tf_peer_models.py``, one script for both with only the imports changed) are the
canned ``LinearClassifier``, ``DNNClassifier``, ``DNNLinearCombinedClassifier`` and the three
regressors over numeric, bucketized, hash-bucket, vocabulary-list (with and without OOV
buckets), crossed, indicator and embedding columns, with default and named optimizers, a
weight column, batch norm, dropout, 3 classes and a 2-wide regression label.  Data: the
Criteo sample (``../shared/data/criteo``), integer features ``log1p``-scaled, first 6,000
rows for training, last 2,000 held out.  Two checks per model:

1. parity: TensorFlow trains ``--parity-steps`` steps on fixed batches; its step-0 checkpoint
   (read with ``tf.train.load_checkpoint``) is copied into tierserve's variables, which then
   train on the same batches: the largest per-step loss difference over the first 50 steps
   and over all is printed (dropout off), and both models' held-out AUC after them.
   This is the test of every default (optimizer, learning rate, loss reduction, hashing,
   layer order) and every op: with one of them different the losses part within steps.
2. quality: each trains ``--steps`` steps of ``--batch`` shuffled rows from its own
   initialisation, once per seed; the held-out AUC (exact, over the predictions) mean and
   spread, their difference, and the training time of each (its ratio: the speed-up).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

os.environ.setdefault("TIERSERVE_NO_PROGRESS", "1")
os.environ.setdefault("TIERSERVE_FORCE_CPU", "1")

from bench.estimator import tf_peer_models as models  # noqa: E402

REPOSITORY = Path(__file__).resolve().parents[2]
DATA = REPOSITORY.parent / "shared" / "data" / "criteo" / "criteo_kaggle_head8k.csv"
VENV = Path.home() / ".cache" / "tierserve" / "tf215-venv"
TF_PACKAGES = ["tensorflow-cpu==2.15.1", "tensorflow-estimator==2.15.0"]
TRAIN_ROWS = 6000
#: TensorFlow variables that are optimizer or step state, not model variables
_OPTIMIZER_STATE = ("/Adagrad", "/Adam", "/Ftrl", "/SGD", "/accumulator", "/linear",
                    "/m", "/v", "global_step", "training/", "/iter", "/beta_1", "/beta_2",
                    "/decay", "/learning_rate", "/momentum", "/rho", "_power")


def install(venv: Path) -> Path:
    """Create ``venv`` with TensorFlow 2.15 (Python 3.11, as TF 2.15 supports)."""
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"creating {venv} ...", flush=True)
        subprocess.run(["python3.11", "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *TF_PACKAGES], check=True)
    return python


def load(path: Path) -> tuple[dict, dict]:
    """The Criteo sample as feature arrays plus each model kind's labels, and the vocabularies
    (from the training rows)."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    cols = dict(zip(rows[0], zip(*rows[1:])))
    data: dict[str, np.ndarray] = {"label": np.asarray(cols["label"], np.float32)}
    for k in models.INTS:
        x = np.asarray([float(v) if v else 0.0 for v in cols[k]], np.float32)
        data[k] = np.log1p(np.maximum(x, 0)).astype(np.float32)
    for k in models.CATS:
        data[k] = np.asarray(cols[k])
    data["w"] = (0.5 + data["label"]).astype(np.float32)  # the weight column
    data["label3"] = (data["label"] + (data["I1"] > 1.0)).astype(np.int64)
    data["label2"] = np.stack([data["label"], data["I2"]], axis=1).astype(np.float32)

    def top(key: str, n: int) -> list[str]:
        values, counts = np.unique(data[key][:TRAIN_ROWS], return_counts=True)
        keep = values[np.argsort(-counts, kind="stable")]
        return [str(v) for v in keep if v != ""][:n]

    return data, {"vocab_C9": top("C9", 30), "vocab_C6": top("C6", 5)}


# -- tierserve's side --------------------------------------------------------------------------


@contextlib.contextmanager
def _absent_ids_as_initial():
    """Evaluation reads an id no training step looked up as its initial vector, as
    TensorFlow's embedding variables hold every row from the start (tierserve reads zeros):
    to attribute an AUC difference to that rule."""
    from tierserve.trainer.estimator.tables import ColumnTable

    ColumnTable.absent_reads_initial = True
    try:
        yield
    finally:
        ColumnTable.absent_reads_initial = False


def _ours() -> SimpleNamespace:
    from tierserve.trainer import estimator, feature_column

    return SimpleNamespace(estimator=estimator, fc=feature_column,
                           numpy_input_fn=estimator.inputs.numpy_input_fn,
                           adagrad=estimator.train.Adagrad, run_config={},
                           absent_ids_as_initial=_absent_ids_as_initial)


def _assign(est, tf_vars: dict[str, np.ndarray]) -> None:
    """Copy TensorFlow's variables into ``est``'s (its training program built): same names,
    except the linear model's per-column weights of dense columns, which tierserve holds as
    one kernel over the dense input (its rows in column-name order)."""
    store = est._store
    known = set(store.dense) | set(store.state) | {
        d for info in store.table_info.values() for d in info.display}
    dense_weights: dict[str, np.ndarray] = {}
    for name, value in tf_vars.items():
        if name in known:
            store.assign(name, value)
        elif name.startswith("linear/linear_model/") and name.endswith("/weights"):
            dense_weights[name[len("linear/linear_model/"):-len("/weights")]] = value
        elif not any(s in name for s in _OPTIMIZER_STATE):
            raise SystemExit(f"TensorFlow variable {name!r} has no counterpart here")
    if dense_weights:
        kernel = [k for k in store.dense if k.endswith("linear_model/dense/kernel")]
        if len(kernel) != 1:
            raise SystemExit(f"linear weights {sorted(dense_weights)} but kernels {kernel}")
        store.assign(kernel[0], np.concatenate([dense_weights[c] for c in sorted(dense_weights)]))


def ours_parity(name: str, kind: str, data: dict, spec: dict, tf_vars: dict
                ) -> tuple[list[float], list[float]]:
    """The per-step losses of training from TensorFlow's initial variables on the parity
    batches, and the held-out scores after."""
    from tierserve.trainer.estimator import SessionRunArgs, SessionRunHook
    from tierserve.trainer.estimator.spec import ModeKeys

    ns = _ours()
    losses: list[float] = []

    class Record(SessionRunHook):
        def before_run(self, run_context):
            return SessionRunArgs("loss")

        def after_run(self, run_context, run_values):
            losses.append(float(run_values.results))

    steps, batch = spec["parity_steps"], spec["batch"]
    rows = np.arange(steps * batch) % TRAIN_ROWS
    est = models.build(name, ns, tempfile.mkdtemp(prefix=f"ts-{name}-"),
                       spec["parity_seed"], spec["meta"], parity=True)
    fn = ns.numpy_input_fn(models.features(data, rows), models.labels_for(kind, data)[rows],
                           batch_size=batch, shuffle=False, num_epochs=1)
    feats, labels = next(iter(fn()))
    est._program(ModeKeys.TRAIN, feats, est._labels_for(labels))  # the variables, built
    _assign(est, tf_vars)
    est.train(fn, hooks=[Record()], steps=steps)
    return losses, models.held_out_scores(est, kind, ns, data, spec)


# -- the run ---------------------------------------------------------------------------------


def run_tensorflow(python: Path, spec: dict, workdir: Path) -> dict:
    spec_path = workdir / "spec.json"
    spec_path.write_text(json.dumps(spec))
    worker = Path(__file__).resolve().parent / "tf_peer_worker.py"
    subprocess.run([str(python), str(worker), str(spec_path), str(workdir)], check=True)
    return json.loads((workdir / "results.json").read_text())


def _auc(labels: np.ndarray, runs: list[dict]) -> list[float]:
    from tierserve.trainer.metrics import auc_score

    return [auc_score(labels, np.asarray(r["scores"])) for r in runs]


def _spread(values: list[float]) -> str:
    if not values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.4f} +- {sd:.4f}"


def _parity_line(spec: dict, parity: dict) -> None:
    print(f"\nparity: {spec['parity_steps']} steps from TF's step-0 variables on the same "
          f"batches (dropout off)\n{'model':<20} {'max |dloss| 50':>14} "
          f"{'max |dloss| all':>15} {'TF AUC':>8} {'ts AUC':>8} {'diff':>8}")
    for name, p in parity.items():
        print(f"{name:<20} {p['max_dloss_50']:>14.2e} {p['max_dloss']:>15.2e} "
              f"{p['tf_auc']:>8.4f} {p['ours_auc']:>8.4f} "
              f"{p['ours_auc'] - p['tf_auc']:>+8.4f}")


def report(spec: dict, data: dict, tf_results: dict, ours: dict, parity: dict) -> list[dict]:
    held_out = data["label"][TRAIN_ROWS:]
    rows = []
    _parity_line(spec, parity)
    head = (f"{'model':<20} {'TF AUC':>17} {'tierserve AUC':>17} "
            f"{'diff':>8} {'diff*':>8} {'TF s':>6} {'ts s':>6} {'speed':>6}")
    print(f"\nTensorFlow {tf_results.get('tensorflow')} vs tierserve, each from its own "
          f"initialisation: {spec['steps']} steps x {spec['batch']}, seeds {spec['seeds']}, "
          f"{spec['threads']} thread(s) each; diff*: with ids never trained read as TF reads "
          f"them (their initial vector, not zeros)\n{head}")
    for name in spec["models"]:
        tf_auc = _auc(held_out, tf_results.get(name, []))
        our_auc = _auc(held_out, ours.get(name, []))
        as_tf = _auc(held_out, [{"scores": r["scores_tf_absent"]} for r in ours.get(name, [])])
        tf_s = [r["train_seconds"] for r in tf_results.get(name, [])]
        our_s = [r["train_seconds"] for r in ours.get(name, [])]
        diff = (statistics.mean(our_auc) - statistics.mean(tf_auc)) if tf_auc else None
        diff_tf = (statistics.mean(as_tf) - statistics.mean(tf_auc)) if tf_auc else None
        speed = (statistics.median(tf_s) / statistics.median(our_s)) if our_s else None
        row = {"model": name, "what": models.MODELS[name][0], "parity": parity.get(name),
               "tf_auc": tf_auc, "ours_auc": our_auc, "auc_diff": diff,
               "ours_auc_absent_as_tf": as_tf, "auc_diff_absent_as_tf": diff_tf,
               "tf_seconds": tf_s, "ours_seconds": our_s, "speedup": speed}
        rows.append(row)
        print(f"{name:<20} {_spread(tf_auc):>17} {_spread(our_auc):>17} "
              f"{'-' if diff is None else f'{diff:+.4f}':>8} "
              f"{'-' if diff_tf is None else f'{diff_tf:+.4f}':>8} "
              f"{statistics.median(tf_s) if tf_s else 0:>6.1f} "
              f"{statistics.median(our_s) if our_s else 0:>6.1f} "
              f"{'-' if speed is None else f'{speed:.2f}x':>6}")
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--install", action="store_true", help=f"create {VENV} with TF 2.15")
    p.add_argument("--tf-python", type=Path, default=VENV / "bin" / "python")
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--models", default=",".join(models.MODELS))
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--parity-steps", type=int, default=150)
    p.add_argument("--threads", type=int, default=1,
                   help="TF's intra/inter-op threads and numpy's BLAS threads")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)
    if args.install:
        install(args.tf_python.parent.parent)
    if not args.tf_python.exists():
        raise SystemExit(f"{args.tf_python} does not exist: run with --install first")
    if not args.data.is_file():
        raise SystemExit(f"the Criteo sample {args.data} is missing")
    names = [m for m in args.models.split(",") if m]
    unknown = sorted(set(names) - set(models.MODELS))
    if unknown:
        raise SystemExit(f"unknown models {unknown}; known: {', '.join(models.MODELS)}")
    data, meta = load(args.data)
    workdir = Path(tempfile.mkdtemp(prefix="tf-peer-"))
    np.savez(workdir / "data.npz", **data)
    spec = {"data": str(workdir / "data.npz"), "models": names, "meta": meta,
            "seeds": [int(s) for s in args.seeds.split(",") if s != ""], "steps": args.steps,
            "batch": args.batch, "parity_steps": args.parity_steps, "train_rows": TRAIN_ROWS,
            "parity_seed": 0, "threads": args.threads}
    from tierserve.model.blas_threads import set_blas_threads

    set_blas_threads(args.threads)
    tf_results = run_tensorflow(args.tf_python, spec, workdir)
    ours: dict[str, list] = {}
    parity: dict[str, dict] = {}
    for name in names:
        _, kind, in_quality = models.MODELS[name]
        t0 = time.perf_counter()
        if args.parity_steps:
            saved = np.load(workdir / f"{name}.parity.npz")
            tf_vars = {k[4:]: saved[k] for k in saved.files if k.startswith("var:")}
            mine, my_scores = ours_parity(name, kind, data, spec, tf_vars)
            theirs = saved["losses"]
            if len(mine) != len(theirs):
                raise SystemExit(f"{name}: {len(mine)} steps here, {len(theirs)} in TF")
            gap = np.abs(np.asarray(mine) - theirs)
            held_out = data["label"][TRAIN_ROWS:]
            parity[name] = {"max_dloss_50": float(gap[:50].max()), "max_dloss": float(gap.max()),
                            "tf_auc": _auc(held_out, [{"scores": saved["scores"]}])[0],
                            "ours_auc": _auc(held_out, [{"scores": my_scores}])[0]}
            print(f"  parity {name}: TF loss {theirs[0]:.5f} -> {theirs[-1]:.5f}, tierserve "
                  f"{mine[0]:.5f} -> {mine[-1]:.5f}", flush=True)
        ours[name] = (models.quality_runs(name, _ours(), data, spec, "ts")
                      if in_quality and spec["seeds"] else [])
        print(f"tierserve {name}: {time.perf_counter() - t0:.1f}s", flush=True)
    rows = report(spec, data, tf_results, ours, parity)
    if args.json:
        args.json.write_text(json.dumps({"spec": {k: v for k, v in spec.items() if k != "data"},
                                         "rows": rows}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
