"""Benchmark: peak memory of training through the embedding training cache (``Cached``).

    python -m bench.trainer.etc                              # budget 96 + 32 MB, table 4x
    python -m bench.trainer.etc --workspace-mb 24 --cache-mb 8 --passes 6 --json

A DistributedSlot table (26 slots, dim 16, AdaGrad: 128 bytes a row) is trained a keyset at a
time, each keyset a new range of keys filling 90% of the working table's workspace, so the
table on disk grows by one working set per pass.  The budget is the workspace
(``workspace_size_per_gpu_in_mb``) plus the host cache (``CreateHMemCache``, which holds
RocksDB's memtables and block cache too).  The keys are made a batch at a time: the caller's
data is not the cache's memory.  Reported: the
table's size against the budget, and the peak RSS (VmHWM) growth of this process from after
the code is loaded (the hash map's compiled kernels, RocksDB) against the budget, with the
dense model's size (a 416-input logistic layer here: nothing).  The tests run it small.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

import numpy as np

SLOTS, DIM = 26, 16


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field))


def measure(folder: str, workspace_mb: float, cache_mb: float, passes: int,
            batch: int = 2048) -> dict:
    """Train ``passes`` keysets through a Cached table under ``folder``; the figures."""
    os.environ.setdefault("TIERSERVE_FORCE_CPU", "1")
    import tierserve.trainer as hugectr
    from tierserve.model.batch import Batch, SparseInput
    from tierserve.model.blas import matmul
    from tierserve.ps.hash_map import HashMapConfig, HashMapTier
    from tierserve.trainer.hugectr.etc import _bounded_rocksdb

    etc = hugectr.CreateETC(
        ps_types=[hugectr.TrainPSType_t.Cached],
        sparse_models=[os.path.join(folder, "table.model")],
        local_paths=[os.path.join(folder, "ssd")],
        hmem_cache_configs=[hugectr.CreateHMemCache(1, block_size_mb=cache_mb)])
    solver = hugectr.CreateSolver(batchsize=batch, lr=0.01, i64_input_key=True)
    reader = hugectr.DataReaderParams(data_reader_type=hugectr.DataReaderType_t.Norm,
                                      source=["unused.txt"])
    opt = hugectr.CreateOptimizer(optimizer_type=hugectr.Optimizer_t.AdaGrad,
                                  update_type=hugectr.Update_t.Local, initial_accu_value=0.01)
    model = hugectr.Model(solver, reader, opt, etc)
    model.add(hugectr.Input(label_dim=1, label_name="label", dense_dim=1, dense_name="dense",
                            data_reader_sparse_param_array=[
                                hugectr.DataReaderSparseParam("s", 1, True, SLOTS)]))
    model.add(hugectr.SparseEmbedding(
        embedding_type=hugectr.Embedding_t.DistributedSlotSparseEmbeddingHash,
        workspace_size_per_gpu_in_mb=workspace_mb, embedding_vec_size=DIM, combiner="sum",
        sparse_embedding_name="emb", bottom_name="s", optimizer=opt))
    model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.Reshape, bottom_names=["emb"],
                                 top_names=["flat"], leading_dim=SLOTS * DIM))
    model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.InnerProduct,
                                 bottom_names=["flat"], top_names=["fc"], num_output=1))
    model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.BinaryCrossEntropyLoss,
                                 bottom_names=["fc", "label"], top_names=["loss"]))
    model.compile()
    cache = model.get_embedding_training_cache()
    rows = model.tables[0].max_rows * 9 // 10
    rng = np.random.default_rng(0)
    # code, not data: compile the hash map's kernels and load RocksDB before measuring
    for tier in (HashMapTier(HashMapConfig(overflow_margin=100,
                                           overflow_policy="evict_least_used")),
                 _bounded_rocksdb(os.path.join(folder, "warm"))):
        tier.create_table("t", 4)
        tier.insert("t", np.arange(200, dtype=np.int64), np.ones((200, 4), np.float32))
        tier.lookup("t", np.arange(300, dtype=np.int64))
        tier.close()
    # and the dense products' BLAS (MKL's libraries load on the first product)
    matmul(np.ones((8, 8), np.float32), np.ones((8, 8), np.float32))
    start = _status("VmRSS")
    keyset = os.path.join(folder, "keyset")
    for p in range(passes):
        first = p * rows  # this pass's keys: first .. first + rows - 1, made a batch at a time
        with open(keyset, "wb") as f:  # (the data is the caller's, not the cache's memory)
            for lo in range(0, rows, 1 << 16):
                np.arange(first + lo, first + min(rows, lo + (1 << 16)), dtype="<i8").tofile(f)
        cache.update(keyset)
        for lo in range(0, rows, batch * SLOTS):
            n = min(batch * SLOTS, rows - lo) // SLOTS
            chunk = np.arange(first + lo, first + lo + n * SLOTS, dtype=np.int64)
            model.train_on_batch(Batch(
                label=(rng.random((n, 1)) < 0.5).astype(np.float32),
                dense=np.zeros((n, 1), np.float32),
                sparse=(SparseInput(chunk, np.arange(n * SLOTS + 1), SLOTS),)))
    cache.flush()
    budget = (workspace_mb + cache_mb) * (1 << 20)
    dense = 4 * sum(int(np.prod(p.shape)) for p in model.dense_parameters())
    table = cache.total_rows(0) * DIM * 4 * 2
    growth = _status("VmHWM") - start
    return {"budget_bytes": budget, "table_bytes": table, "dense_bytes": dense,
            "peak_growth_bytes": growth, "table_x_budget": table / budget,
            "growth_x_budget": growth / budget}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workspace-mb", type=float, default=96.0)
    ap.add_argument("--cache-mb", type=float, default=32.0)
    ap.add_argument("--passes", type=int, default=6)
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        r = measure(tmp, args.workspace_mb, args.cache_mb, args.passes)
    if args.json:
        print(json.dumps(r))
        return
    mb = 1 << 20
    print(f"load average {os.getloadavg()[0]:.2f}; budget {r['budget_bytes'] / mb:.0f} MB "
          f"(workspace {args.workspace_mb:g} + host cache {args.cache_mb:g}); table "
          f"{r['table_bytes'] / mb:.0f} MB = {r['table_x_budget']:.1f}x the budget; peak RSS "
          f"growth {r['peak_growth_bytes'] / mb:.0f} MB = {r['growth_x_budget']:.2f}x the budget "
          f"(dense model {r['dense_bytes'] / 1024:.1f} KB)")


if __name__ == "__main__":
    main()
