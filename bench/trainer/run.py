"""Benchmark: tierserve's trainer against a PyTorch DLRM in the same run, on the CPU.

    python -m bench.trainer.run                      # throughput (+ Criteo AUC when present)
    python -m bench.trainer.run --threads 1,2 --steps 30 --rounds 3

Model (both sides): 26 embedding tables of dim 16 (one-hot, power-law keys, ~1M keys in
all), bottom MLP 13-512-256-16 with ReLU, DLRM dot interaction (HugeCTR layout: 16 + 351 + 1
zero = 368), top MLP 368-512-256-1, binary cross entropy, Adagrad for dense and embedding
weights (lr 0.01, eps 1e-7, accumulators from 0), batch 2048.  The peer is PyTorch:
``nn.EmbeddingBag(mode="sum", sparse=True)`` per table, the same MLPs, ``torch.optim.Adagrad``
(which takes sparse gradients).  Both train on the same in-memory batches (read once with
tierserve's reader from generated Norm files), so the figure is training-step throughput.
numpy's BLAS and torch get the same thread count (``--threads``); at one thread tierserve's
dense layers multiply with MKL's sequential GEMM where the ``mkl`` extra is installed
(``TIERSERVE_BLAS=numpy`` keeps numpy's OpenBLAS; the output names the library); subject and peer
alternate step by step (so both see the same machine load), ``--rounds`` passes over the
batches, and the figure is the median samples/s of the passes; the median CPU time of the
process a step (all threads) is printed beside.

AUC check (when the Criteo sample is present): both train the same DLRM (dim 16, tables
sized by the converter's vocabularies) from the *same* initial weights (torch's are copied
from tierserve's) on the first 6,000 rows for the same number of steps, then score the last
2,000 rows.  They must agree within 0.01.
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
from pathlib import Path

import numpy as np

os.environ.setdefault("TIERSERVE_FORCE_CPU", "1")
os.environ.setdefault("TIERSERVE_NO_PROGRESS", "1")

import tierserve.trainer as hugectr  # noqa: E402
from tierserve.model.blas import uses_mkl  # noqa: E402
from tierserve.model.blas_threads import get_blas_threads, set_blas_threads  # noqa: E402
from tierserve.trainer.metrics import auc_score  # noqa: E402

CRITEO = Path(__file__).resolve().parents[2].parent / "shared/data/criteo/criteo_kaggle_head8k.csv"
DIM = 16
BOTTOM = [512, 256, DIM]
TOP = [512, 256, 1]
LR = 0.01
EPS = 1e-7


# -- tierserve ------------------------------------------------------------------------------

def build_tierserve(source: str, eval_source: str, batch: int, slot_num: int,
                    workspace_mb: int, lr: float = LR) -> hugectr.Model:
    solver = hugectr.CreateSolver(batchsize=batch, batchsize_eval=batch, lr=lr,
                                  repeat_dataset=True, i64_input_key=True, max_eval_batches=1)
    reader = hugectr.DataReaderParams(data_reader_type=hugectr.DataReaderType_t.Norm,
                                      source=[source], eval_source=eval_source,
                                      check_type=hugectr.Check_t.Sum)
    opt = hugectr.CreateOptimizer(optimizer_type=hugectr.Optimizer_t.AdaGrad,
                                  update_type=hugectr.Update_t.Local, epsilon=EPS)
    model = hugectr.Model(solver, reader, opt)
    model.add(hugectr.Input(label_dim=1, label_name="label", dense_dim=13, dense_name="dense",
                            data_reader_sparse_param_array=[
                                hugectr.DataReaderSparseParam("data1", 1, True, slot_num)]))
    model.add(hugectr.SparseEmbedding(
        embedding_type=hugectr.Embedding_t.DistributedSlotSparseEmbeddingHash,
        workspace_size_per_gpu_in_mb=workspace_mb, embedding_vec_size=DIM, combiner="sum",
        sparse_embedding_name="emb", bottom_name="data1"))
    bottom = "dense"
    for i, n in enumerate(BOTTOM):
        model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.FusedInnerProduct,
                                     bottom_names=[bottom], top_names=[f"b{i}"], num_output=n))
        bottom = f"b{i}"
    model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.Interaction,
                                 bottom_names=[bottom, "emb"], top_names=["inter"]))
    bottom = "inter"
    for i, n in enumerate(TOP):
        kind = hugectr.Layer_t.InnerProduct if n == 1 else hugectr.Layer_t.FusedInnerProduct
        model.add(hugectr.DenseLayer(layer_type=kind, bottom_names=[bottom],
                                     top_names=[f"t{i}"], num_output=n))
        bottom = f"t{i}"
    model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.BinaryCrossEntropyLoss,
                                 bottom_names=[bottom, "label"], top_names=["loss"]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.compile()
    model.set_learning_rate(lr)
    return model


def read_batches(model: hugectr.Model, n: int, eval: bool = False) -> list:
    reader = model.get_data_reader_eval() if eval else model.get_data_reader_train()
    out = []
    for _ in range(n):
        batch = reader.next_batch()
        if batch is None:
            break
        out.append(batch)
    return out


# -- PyTorch peer ---------------------------------------------------------------------------

def torch_model(vocab: list[int]):
    import torch
    from torch import nn

    class DLRM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embs = nn.ModuleList(nn.EmbeddingBag(v, DIM, mode="sum", sparse=True)
                                      for v in vocab)
            dims = [13, *BOTTOM]
            self.bottom = nn.Sequential(*[m for a, b in zip(dims, dims[1:])
                                          for m in (nn.Linear(a, b), nn.ReLU())])
            n = len(vocab) + 1
            self.rows, self.cols = (torch.as_tensor(a) for a in np.tril_indices(n, -1))
            dims = [DIM + n * (n - 1) // 2 + 1, *TOP]
            layers = []
            for a, b in zip(dims, dims[1:]):
                layers += [nn.Linear(a, b)] + ([nn.ReLU()] if b != 1 else [])
            self.top = nn.Sequential(*layers)

        def forward(self, dense, keys, offsets):
            x = self.bottom(dense)
            e = torch.stack([emb(keys[:, s], offsets) for s, emb in enumerate(self.embs)], 1)
            z = torch.cat([x[:, None], e], 1)
            zz = torch.bmm(z, z.transpose(1, 2))
            pad = torch.zeros(x.shape[0], 1)
            return self.top(torch.cat([x, zz[:, self.rows, self.cols], pad], 1))

    return DLRM()


def torch_batches(batches: list, offsets: np.ndarray) -> list:
    """(dense, per-slot local keys [B, S], label) tensors of one-hot batches."""
    import torch

    out = []
    for b in batches:
        sp = b.sparse[0]
        keys = np.asarray(sp.keys, dtype=np.int64).reshape(-1, sp.slot_num) - offsets
        out.append((torch.from_numpy(np.ascontiguousarray(b.dense)),
                    torch.from_numpy(np.ascontiguousarray(keys)),
                    torch.from_numpy(np.ascontiguousarray(b.label))))
    return out


def torch_trainer(model, lr: float = LR):
    import torch

    opt = torch.optim.Adagrad(model.parameters(), lr=lr, eps=EPS, initial_accumulator_value=0.0)
    loss_fn = torch.nn.BCEWithLogitsLoss()

    def step(batch):
        dense, keys, label = batch
        offsets = torch.arange(keys.shape[0])
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(dense, keys, offsets), label)
        loss.backward()
        opt.step()
        return float(loss.detach())

    return step


def torch_predict(model, batch) -> np.ndarray:
    import torch

    dense, keys, _ = batch
    with torch.no_grad():
        return torch.sigmoid(model(dense, keys, torch.arange(keys.shape[0]))).numpy()


def fill_table(model: hugectr.Model, num_keys: int) -> None:
    """Insert keys 0..num_keys-1 into the model's table (as evaluation would)."""
    from tierserve.model.batch import SparseInput

    for start in range(0, num_keys, 1 << 18):
        keys = np.arange(start, min(num_keys, start + (1 << 18)), dtype=np.int64)
        model.tables[0].forward(SparseInput(keys, np.arange(len(keys) + 1, dtype=np.int64), 1),
                                "sum", training=False)


