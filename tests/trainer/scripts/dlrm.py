"""DLRM the HugeCTR way (modelled on HugeCTR's samples/dlrm): a bottom MLP on the dense
features, DLRM dot interaction with the embeddings, a top MLP, binary cross entropy.

Runs unchanged on HugeCTR with ``import hugectr``.  Settings come from the environment:
``DATA_DIR`` (Norm data with file_list.txt / file_list_test.txt; generated there when
missing), ``OUT_DIR``, ``MAX_ITER``, ``BATCH``, ``EVAL_BATCH``, ``EVAL_BATCHES``, ``LR``,
``EMB_DIM``, ``BOTTOM`` / ``TOP`` (comma-separated MLP widths), ``SLOT_SIZES``,
``WORKSPACE_MB``, ``NNZ``.
"""

import os

import tierserve.trainer as hugectr

env = os.environ.get
DATA_DIR = env("DATA_DIR", "./dlrm_data")
OUT_DIR = env("OUT_DIR", "./dlrm_out")
MAX_ITER = int(env("MAX_ITER", "400"))
BATCH = int(env("BATCH", "1024"))
EVAL_BATCH = int(env("EVAL_BATCH", "4096"))
EVAL_BATCHES = int(env("EVAL_BATCHES", "4"))
LR = float(env("LR", "0.001"))
EMB_DIM = int(env("EMB_DIM", "16"))
BOTTOM = [int(n) for n in env("BOTTOM", "64,32").split(",")] + [EMB_DIM]
TOP = [int(n) for n in env("TOP", "64,32").split(",")] + [1]
SLOT_SIZES = [int(n) for n in env("SLOT_SIZES", ",".join(["2000"] * 26)).split(",")]
NNZ = int(env("NNZ", "1"))
WORKSPACE_MB = int(env("WORKSPACE_MB", "64"))

if not os.path.exists(os.path.join(DATA_DIR, "file_list.txt")):
    data_generator_params = hugectr.tools.DataGeneratorParams(
        format=hugectr.DataReaderType_t.Norm,
        label_dim=1,
        dense_dim=13,
        num_slot=len(SLOT_SIZES),
        i64_input_key=True,
        source=os.path.join(DATA_DIR, "file_list.txt"),
        eval_source=os.path.join(DATA_DIR, "file_list_test.txt"),
        slot_size_array=SLOT_SIZES,
        nnz_array=[NNZ] * len(SLOT_SIZES),
        check_type=hugectr.Check_t.Sum,
        dist_type=hugectr.tools.Distribution_t.PowerLaw,
        power_law_type=hugectr.tools.PowerLaw_t.Short,
        num_files=int(env("NUM_FILES", "8")),
        eval_num_files=1,
        num_samples_per_file=int(env("SAMPLES_PER_FILE", "16384")),
    )
    hugectr.tools.DataGenerator(data_generator_params).generate()

solver = hugectr.CreateSolver(
    model_name="dlrm",
    max_eval_batches=EVAL_BATCHES,
    batchsize_eval=EVAL_BATCH,
    batchsize=BATCH,
    lr=LR,
    vvgpu=[[0]],
    repeat_dataset=True,
    i64_input_key=True,
    metrics_spec={hugectr.MetricsType.AUC: 1.0, hugectr.MetricsType.AverageLoss: 0.0},
)
reader = hugectr.DataReaderParams(
    data_reader_type=hugectr.DataReaderType_t.Norm,
    source=[os.path.join(DATA_DIR, "file_list.txt")],
    eval_source=os.path.join(DATA_DIR, "file_list_test.txt"),
    check_type=hugectr.Check_t.Sum,
)
optimizer = hugectr.CreateOptimizer(
    optimizer_type=hugectr.Optimizer_t.Adam,
    update_type=hugectr.Update_t.Local,
    beta1=0.9,
    beta2=0.999,
    epsilon=0.0000001,
)
model = hugectr.Model(solver, reader, optimizer)
model.add(
    hugectr.Input(
        label_dim=1,
        label_name="label",
        dense_dim=13,
        dense_name="dense",
        data_reader_sparse_param_array=[
            hugectr.DataReaderSparseParam("data1", NNZ, NNZ == 1, len(SLOT_SIZES))
        ],
    )
)
model.add(
    hugectr.SparseEmbedding(
        embedding_type=hugectr.Embedding_t.DistributedSlotSparseEmbeddingHash,
        workspace_size_per_gpu_in_mb=WORKSPACE_MB,
        embedding_vec_size=EMB_DIM,
        combiner="sum",
        sparse_embedding_name="sparse_embedding1",
        bottom_name="data1",
        optimizer=optimizer,
    )
)
bottom = "dense"
for i, width in enumerate(BOTTOM, start=1):
    model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.InnerProduct,
                                 bottom_names=[bottom], top_names=[f"fc{i}"], num_output=width))
    model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.ReLU,
                                 bottom_names=[f"fc{i}"], top_names=[f"relu{i}"]))
    bottom = f"relu{i}"
model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.Interaction,
                             bottom_names=[bottom, "sparse_embedding1"],
                             top_names=["interaction1"]))
bottom = "interaction1"
for i, width in enumerate(TOP, start=len(BOTTOM) + 1):
    model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.InnerProduct,
                                 bottom_names=[bottom], top_names=[f"fc{i}"], num_output=width))
    if width == 1:
        bottom = f"fc{i}"
        break
    model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.ReLU,
                                 bottom_names=[f"fc{i}"], top_names=[f"relu{i}"]))
    bottom = f"relu{i}"
model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.BinaryCrossEntropyLoss,
                             bottom_names=[bottom, "label"], top_names=["loss"]))
model.compile()
model.summary()
model.fit(max_iter=MAX_ITER, display=100, eval_interval=MAX_ITER, snapshot=MAX_ITER,
          snapshot_prefix=os.path.join(OUT_DIR, "dlrm"))
model.graph_to_json(graph_config_file=os.path.join(OUT_DIR, "dlrm.json"))

# Reload the saved model into a new Model and evaluate it.
for _ in range(solver.max_eval_batches):
    model.eval()
metrics = dict(model.get_eval_metrics())
print(f"[HUGECTR][INFO] trained model: {metrics}")

reloaded = hugectr.Model(solver, reader, optimizer)
reloaded.construct_from_json(graph_config_file=os.path.join(OUT_DIR, "dlrm.json"),
                             include_dense_network=True)
reloaded.compile()
reloaded.load_dense_weights(os.path.join(OUT_DIR, f"dlrm_dense_{MAX_ITER}.model"))
reloaded.load_sparse_weights([os.path.join(OUT_DIR, f"dlrm0_sparse_{MAX_ITER}.model")])
for _ in range(solver.max_eval_batches):
    reloaded.eval()
reloaded_metrics = dict(reloaded.get_eval_metrics())
print(f"[HUGECTR][INFO] reloaded model: {reloaded_metrics}")
