"""A small DLRM in HugeCTR's API, run by the distributed tests under ``mpiexec -n N`` and as
one process.  Settings from the environment: ``DATA_DIR`` (Norm data, file_list.txt and
file_list_test.txt), ``OUT`` (an .npz the first rank writes: dense weights, the tables sorted
by key, the loss per iteration and the evaluation metrics), ``EMB_TYPE``, ``OPT``
(``Adam`` or ``AdaGrad``), ``UPDATE`` (Local / Global / LazyGlobal), ``ITERS``, ``BATCH``, ``EVAL_BATCH``, ``LR``,
``SLOTS``, ``VVGPU`` (JSON), ``EPOCH`` (one pass, the last batch short), ``FIT`` (train with ``Model.fit``), ``SNAPSHOT_PREFIX`` (with ``SNAPSHOT``: write model files then), ``RESUME_ITER``
(load that snapshot first and skip that many batches), ``DIE_AT`` / ``DIE_RANK`` (that rank
kills itself at that iteration)."""

import json
import os
import signal

import numpy as np

import tierserve.trainer as hugectr
from tierserve.ps.sparse_file import read_sparse_model
from tierserve.trainer.distributed import launched_size, resume, world

env = os.environ.get
DATA_DIR = env("DATA_DIR")
ITERS = int(env("ITERS", "12"))
BATCH = int(env("BATCH", "512"))
SLOTS = int(env("SLOTS", "8"))
EMB_DIM = 8
ranks = launched_size()

solver = hugectr.CreateSolver(
    model_name="dlrm", max_eval_batches=2, batchsize_eval=int(env("EVAL_BATCH", "1024")), batchsize=BATCH, lr=float(env("LR", "0.01")),
    vvgpu=json.loads(env("VVGPU", "null")) or [list(range(ranks))],
    repeat_dataset=not env("EPOCH"), i64_input_key=True,
    metrics_spec={hugectr.MetricsType.AUC: 1.0, hugectr.MetricsType.AverageLoss: 0.0},
)
reader = hugectr.DataReaderParams(
    data_reader_type=hugectr.DataReaderType_t.Norm,
    source=[os.path.join(DATA_DIR, "file_list.txt")],
    eval_source=os.path.join(DATA_DIR, "file_list_test.txt"),
    check_type=hugectr.Check_t.Sum,
)
optimizer = hugectr.CreateOptimizer(
    optimizer_type=getattr(hugectr.Optimizer_t, env("OPT", "Adam")),
    update_type=getattr(hugectr.Update_t, env("UPDATE", "Local")),
    initial_accu_value=0.01,
)
model = hugectr.Model(solver, reader, optimizer)
model.add(hugectr.Input(label_dim=1, label_name="label", dense_dim=13, dense_name="dense",
                        data_reader_sparse_param_array=[
                            hugectr.DataReaderSparseParam("data1", 1, True, SLOTS)]))
model.add(hugectr.SparseEmbedding(
    embedding_type=getattr(hugectr.Embedding_t, env("EMB_TYPE",
                                                    "DistributedSlotSparseEmbeddingHash")),
    workspace_size_per_gpu_in_mb=8, embedding_vec_size=EMB_DIM, combiner="sum",
    sparse_embedding_name="sparse_embedding1", bottom_name="data1", optimizer=optimizer))
model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.InnerProduct, bottom_names=["dense"],
                             top_names=["fc1"], num_output=32))
model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.ReLU, bottom_names=["fc1"],
                             top_names=["relu1"]))
model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.InnerProduct, bottom_names=["relu1"],
                             top_names=["fc2"], num_output=EMB_DIM))
model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.Interaction,
                             bottom_names=["fc2", "sparse_embedding1"],
                             top_names=["interaction1"]))
model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.InnerProduct,
                             bottom_names=["interaction1"], top_names=["fc3"], num_output=32))
model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.ReLU, bottom_names=["fc3"],
                             top_names=["relu3"]))
model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.InnerProduct, bottom_names=["relu3"],
                             top_names=["fc4"], num_output=1))
model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.BinaryCrossEntropyLoss,
                             bottom_names=["fc4", "label"], top_names=["loss"]))
model.compile()

start = 0
if env("RESUME_ITER"):
    start = int(env("RESUME_ITER"))
    resume(model, env("SNAPSHOT_PREFIX"), start)
    for _ in range(start):  # the batches the snapshot had trained on
        model.get_data_reader_train().next_batch()
snapshot = int(env("SNAPSHOT", "0"))
losses = []
if env("FIT"):  # the high-level loop instead of the one below
    model.fit(max_iter=ITERS, display=2, eval_interval=ITERS, snapshot=0)
    losses.append(model.get_current_loss())
for it in range(start + 1, 0 if env("FIT") else ITERS + 1):
    if env("DIE_AT") and it == int(env("DIE_AT")) and world().rank == int(env("DIE_RANK", "1")):
        os.kill(os.getpid(), signal.SIGKILL)
    if not model.train():  # epoch mode: the end of the source
        break
    losses.append(model.get_current_loss())
    if snapshot and it % snapshot == 0:
        model.save_params_to_files(env("SNAPSHOT_PREFIX"), it)

# the rows each rank changed since the start (its own rows only)
changed, _ = world().allgatherv(model.get_incremental_model()[0][0])
for _ in range(solver.max_eval_batches):
    model.eval()
metrics = dict(model.get_eval_metrics())
prefix = os.path.join(os.path.dirname(env("OUT")), "final")
model.save_params_to_files(prefix, ITERS)
# the keys each rank holds, to check the sharding
rank_keys, rank_rows = world().allgatherv(np.asarray(model.tables[0].keys, dtype=np.int64))
if world().rank == 0:
    table = read_sparse_model(f"{prefix}0_sparse_{ITERS}.model", EMB_DIM)
    order = np.argsort(table.keys)
    np.savez(env("OUT"), rank_keys=rank_keys, rank_rows=rank_rows, changed=np.sort(changed),
             dense=np.concatenate([p.ravel() for p in model.dense_parameters()]),
             keys=np.asarray(table.keys)[order], vectors=np.asarray(table.embeddings)[order],
             losses=np.asarray(losses), auc=metrics["AUC"], avg_loss=metrics["AverageLoss"])
