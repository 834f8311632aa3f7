"""GPU trainer stage: the DLRM of ``bench.trainer.run`` trained with ``vvgpu=[[0]]`` (cupy),
against the same model on the CPU (numpy) and PyTorch on the same GPU.

- ``throughput``: samples/s of one training step (batch 2048, 26 tables x dim 16, ~1M
  power-law keys, MLPs 512-256, Adagrad) for tierserve on the GPU, tierserve on the CPU (all
  cores) and PyTorch on the GPU (``nn.EmbeddingBag(sparse=True)`` + ``torch.optim.Adagrad``);
  steps alternate between the three on the same host batches (each side moves its batch to
  the device in its step).  Goal: >= 1.0x PyTorch.
- ``auc``: the three start from the same weights (tierserve's CPU model's dense weights and
  embeddings, loaded into the GPU model and copied into torch), train on the same batches of
  generated data (planted labels, learnable), and score the same held-out rows.  Goal: GPU
  AUC within 0.002 of the CPU's and of PyTorch's.

With ``--cpu-dry-run`` every "GPU" side runs on the CPU with tiny sizes (torch when installed).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from .backend import Backend, log

DIM = 16
BOTTOM = [512, 256, DIM]
TOP = [512, 256, 1]
EPS = 1e-7


@contextlib.contextmanager
def on_cpu(force: bool = True):
    """Models built inside run on numpy (``TIERSERVE_FORCE_CPU``), or on the GPU when not
    ``force``."""
    old = os.environ.get("TIERSERVE_FORCE_CPU")
    if force:
        os.environ["TIERSERVE_FORCE_CPU"] = "1"
    else:
        os.environ.pop("TIERSERVE_FORCE_CPU", None)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TIERSERVE_FORCE_CPU", None)
        else:
            os.environ["TIERSERVE_FORCE_CPU"] = old


def generate(folder: Path, slot_sizes: list[int], rows: int) -> None:
    """Norm files of ``rows`` generated samples (planted labels) for training and for eval."""
    import tierserve.trainer as hugectr

    hugectr.DataGenerator(hugectr.DataGeneratorParams(
        format=hugectr.DataReaderType_t.Norm, label_dim=1, dense_dim=13, num_slot=26,
        i64_input_key=True, source=f"{folder}/file_list.txt",
        eval_source=f"{folder}/file_list_test.txt", slot_size_array=slot_sizes,
        dist_type=hugectr.tools.Distribution_t.PowerLaw, alpha=1.2, num_files=1,
        eval_num_files=1, num_samples_per_file=rows,
    )).generate()


def torch_model(vocab: list[int], device: str):
    """bench.trainer.run's PyTorch DLRM, with every tensor on ``device``."""
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
            rows, cols = np.tril_indices(n, -1)
            self.register_buffer("rows", torch.as_tensor(rows), persistent=False)
            self.register_buffer("cols", torch.as_tensor(cols), persistent=False)
            dims = [DIM + n * (n - 1) // 2 + 1, *TOP]
            layers = []
            for a, b in zip(dims, dims[1:]):
                layers += [nn.Linear(a, b)] + ([nn.ReLU()] if b != 1 else [])
            self.top = nn.Sequential(*layers)

        def forward(self, dense, keys):
            offsets = torch.arange(keys.shape[0], device=keys.device)
            x = self.bottom(dense)
            e = torch.stack([emb(keys[:, s], offsets) for s, emb in enumerate(self.embs)], 1)
            z = torch.cat([x[:, None], e], 1)
            zz = torch.bmm(z, z.transpose(1, 2))
            pad = torch.zeros(x.shape[0], 1, device=x.device)
            return self.top(torch.cat([x, zz[:, self.rows, self.cols], pad], 1))

    return DLRM().to(device)


def torch_step(model, lr: float, device: str):
    import torch

    opt = torch.optim.Adagrad(model.parameters(), lr=lr, eps=EPS, initial_accumulator_value=0.0)
    loss_fn = torch.nn.BCEWithLogitsLoss()

    def step(batch):
        dense, keys, label = (t.to(device, non_blocking=True) for t in batch)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(dense, keys), label)
        loss.backward()
        opt.step()
        return float(loss.detach())  # waits for the step, as tierserve's does

    return step


def torch_predict(model, batch, device: str) -> np.ndarray:
    import torch

    dense, keys, _ = batch
    with torch.no_grad():
        return torch.sigmoid(model(dense.to(device), keys.to(device))).cpu().numpy()


def _torch(device_wanted: str):
    """``(torch, device)`` or ``(None, why)``."""
    try:
        import torch
    except ImportError:
        return None, "torch is not installed"
    if device_wanted == "cuda" and not torch.cuda.is_available():
        return None, "torch sees no CUDA device"
    return torch, device_wanted