def copy_weights(ours: hugectr.Model, peer, vocab: list[int], offsets: np.ndarray) -> None:
    """Give the torch model tierserve's initial dense weights and embedding vectors."""
    import torch

    from tierserve.model.batch import SparseInput

    params = ours.dense_parameters()  # W[in, out], b[out] per layer, in graph order
    linears = [m for m in [*peer.bottom, *peer.top] if isinstance(m, torch.nn.Linear)]
    with torch.no_grad():
        for i, lin in enumerate(linears):
            lin.weight.copy_(torch.from_numpy(params[2 * i].T.copy()))
            lin.bias.copy_(torch.from_numpy(params[2 * i + 1]))
        table = ours.tables[0]
        for s, (emb, v) in enumerate(zip(peer.embs, vocab)):
            keys = np.arange(v, dtype=np.int64) + offsets[s]
            vectors = table.forward(SparseInput(keys, np.arange(v + 1, dtype=np.int64), 1),
                                    "sum", training=False).reshape(v, DIM)
            emb.weight.copy_(torch.from_numpy(np.asarray(vectors)))


# -- runs -----------------------------------------------------------------------------------

def throughput(args) -> dict:
    import torch

    slot_sizes = [args.keys // 26] * 26
    with tempfile.TemporaryDirectory() as tmp:
        hugectr.DataGenerator(hugectr.DataGeneratorParams(
            format=hugectr.DataReaderType_t.Norm, label_dim=1, dense_dim=13, num_slot=26,
            i64_input_key=True, source=f"{tmp}/file_list.txt",
            eval_source=f"{tmp}/file_list_test.txt", slot_size_array=slot_sizes,
            dist_type=hugectr.tools.Distribution_t.PowerLaw, alpha=1.2,
            num_files=4, eval_num_files=1, num_samples_per_file=args.batch * args.steps // 4,
        )).generate()
        ours = build_tierserve(f"{tmp}/file_list.txt", f"{tmp}/file_list_test.txt", args.batch,
                               26, workspace_mb=1024)
        batches = read_batches(ours, args.steps)
    offsets = np.concatenate([[0], np.cumsum(slot_sizes)[:-1]]).astype(np.int64)
    fill_table(ours, sum(slot_sizes))  # every key in the table, as torch's tables hold them
    peer = torch_model(slot_sizes)
    peer_batches = torch_batches(batches, offsets)
    peer_step = torch_trainer(peer)
    results = {}
    for threads in args.threads:
        set_blas_threads(threads)
        torch.set_num_threads(threads)
        ours_rates, peer_rates, ours_cpu, peer_cpu = [], [], [], []
        for b, pb in zip(batches[:2], peer_batches[:2]):  # warm up
            ours.train_on_batch(b)
            peer_step(pb)
        for _ in range(args.rounds):
            # Steps alternate between subject and peer so both see the same machine load.
            ours_s = peer_s = 0.0
            for b, pb in zip(batches, peer_batches):
                t, c = time.perf_counter(), time.process_time()
                ours.train_on_batch(b)
                t2, c2 = time.perf_counter(), time.process_time()
                peer_step(pb)
                t3, c3 = time.perf_counter(), time.process_time()
                ours_s += t2 - t
                peer_s += t3 - t2
                ours_cpu.append(c2 - c)
                peer_cpu.append(c3 - c2)
            ours_rates.append(len(batches) * args.batch / ours_s)
            peer_rates.append(len(batches) * args.batch / peer_s)
        results[threads] = {
            "tierserve_samples_per_s": statistics.median(ours_rates),
            "torch_samples_per_s": statistics.median(peer_rates),
            "ratio": statistics.median(ours_rates) / statistics.median(peer_rates),
            "rounds": {"tierserve": ours_rates, "torch": peer_rates},
            # CPU time of the process a step (all its threads), less exposed to other load
            "cpu_ms_per_step": {"tierserve": 1e3 * statistics.median(ours_cpu),
                                "torch": 1e3 * statistics.median(peer_cpu)},
        }
        r = results[threads]
        r["blas"] = "MKL" if uses_mkl() else "numpy"
        print(f"threads={threads} ({r['blas']}): "
              f"tierserve {r['tierserve_samples_per_s']:,.0f} samples/s, "
              f"torch {r['torch_samples_per_s']:,.0f} samples/s, ratio {r['ratio']:.2f}; "
              f"CPU ms/step (median) {r['cpu_ms_per_step']['tierserve']:.1f} vs "
              f"{r['cpu_ms_per_step']['torch']:.1f}", flush=True)
    results["keys_in_tables"] = int(ours.tables[0].num_rows)
    return results


def criteo_auc(args) -> dict | None:
    import torch

    from tierserve.trainer.data.criteo import convert_criteo

    if not CRITEO.is_file():
        print(f"{CRITEO} is absent: no AUC comparison")
        return None
    set_blas_threads(args.threads[-1])
    torch.set_num_threads(args.threads[-1])
    with tempfile.TemporaryDirectory() as tmp:
        conv = convert_criteo(CRITEO, tmp, train_rows=6000, eval_rows=2000, min_frequency=10)
        vocab = conv.slot_size_array
        ours = build_tierserve(f"{tmp}/file_list.txt", f"{tmp}/file_list_test.txt", 256, 26,
                               workspace_mb=64, lr=args.criteo_lr)
        train = read_batches(ours, args.criteo_steps)
        evals = read_batches(build_tierserve(f"{tmp}/file_list.txt",
                                             f"{tmp}/file_list_test.txt", 2000, 26, 64),
                             1, eval=True)
    offsets = np.concatenate([[0], np.cumsum(vocab)[:-1]]).astype(np.int64)
    torch.manual_seed(0)
    peer = torch_model(vocab)
    copy_weights(ours, peer, vocab, offsets)
    peer_step = torch_trainer(peer, lr=args.criteo_lr)
    for b, pb in zip(train, torch_batches(train, offsets)):
        ours.train_on_batch(b)
        peer_step(pb)
    label = evals[0].label[:, 0]
    auc_ours = auc_score(label, ours.predict_batch(evals[0])[:, 0])
    auc_peer = auc_score(label, torch_predict(peer, torch_batches(evals, offsets)[0])[:, 0])
    print(f"Criteo AUC after {len(train)} steps of 256 (Adagrad lr {args.criteo_lr}): "
          f"tierserve {auc_ours:.4f}, "
          f"torch {auc_peer:.4f}, difference {abs(auc_ours - auc_peer):.4f}")
    return {"steps": len(train), "batch": 256, "lr": args.criteo_lr, "tierserve_auc": auc_ours, "torch_auc": auc_peer,
            "difference": abs(auc_ours - auc_peer)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", default="1,2",
                        help="comma-separated BLAS / torch thread counts")
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=24, help="timed batches per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keys", type=int, default=1_000_000, help="keys in all 26 tables")
    parser.add_argument("--criteo-steps", type=int, default=94)
    parser.add_argument("--criteo-lr", type=float, default=0.005)
    parser.add_argument("--parts", default="throughput,criteo")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    args.threads = [int(t) for t in args.threads.split(",")]
    try:
        import torch
    except ImportError:
        print("bench.trainer.run: the peer is PyTorch, which is not installed; install it into "
              "this environment first (`pip install torch`, the CPU wheel is enough)",
              file=sys.stderr)
        return 2

    print(f"numpy {np.__version__} (BLAS threads {get_blas_threads()}), torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs", flush=True)
    warnings.filterwarnings("ignore", message="Sparse invariant checks")
    parts = args.parts.split(",")
    results = {"threads": args.threads, "batch": args.batch, "keys": args.keys,
               "throughput": throughput(args) if "throughput" in parts else None,
               "criteo": criteo_auc(args) if "criteo" in parts else None}
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
