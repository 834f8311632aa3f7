"""Benchmark: DNNLinearCombinedClassifier (Wide&Deep through feature columns) training
throughput against the same model on the trainer's Model API and on PyTorch, on the CPU.

    python -m bench.estimator.run                     # default: 2 threads, 40 steps, 3 rounds
    python -m bench.estimator.run --threads 1 --steps 20 --rounds 3 --batch 1024

Model (all three): 13 numeric features and 26 categorical ids (vocabulary ``--vocab`` per
column, power-law keys); deep part: the numeric features and 26 embeddings of dim 16
(sum-pooled) concatenated, 256-128 ReLU, one logit; wide part: one weight per id of each
categorical column, summed; logits added; binary cross entropy; Adagrad (lr 0.01) for every
weight and table.

- Estimator: ``DNNLinearCombinedClassifier`` with ``categorical_column_with_identity`` /
  ``embedding_column`` / ``numeric_column``, fed dicts of raw numpy columns (the feature
  columns' work is part of its step);
- Model API: the same network written with ``hugectr.Model`` (Input with two sparse inputs,
  two SparseEmbeddings, InnerProduct/ReLU/Concat/Reshape/ReduceSum/Add, BinaryCrossEntropy),
  fed ready ``Batch`` objects through ``train_on_batch``;
- PyTorch: ``nn.EmbeddingBag`` (sparse gradients) for both parts, the same MLP,
  ``torch.optim.Adagrad``.

numpy's BLAS and torch get the same thread count; the three alternate step by step over
``--rounds`` passes and the figure is batch / the median step time (robust to bursts of other
work on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings

import numpy as np

os.environ.setdefault("TIERSERVE_FORCE_CPU", "1")
os.environ.setdefault("TIERSERVE_NO_PROGRESS", "1")

import tierserve.trainer as hugectr  # noqa: E402
from tierserve.model.batch import Batch, SparseInput  # noqa: E402
from tierserve.model.blas_threads import set_blas_threads  # noqa: E402
from tierserve.trainer import estimator  # noqa: E402
from tierserve.trainer import feature_column as fc  # noqa: E402

DIM = 16
HIDDEN = [256, 128]
LR = 0.01
NUM = 13
CAT = 26


def make_data(steps: int, batch: int, vocab: int, seed: int = 0) -> list[tuple[dict, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        feats = {f"I{i}": rng.lognormal(size=batch).astype(np.float32) for i in range(NUM)}
        for i in range(CAT):
            feats[f"C{i}"] = np.minimum(rng.zipf(1.2, size=batch) - 1, vocab - 1).astype(np.int64)
        label = (rng.random(batch) < 0.25).astype(np.float32)
        out.append((feats, label))
    return out


# -- Estimator ------------------------------------------------------------------------------

def build_estimator(vocab: int, model_dir: str):
    cats = [fc.categorical_column_with_identity(f"C{i}", vocab) for i in range(CAT)]
    nums = [fc.numeric_column(f"I{i}") for i in range(NUM)]
    deep = nums + [fc.embedding_column(c, DIM, combiner="sum") for c in cats]
    cfg = estimator.RunConfig(save_checkpoints_steps=None, save_checkpoints_secs=None,
                              save_summary_steps=0, log_step_count_steps=0)
    return estimator.DNNLinearCombinedClassifier(
        model_dir=model_dir, linear_feature_columns=cats, dnn_feature_columns=deep,
        dnn_hidden_units=HIDDEN, linear_optimizer=estimator.train.AdagradOptimizer(LR, 0.0),
        dnn_optimizer=estimator.train.AdagradOptimizer(LR, 0.0), config=cfg)


def estimator_stepper(est, data):
    """One training step per call on data[i] (the program built once, hooks none)."""
    from tierserve.trainer.estimator.spec import ModeKeys

    feats, label = data[0]
    prog = est._program(ModeKeys.TRAIN, feats, label)

    def step(i):
        feats, label = data[i]
        prog.run(feats, label, training=True)
        est._store.global_step += 1

    return step


# -- Model API ------------------------------------------------------------------------------

def build_model_api(vocab: int, batch: int, workdir: str) -> hugectr.Model:
    solver = hugectr.CreateSolver(batchsize=batch, batchsize_eval=batch, lr=LR,
                                  repeat_dataset=True, i64_input_key=True)
    reader = hugectr.DataReaderParams(data_reader_type=hugectr.DataReaderType_t.Norm,
                                      source=[os.path.join(workdir, "none.txt")],
                                      eval_source=os.path.join(workdir, "none.txt"),
                                      check_type=hugectr.Check_t.Sum)
    opt = hugectr.CreateOptimizer(optimizer_type=hugectr.Optimizer_t.AdaGrad,
                                  update_type=hugectr.Update_t.Local, epsilon=1e-7)
    model = hugectr.Model(solver, reader, opt)
    model.add(hugectr.Input(label_dim=1, label_name="label", dense_dim=NUM, dense_name="dense",
                            data_reader_sparse_param_array=[
                                hugectr.DataReaderSparseParam("deep_keys", 1, True, CAT),
                                hugectr.DataReaderSparseParam("wide_keys", 1, True, CAT)]))
    mb = int(CAT * vocab * 2 * 4 * DIM / 2**20) + 8
    for name, bottom, dim in (("deep", "deep_keys", DIM), ("wide", "wide_keys", 1)):
        model.add(hugectr.SparseEmbedding(
            embedding_type=hugectr.Embedding_t.DistributedSlotSparseEmbeddingHash,
            workspace_size_per_gpu_in_mb=mb, embedding_vec_size=dim, combiner="sum",
            sparse_embedding_name=name, bottom_name=bottom))
    D = hugectr.DenseLayer
    T = hugectr.Layer_t
    model.add(D(layer_type=T.Reshape, bottom_names=["deep"], top_names=["deep_flat"],
                leading_dim=CAT * DIM))
    model.add(D(layer_type=T.Concat, bottom_names=["dense", "deep_flat"], top_names=["x0"]))
    bottom = "x0"
    for i, n in enumerate(HIDDEN):
        model.add(D(layer_type=T.InnerProduct, bottom_names=[bottom], top_names=[f"fc{i}"],
                    num_output=n))
        model.add(D(layer_type=T.ReLU, bottom_names=[f"fc{i}"], top_names=[f"relu{i}"]))
        bottom = f"relu{i}"
    model.add(D(layer_type=T.InnerProduct, bottom_names=[bottom], top_names=["deep_logit"],
                num_output=1))
    model.add(D(layer_type=T.Reshape, bottom_names=["wide"], top_names=["wide_flat"],
                leading_dim=CAT))
    model.add(D(layer_type=T.ReduceSum, bottom_names=["wide_flat"], top_names=["wide_logit"],
                axis=1))
    model.add(D(layer_type=T.Add, bottom_names=["deep_logit", "wide_logit"],
                top_names=["logit"]))
    model.add(D(layer_type=T.BinaryCrossEntropyLoss, bottom_names=["logit", "label"],
                top_names=["loss"]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.compile()
    return model


def model_batches(data, vocab: int) -> list[Batch]:
    out = []
    offsets = np.arange(CAT, dtype=np.int64) * vocab
    for feats, label in data:
        b = len(label)
        dense = np.stack([feats[f"I{i}"] for i in range(NUM)], axis=1)
        keys = np.stack([feats[f"C{i}"] for i in range(CAT)], axis=1) + offsets
        sp = SparseInput(keys.reshape(-1), np.arange(b * CAT + 1, dtype=np.int64), CAT)
        out.append(Batch(label.reshape(-1, 1), dense, (sp, sp)))
    return out


# -- PyTorch --------------------------------------------------------------------------------

def torch_stepper(data, vocab: int):
    import torch
    from torch import nn

    class WideDeep(nn.Module):
        def __init__(self):
            super().__init__()
            self.deep = nn.EmbeddingBag(CAT * vocab, DIM, mode="sum", sparse=True)
            self.wide = nn.EmbeddingBag(CAT * vocab, 1, mode="sum", sparse=True)
            dims = [NUM + CAT * DIM, *HIDDEN]
            layers = [m for a, b in zip(dims, dims[1:]) for m in (nn.Linear(a, b), nn.ReLU())]
            self.mlp = nn.Sequential(*layers, nn.Linear(dims[-1], 1))

        def forward(self, dense, keys):
            b = dense.shape[0]
            flat = keys.reshape(-1)
            deep = self.deep(flat, torch.arange(0, b * CAT, dtype=torch.int64)).reshape(b, -1)
            wide = self.wide(flat, torch.arange(0, b * CAT, CAT, dtype=torch.int64))
            return self.mlp(torch.cat([dense, deep], 1)) + wide

    model = WideDeep()
    opt = torch.optim.Adagrad(model.parameters(), lr=LR, eps=1e-7)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    offsets = np.arange(CAT, dtype=np.int64) * vocab
    batches = []
    for feats, label in data:
        dense = np.stack([feats[f"I{i}"] for i in range(NUM)], axis=1)
        keys = np.stack([feats[f"C{i}"] for i in range(CAT)], axis=1) + offsets
        batches.append((torch.from_numpy(dense), torch.from_numpy(keys),
                        torch.from_numpy(label.reshape(-1, 1))))

    def step(i):
        dense, keys, label = batches[i]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(dense, keys), label)
        loss.backward()
        opt.step()

    return step


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=20000)
    ap.add_argument("--no-torch", action="store_true")
    args = ap.parse_args(argv)
    set_blas_threads(args.threads)
    data = make_data(args.steps, args.batch, args.vocab)
    sides = {}
    with tempfile.TemporaryDirectory() as tmp:
        est = build_estimator(args.vocab, os.path.join(tmp, "est"))
        sides["estimator"] = estimator_stepper(est, data)
        model = build_model_api(args.vocab, args.batch, tmp)
        batches = model_batches(data, args.vocab)
        sides["model_api"] = lambda i: model.train_on_batch(batches[i])
        if not args.no_torch:
            try:
                import torch

                torch.set_num_threads(args.threads)
                sides["torch"] = torch_stepper(data, args.vocab)
            except ImportError:
                print("torch is not installed: the PyTorch peer is skipped", file=sys.stderr)
        for fn in sides.values():  # warm up: first touches of every table row
            for i in range(min(3, args.steps)):
                fn(i)
        times: dict[str, list[float]] = {k: [] for k in sides}
        for _ in range(args.rounds):
            for i in range(args.steps):
                for name, fn in sides.items():
                    t = time.perf_counter()
                    fn(i)
                    times[name].append(time.perf_counter() - t)
    # the median step: robust to the bursts of other work on a shared machine
    result = {k: round(args.batch / statistics.median(v)) for k, v in times.items()}
    result["estimator_vs_model_api"] = round(result["estimator"] / result["model_api"], 3)
    if "torch" in result:
        result["estimator_vs_torch"] = round(result["estimator"] / result["torch"], 3)
    print(json.dumps({"threads": args.threads, "batch": args.batch, "steps": args.steps,
                      "rounds": args.rounds, "samples_per_s": result}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
