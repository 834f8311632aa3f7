"""A small DLRM (DistributedSlot embedding) trained by ``Model.fit`` with online updates, run
by the publishing tests under ``mpiexec -n N`` and as one process.  Settings from the
environment: ``DATA_DIR`` (Norm data with file_list.txt), ``BROKERS``, ``MODEL`` (the served
model's name: topics ``hps_et.<MODEL>.sparse_embedding1``), ``ITERS``, ``PUBLISH_INTERVAL``,
``REPO`` / ``EXPORT_INTERVAL`` (versions exported there), ``OUT`` (an .npz the first rank
writes: the final table sorted by key and the rows each rank published)."""

import os

import numpy as np

import tierserve.trainer as hugectr
from tierserve.ps.sparse_file import read_sparse_model
from tierserve.trainer.distributed import launched_size, world

env = os.environ.get
ITERS = int(env("ITERS", "10"))
EMB_DIM = 8
ranks = launched_size()

solver = hugectr.CreateSolver(model_name=env("MODEL"), batchsize=512, lr=0.01,
                              vvgpu=[list(range(ranks))], repeat_dataset=True,
                              i64_input_key=True)
reader = hugectr.DataReaderParams(data_reader_type=hugectr.DataReaderType_t.Norm,
                                  source=[os.path.join(env("DATA_DIR"), "file_list.txt")],
                                  eval_source=os.path.join(env("DATA_DIR"), "file_list.txt"),
                                  check_type=hugectr.Check_t.Sum)
optimizer = hugectr.CreateOptimizer(optimizer_type=hugectr.Optimizer_t.AdaGrad,
                                    update_type=hugectr.Update_t.Local, initial_accu_value=0.01)
model = hugectr.Model(solver, reader, optimizer)
model.add(hugectr.Input(label_dim=1, label_name="label", dense_dim=13, dense_name="dense",
                        data_reader_sparse_param_array=[
                            hugectr.DataReaderSparseParam("data1", 1, True, 8)]))
model.add(hugectr.SparseEmbedding(
    embedding_type=hugectr.Embedding_t.DistributedSlotSparseEmbeddingHash,
    workspace_size_per_gpu_in_mb=8, embedding_vec_size=EMB_DIM, combiner="sum",
    sparse_embedding_name="sparse_embedding1", bottom_name="data1", optimizer=optimizer))
model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.InnerProduct, bottom_names=["dense"],
                             top_names=["fc1"], num_output=EMB_DIM))
model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.Interaction,
                             bottom_names=["fc1", "sparse_embedding1"],
                             top_names=["interaction1"]))
model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.InnerProduct,
                             bottom_names=["interaction1"], top_names=["fc2"], num_output=1))
model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.BinaryCrossEntropyLoss,
                             bottom_names=["fc2", "label"], top_names=["loss"]))
model.compile()
model.fit(max_iter=ITERS, display=1000, eval_interval=0, snapshot=0,
          update_source=env("BROKERS"), publish_interval=int(env("PUBLISH_INTERVAL", "3")),
          repository=env("REPO"), export_interval=int(env("EXPORT_INTERVAL", "5")))

publisher = model._update_publisher[1]
sent, _ = world().allgatherv(np.asarray([publisher.rows], dtype=np.int64))
prefix = os.path.join(os.path.dirname(env("OUT")), "final")
model.save_params_to_files(prefix, ITERS)
if world().rank == 0:
    table = read_sparse_model(f"{prefix}0_sparse_{ITERS}.model", EMB_DIM)
    order = np.argsort(table.keys)
    np.savez(env("OUT"), keys=np.asarray(table.keys)[order],
             vectors=np.asarray(table.embeddings)[order], sent=sent)
publisher.close()
