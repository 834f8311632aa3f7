"""A model trained through the embedding training cache, run by test_etc.py under
``mpiexec -n N`` and as one process.  Settings from the environment: ``SOURCES`` and
``KEYSETS`` (comma-separated file lists and their keyset files, trained in turn, twice;
``FIT``: by ``Model.fit`` over ``set_source(source, keyset)``),
``PS_TYPE`` (Staged / Cached), ``EMB_TYPE``, ``WORK`` (a folder for the sparse model and the
Cached tables' local path), ``OUT`` (an .npz rank 0 writes: dense weights, the saved table
and its optimizer state sorted by key, and the rows each rank's server holds)."""

import os

import numpy as np

import tierserve.trainer as hugectr
from tierserve.ps.sparse_file import read_sparse_model
from tierserve.trainer.distributed import launched_size, world

env = os.environ.get
SLOTS, DIM = 4, 8
WORK = env("WORK")
sources, keysets = env("SOURCES").split(","), env("KEYSETS").split(",")
ranks = launched_size()

kind = getattr(hugectr.TrainPSType_t, env("PS_TYPE", "Staged"))
sparse_model = os.path.join(WORK, "etc_table0.model")
if kind is hugectr.TrainPSType_t.Staged:
    etc = hugectr.CreateETC(ps_types=[kind], sparse_models=[sparse_model])
else:  # one folder: rank r keeps its rows under <folder>/rank<r>
    etc = hugectr.CreateETC(ps_types=[kind], sparse_models=[sparse_model],
                            local_paths=[os.path.join(WORK, "ssd")],
                            hmem_cache_configs=[hugectr.CreateHMemCache(1, block_size_mb=0.01)])
solver = hugectr.CreateSolver(batchsize=128, batchsize_eval=128, lr=0.01, repeat_dataset=False,
                              i64_input_key=True, seed=5, vvgpu=[list(range(ranks))])
reader = hugectr.DataReaderParams(data_reader_type=hugectr.DataReaderType_t.Norm,
                                  source=[sources[0]], check_type=hugectr.Check_t.Sum)
opt = hugectr.CreateOptimizer(optimizer_type=hugectr.Optimizer_t.Adam,
                              update_type=hugectr.Update_t.Local)
model = hugectr.Model(solver, reader, opt, etc)
model.add(hugectr.Input(label_dim=1, label_name="label", dense_dim=3, dense_name="dense",
                        data_reader_sparse_param_array=[
                            hugectr.DataReaderSparseParam("s", 1, True, SLOTS)]))
model.add(hugectr.SparseEmbedding(
    embedding_type=getattr(hugectr.Embedding_t, env("EMB_TYPE",
                                                    "DistributedSlotSparseEmbeddingHash")),
    workspace_size_per_gpu_in_mb=1, embedding_vec_size=DIM, combiner="sum",
    sparse_embedding_name="emb", bottom_name="s", optimizer=opt))
model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.Reshape, bottom_names=["emb"],
                             top_names=["flat"], leading_dim=SLOTS * DIM))
model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.Concat,
                             bottom_names=["flat", "dense"], top_names=["cat"]))
model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.InnerProduct, bottom_names=["cat"],
                             top_names=["fc"], num_output=1))
model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.BinaryCrossEntropyLoss,
                             bottom_names=["fc", "label"], top_names=["loss"]))
model.compile()
cache = model.get_embedding_training_cache()
if env("FIT"):  # epoch mode: fit trains each file list with its keyset, twice
    model.set_source(source=sources, keyset=keysets)
    model.fit(num_epochs=2, display=1000, eval_interval=0, snapshot=0)
else:
    for source, keyset in [*zip(sources, keysets), *zip(sources, keysets)]:
        cache.update(keyset)
        model.get_data_reader_train().set_source(source)
        while model.train():
            pass
model.save_params_to_files(os.path.join(WORK, "m"), 1)
rank_rows, _ = world().allgatherv(np.asarray([cache.servers[0].size()], dtype=np.int64))
total = cache.total_rows(0)
if world().rank == 0:
    table = read_sparse_model(sparse_model, DIM)
    order = np.argsort(table.keys)
    n = len(table.keys)
    m = np.fromfile(os.path.join(sparse_model, "Adam.m"), "<f4").reshape(n, DIM)
    np.savez(env("OUT"), dense=np.concatenate([p.ravel() for p in model.dense_parameters()]),
             keys=np.asarray(table.keys), vectors=np.asarray(table.embeddings)[order],
             slot_ids=np.zeros(0) if table.slot_ids is None else np.asarray(table.slot_ids)[order],
             adam_m=m[order],
             rank_rows=rank_rows, total=total)