def throughput(be: Backend, dry_run: bool) -> dict:
    from bench.trainer.run import build_tierserve, fill_table, read_batches, torch_batches
    from tierserve.model.blas_threads import set_blas_threads

    keys, batch, steps, rounds = (26 * 400, 256, 4, 2) if dry_run else (1_000_000, 2048, 24, 3)
    slot_sizes = [keys // 26] * 26
    threads = os.cpu_count() or 1
    set_blas_threads(threads)
    with tempfile.TemporaryDirectory(prefix="gpu-check-trainer-") as tmp:
        generate(Path(tmp), slot_sizes, batch * steps)
        src, ev = f"{tmp}/file_list.txt", f"{tmp}/file_list_test.txt"
        with on_cpu():
            cpu = build_tierserve(src, ev, batch, 26, workspace_mb=1024)
        with on_cpu(force=not be.gpu):
            gpu = build_tierserve(src, ev, batch, 26, workspace_mb=1024)
        batches = read_batches(cpu, steps)
    assert (gpu.xp is not np) == be.gpu, f"the vvgpu=[[0]] model runs on {gpu.xp.__name__}"
    offsets = np.concatenate([[0], np.cumsum(slot_sizes)[:-1]]).astype(np.int64)
    for m in (cpu, gpu):
        fill_table(m, sum(slot_sizes))
    sides = {"tierserve GPU" if be.gpu else "tierserve (dry run)": gpu.train_on_batch,
             "tierserve CPU": cpu.train_on_batch}
    torch, device = _torch("cuda" if be.gpu else "cpu")
    peer_batches = None
    if torch is not None:
        torch.set_num_threads(threads)
        peer = torch_model(slot_sizes, device)
        step = torch_step(peer, 0.01, device)
        peer_batches = torch_batches(batches, offsets)
        sides[f"torch {device}"] = lambda i: step(peer_batches[i])
    rates: dict[str, list[float]] = {name: [] for name in sides}
    for i in range(min(2, len(batches))):  # warm up (cupy compiles its kernels here)
        for name, fn in sides.items():
            fn(i if name.startswith("torch") else batches[i])
    for _ in range(rounds):
        spent = dict.fromkeys(sides, 0.0)
        for i, b in enumerate(batches):
            for name, fn in sides.items():
                t = time.perf_counter()
                fn(i if name.startswith("torch") else b)
                spent[name] += time.perf_counter() - t
        for name in sides:
            rates[name].append(len(batches) * batch / spent[name])
    out = {"batch": batch, "keys": keys, "cpu_threads": threads,
           "samples_per_s": {n: statistics.median(r) for n, r in rates.items()}}
    if torch is None:
        out["torch"] = f"skipped: {device}"
    for n, r in out["samples_per_s"].items():
        log(f"trainer throughput: {n}: {r:,.0f} samples/s")
    return out


def auc(be: Backend, dry_run: bool) -> dict:
    from bench.trainer.run import build_tierserve, copy_weights, read_batches, torch_batches
    from tierserve.trainer.metrics import auc_score

    vocab_each, batch, steps, eval_rows, lr = (
        (200, 256, 20, 2048, 0.01) if dry_run else (20_000, 1024, 150, 32768, 0.01))
    vocab = [vocab_each] * 26
    offsets = np.concatenate([[0], np.cumsum(vocab)[:-1]]).astype(np.int64)
    with tempfile.TemporaryDirectory(prefix="gpu-check-auc-") as tmp:
        generate(Path(tmp), vocab, max(batch * steps, eval_rows))
        src, ev = f"{tmp}/file_list.txt", f"{tmp}/file_list_test.txt"
        with on_cpu():
            cpu = build_tierserve(src, ev, batch, 26, workspace_mb=64, lr=lr)
            train = read_batches(cpu, steps)
            evals = read_batches(build_tierserve(src, ev, eval_rows, 26, 64), 1, eval=True)
        torch, device = _torch("cuda" if be.gpu else "cpu")
        peer = None
        if torch is not None:
            torch.manual_seed(0)
            peer = torch_model(vocab, device)
            copy_weights(cpu, peer, vocab, offsets)  # also puts every key in cpu's table
        else:
            from bench.trainer.run import fill_table

            fill_table(cpu, sum(vocab))
        cpu.save_params_to_files(f"{tmp}/init")
        with on_cpu(force=not be.gpu):
            gpu = build_tierserve(src, ev, batch, 26, workspace_mb=64, lr=lr)
        gpu.load_dense_weights(str(next(Path(tmp).glob("init_dense_*.model"))))
        gpu.load_sparse_weights([str(p) for p in sorted(Path(tmp).glob("init0_sparse_*.model"))])
    np.testing.assert_array_equal(
        np.concatenate([np.ravel(p) for p in gpu.dense_parameters()]),
        np.concatenate([np.ravel(p) for p in cpu.dense_parameters()]),
        err_msg="the GPU model did not start from the CPU model's weights")
    step = torch_step(peer, lr, device) if peer is not None else None
    peer_train = torch_batches(train, offsets) if peer is not None else None
    for i, b in enumerate(train):
        cpu.train_on_batch(b)
        gpu.train_on_batch(b)
        if step is not None:
            step(peer_train[i])
    label = evals[0].label[:, 0]
    scores = {
        "tierserve CPU": auc_score(label, cpu.predict_batch(evals[0])[:, 0]),
        "tierserve GPU" if be.gpu else "tierserve (dry run)":
            auc_score(label, gpu.predict_batch(evals[0])[:, 0]),
    }
    if peer is not None:
        scores[f"torch {device}"] = auc_score(
            label, torch_predict(peer, torch_batches(evals, offsets)[0], device)[:, 0])
    for n, s in scores.items():
        log(f"trainer auc: {n}: {s:.4f}")
    return {"steps": len(train), "batch": batch, "lr": lr, "eval_rows": int(label.size),
            "auc": scores, **({} if peer is not None else {"torch": f"skipped: {device}"})}


def run(be: Backend, dry_run: bool) -> dict:
    """Both parts; a part that raises is recorded and the other still runs."""
    warnings.filterwarnings("ignore", message="Sparse invariant checks")
    out: dict = {}
    for name, fn in (("throughput", throughput), ("auc", auc)):
        t0 = time.perf_counter()
        try:
            out[name] = fn(be, dry_run)
        except Exception as exc:
            import traceback

            traceback.print_exc()
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
        log(f"trainer/{name}: {time.perf_counter() - t0:.1f}s")
    return out
