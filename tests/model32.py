"""A small model trained the HugeCTR default way: ``i64_input_key=False``, Norm data with
32-bit (unsigned int) keys, some of them above 2**31 (negative as int32) so that every path
must read keys as unsigned.  Shared by the tests of the tiers, the cache, the CLI and the
HugeCTR scripts."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SLOTS = 4
DENSE = 3
DIM = 4
ITERS = 30
#: Slot sizes: the last slot's keys start above 2**31 once slot offsets are added.
SLOT_SIZES = [50, 50, 50, 2**31 + 100]


@dataclass
class Model32:
    root: Path
    graph: Path
    dense: Path
    sparse: Path
    train_list: Path
    eval_list: Path
    eval_auc: float  # the trainer's own AUC on the eval data after training

    def inference_params(self, **overrides):
        """HugeCTR's ``InferenceParams`` for this model (32-bit keys, hash_map tier)."""
        import tierserve.trainer as hugectr

        kwargs = dict(
            model_name="m32", max_batchsize=256, hit_rate_threshold=0.9,
            dense_model_file=str(self.dense), sparse_model_files=[str(self.sparse)],
            use_gpu_embedding_cache=False, cache_size_percentage=0.5, i64_input_key=False,
            volatile_db=hugectr.inference.VolatileDatabaseParams(
                type=hugectr.DatabaseType_t.hash_map),
        )
        kwargs.update(overrides)
        return hugectr.inference.InferenceParams(**kwargs)


def _write_norm(path: Path, rng, n: int) -> np.ndarray:
    """A Norm file (checksums on) of ``n`` one-hot samples with uint32 keys; returns the keys."""
    from tierserve.trainer.data.norm import write_norm_file
    from tierserve.trainer.data.records import Records

    local = np.stack([rng.integers(0, 50, n) for _ in SLOT_SIZES], axis=1)
    offsets = np.concatenate([[0], np.cumsum(SLOT_SIZES[:-1])]).astype(np.int64)
    offsets[-1] = 2**31 + 10  # the last slot's keys lie above 2**31
    keys = (local + offsets).astype(np.int64)
    weights = np.array([0.08, -0.05, 0.06, -0.07])
    logit = ((local - 25) * weights).sum(axis=1)
    dense = rng.standard_normal((n, DENSE)).astype(np.float32)
    logit = logit + dense[:, 0]
    label = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)[:, None]
    records = Records(label, dense, keys.reshape(-1), np.arange(n * SLOTS + 1, dtype=np.int64),
                      SLOTS)
    write_norm_file(path, records, check_type="Sum", i64_input_key=False)
    return keys


def train_model32(root: Path) -> Model32:
    """Generate the data and train, save and export the model under ``root``."""
    import tierserve.trainer as hugectr

    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(13)
    for name, n in (("train", 4096), ("eval", 1024)):
        _write_norm(root / f"{name}.data", rng, n)
        (root / f"{name}_list.txt").write_text(f"1\n{root / f'{name}.data'}\n")
    solver = hugectr.CreateSolver(model_name="m32", batchsize=256, batchsize_eval=256,
                                  max_eval_batches=4, lr=0.01, i64_input_key=False)
    reader = hugectr.DataReaderParams(
        data_reader_type=hugectr.DataReaderType_t.Norm, source=[str(root / "train_list.txt")],
        eval_source=str(root / "eval_list.txt"), check_type=hugectr.Check_t.Sum)
    optimizer = hugectr.CreateOptimizer(optimizer_type=hugectr.Optimizer_t.Adam)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        model = hugectr.Model(solver, reader, optimizer)
        model.add(hugectr.Input(
            label_dim=1, label_name="label", dense_dim=DENSE, dense_name="dense",
            data_reader_sparse_param_array=[hugectr.DataReaderSparseParam("data1", 1, True,
                                                                          SLOTS)]))
        model.add(hugectr.SparseEmbedding(
            embedding_type=hugectr.Embedding_t.DistributedSlotSparseEmbeddingHash,
            workspace_size_per_gpu_in_mb=1, embedding_vec_size=DIM, combiner="sum",
            sparse_embedding_name="emb", bottom_name="data1", optimizer=optimizer))
        model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.Reshape, bottom_names=["emb"],
                                     top_names=["flat"], leading_dim=SLOTS * DIM))
        model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.Concat,
                                     bottom_names=["flat", "dense"], top_names=["both"]))
        model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.InnerProduct,
                                     bottom_names=["both"], top_names=["fc"], num_output=1))
        model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.BinaryCrossEntropyLoss,
                                     bottom_names=["fc", "label"], top_names=["loss"]))
        model.compile()
        model.fit(max_iter=ITERS, display=1000, eval_interval=1000)
    model.graph_to_json(str(root / "m32.json"))
    model.save_params_to_files(str(root / "m32"), ITERS)
    auc = dict(model._evaluate())["AUC"]
    return Model32(root, root / "m32.json", root / f"m32_dense_{ITERS}.model",
                   root / f"m320_sparse_{ITERS}.model", root / "train_list.txt",
                   root / "eval_list.txt", auc)
