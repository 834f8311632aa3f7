"""Wide & Deep the HugeCTR way (modelled on HugeCTR's samples/wdl): a wide linear part
(embeddings of width 1, summed) added to the logit of a deep MLP over the embeddings and the
dense features.

HugeCTR's sample feeds the wide part a separate crossed-feature slot; here both embeddings
read the same sparse input (HugeCTR allows a sparse input to feed several embeddings), so the
script runs on any 26-slot Criteo-shaped data.  Runs unchanged on HugeCTR with
``import hugectr``.  Environment settings: ``DATA_DIR``, ``OUT_DIR``, ``MAX_ITER``, ``BATCH``,
``EVAL_BATCH``, ``EVAL_BATCHES``, ``LR``, ``EMB_DIM``, ``DEEP``, ``DROPOUT``, ``SLOT_SIZES``,
``NNZ``.
"""

import os

import tierserve.trainer as hugectr

env = os.environ.get
DATA_DIR = env("DATA_DIR", "./wdl_data")
OUT_DIR = env("OUT_DIR", "./wdl_out")
MAX_ITER = int(env("MAX_ITER", "400"))
BATCH = int(env("BATCH", "1024"))
EVAL_BATCH = int(env("EVAL_BATCH", "4096"))
EVAL_BATCHES = int(env("EVAL_BATCHES", "4"))
LR = float(env("LR", "0.001"))
EMB_DIM = int(env("EMB_DIM", "16"))
DEEP = [int(n) for n in env("DEEP", "64,64").split(",")]
DROPOUT = float(env("DROPOUT", "0.2"))
SLOT_SIZES = [int(n) for n in env("SLOT_SIZES", ",".join(["2000"] * 26)).split(",")]
NNZ = int(env("NNZ", "1"))
SLOTS = len(SLOT_SIZES)

if not os.path.exists(os.path.join(DATA_DIR, "file_list.txt")):
    hugectr.tools.DataGenerator(
        hugectr.tools.DataGeneratorParams(
            format=hugectr.DataReaderType_t.Norm,
            label_dim=1,
            dense_dim=13,
            num_slot=SLOTS,
            i64_input_key=env("I64", "0") == "1",
            source=os.path.join(DATA_DIR, "file_list.txt"),
            eval_source=os.path.join(DATA_DIR, "file_list_test.txt"),
            slot_size_array=SLOT_SIZES,
            nnz_array=[NNZ] * SLOTS,
            check_type=hugectr.Check_t.Sum,
            dist_type=hugectr.tools.Distribution_t.PowerLaw,
            power_law_type=hugectr.tools.PowerLaw_t.Short,
            num_files=int(env("NUM_FILES", "8")),
            eval_num_files=1,
            num_samples_per_file=int(env("SAMPLES_PER_FILE", "16384")),
        )
    ).generate()

solver = hugectr.CreateSolver(
    model_name="wdl",
    max_eval_batches=EVAL_BATCHES,
    batchsize_eval=EVAL_BATCH,
    batchsize=BATCH,
    lr=LR,
    vvgpu=[[0]],
    repeat_dataset=True,
    i64_input_key=env("I64", "0") == "1",
)
reader = hugectr.DataReaderParams(
    data_reader_type=hugectr.DataReaderType_t.Norm,
    source=[os.path.join(DATA_DIR, "file_list.txt")],
    eval_source=os.path.join(DATA_DIR, "file_list_test.txt"),
    check_type=hugectr.Check_t.Sum,
)
optimizer = hugectr.CreateOptimizer(optimizer_type=hugectr.Optimizer_t.Adam,
                                    update_type=hugectr.Update_t.Global,
                                    beta1=0.9, beta2=0.999, epsilon=0.0000001)
model = hugectr.Model(solver, reader, optimizer)
model.add(hugectr.Input(label_dim=1, label_name="label",
                        dense_dim=13, dense_name="dense",
                        data_reader_sparse_param_array=[
                            hugectr.DataReaderSparseParam("data1", NNZ, NNZ == 1, SLOTS)]))
model.add(hugectr.SparseEmbedding(
    embedding_type=hugectr.Embedding_t.DistributedSlotSparseEmbeddingHash,
    workspace_size_per_gpu_in_mb=int(env("WIDE_WORKSPACE_MB", "8")),
    embedding_vec_size=1,
    combiner="sum",
    sparse_embedding_name="sparse_embedding2",
    bottom_name="data1",
    optimizer=optimizer))
model.add(hugectr.SparseEmbedding(
    embedding_type=hugectr.Embedding_t.DistributedSlotSparseEmbeddingHash,
    workspace_size_per_gpu_in_mb=int(env("WORKSPACE_MB", "64")),
    embedding_vec_size=EMB_DIM,
    combiner="sum",
    sparse_embedding_name="sparse_embedding1",
    bottom_name="data1",
    optimizer=optimizer))
model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.Reshape,
                             bottom_names=["sparse_embedding1"], top_names=["reshape1"],
                             leading_dim=SLOTS * EMB_DIM))
model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.Reshape,
                             bottom_names=["sparse_embedding2"], top_names=["reshape2"],
                             leading_dim=SLOTS))
model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.ReduceSum,
                             bottom_names=["reshape2"], top_names=["wide_logit"], axis=1))
model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.Concat,
                             bottom_names=["reshape1", "dense"], top_names=["concat1"]))
bottom = "concat1"
for i, n in enumerate(DEEP, start=1):
    model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.InnerProduct,
                                 bottom_names=[bottom], top_names=[f"fc{i}"], num_output=n))
    model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.ReLU,
                                 bottom_names=[f"fc{i}"], top_names=[f"relu{i}"]))
    model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.Dropout,
                                 bottom_names=[f"relu{i}"], top_names=[f"dropout{i}"],
                                 dropout_rate=DROPOUT))
    bottom = f"dropout{i}"
model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.InnerProduct,
                             bottom_names=[bottom], top_names=["deep_logit"], num_output=1))
model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.Add,
                             bottom_names=["deep_logit", "wide_logit"], top_names=["add1"]))
model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.BinaryCrossEntropyLoss,
                             bottom_names=["add1", "label"], top_names=["loss"]))
model.compile()
model.summary()
model.fit(max_iter=MAX_ITER, display=100, eval_interval=MAX_ITER, snapshot=MAX_ITER,
          snapshot_prefix=os.path.join(OUT_DIR, "wdl"))
model.graph_to_json(graph_config_file=os.path.join(OUT_DIR, "wdl.json"))
for _ in range(solver.max_eval_batches):
    model.eval()
metrics = dict(model.get_eval_metrics())
print(f"[HUGECTR][INFO] trained model: {metrics}")

reloaded = hugectr.Model(solver, reader, optimizer)
reloaded.construct_from_json(graph_config_file=os.path.join(OUT_DIR, "wdl.json"),
                             include_dense_network=True)
reloaded.compile()
reloaded.load_dense_weights(os.path.join(OUT_DIR, f"wdl_dense_{MAX_ITER}.model"))
reloaded.load_sparse_weights({
    "sparse_embedding2": os.path.join(OUT_DIR, f"wdl0_sparse_{MAX_ITER}.model"),
    "sparse_embedding1": os.path.join(OUT_DIR, f"wdl1_sparse_{MAX_ITER}.model"),
})
for _ in range(solver.max_eval_batches):
    reloaded.eval()
reloaded_metrics = dict(reloaded.get_eval_metrics())
print(f"[HUGECTR][INFO] reloaded model: {reloaded_metrics}")
