"""DIN (Deep Interest Network) the HugeCTR way (modelled on HugeCTR's samples/din): a user,
a history of 10 goods and categories plus the candidate item (the 11th slot); attention of
the candidate over the history (FusedReshapeConcat, Scale, Sub, ElementwiseMultiply,
Softmax, ReduceSum), then an MLP with Dice activations.

Runs unchanged on HugeCTR with ``import hugectr``.  Environment settings: ``DATA_DIR``
(Norm data with file_list.txt / file_list_test.txt; generated there when missing),
``OUT_DIR``, ``MAX_ITER``, ``BATCH``, ``EVAL_BATCH``, ``EVAL_BATCHES``, ``LR``.
"""

import os

import tierserve.trainer as hugectr

env = os.environ.get
DATA_DIR = env("DATA_DIR", "./din_data")
OUT_DIR = env("OUT_DIR", "./din_out")
MAX_ITER = int(env("MAX_ITER", "300"))
BATCH = int(env("BATCH", "512"))
EVAL_BATCH = int(env("EVAL_BATCH", "2048"))
EVAL_BATCHES = int(env("EVAL_BATCHES", "2"))
LR = float(env("LR", "0.001"))
EMB = 18
HIS = 10

if not os.path.exists(os.path.join(DATA_DIR, "file_list.txt")):
    hugectr.tools.DataGenerator(
        hugectr.tools.DataGeneratorParams(
            format=hugectr.DataReaderType_t.Norm,
            label_dim=1,
            dense_dim=0,
            num_slot=1 + 2 * (HIS + 1),
            i64_input_key=True,
            source=os.path.join(DATA_DIR, "file_list.txt"),
            eval_source=os.path.join(DATA_DIR, "file_list_test.txt"),
            slot_size_array=[500] + [300] * (HIS + 1) + [40] * (HIS + 1),
            check_type=hugectr.Check_t.Sum,
            dist_type=hugectr.tools.Distribution_t.PowerLaw,
            power_law_type=hugectr.tools.PowerLaw_t.Short,
            num_files=4,
            eval_num_files=1,
            num_samples_per_file=int(env("SAMPLES_PER_FILE", "8192")),
        )
    ).generate()

solver = hugectr.CreateSolver(max_eval_batches=EVAL_BATCHES, batchsize_eval=EVAL_BATCH,
                              batchsize=BATCH, lr=LR, vvgpu=[[0]], i64_input_key=True,
                              use_mixed_precision=False, repeat_dataset=True)
reader = hugectr.DataReaderParams(data_reader_type=hugectr.DataReaderType_t.Norm,
                                  source=[os.path.join(DATA_DIR, "file_list.txt")],
                                  eval_source=os.path.join(DATA_DIR, "file_list_test.txt"),
                                  check_type=hugectr.Check_t.Sum)
optimizer = hugectr.CreateOptimizer(optimizer_type=hugectr.Optimizer_t.Adam,
                                    update_type=hugectr.Update_t.Global,
                                    beta1=0.9, beta2=0.999, epsilon=0.000000001)
model = hugectr.Model(solver, reader, optimizer)
model.add(hugectr.Input(label_dim=1, label_name="label", dense_dim=0, dense_name="dense",
                        data_reader_sparse_param_array=[
                            hugectr.DataReaderSparseParam("UserID", 1, True, 1),
                            hugectr.DataReaderSparseParam("GoodID", 1, True, HIS + 1),
                            hugectr.DataReaderSparseParam("CateID", 1, True, HIS + 1)]))
for name, bottom in (("user", "UserID"), ("good", "GoodID"), ("cate", "CateID")):
    model.add(hugectr.SparseEmbedding(
        embedding_type=hugectr.Embedding_t.DistributedSlotSparseEmbeddingHash,
        workspace_size_per_gpu_in_mb=8, embedding_vec_size=EMB, combiner="sum",
        sparse_embedding_name=f"sparse_embedding_{name}", bottom_name=bottom,
        optimizer=optimizer))
D, L = hugectr.DenseLayer, hugectr.Layer_t
W = 2 * EMB
model.add(D(layer_type=L.FusedReshapeConcat,
            bottom_names=["sparse_embedding_good", "sparse_embedding_cate"],
            top_names=["FusedReshapeConcat_item_his_em", "FusedReshapeConcat_item"]))
model.add(D(layer_type=L.Slice, bottom_names=["FusedReshapeConcat_item"],
            top_names=["item1", "item2"], ranges=[(0, W), (0, W)]))
model.add(D(layer_type=L.Slice, bottom_names=["FusedReshapeConcat_item_his_em"],
            top_names=["item_his1", "item_his2", "item_his3", "item_his4", "item_his5"],
            ranges=[(0, W)] * 5))
model.add(D(layer_type=L.Scale, bottom_names=["item1"], top_names=["Scale_item"],
            axis=1, factor=HIS))
model.add(D(layer_type=L.Slice, bottom_names=["Scale_item"],
            top_names=["Scale_item1", "Scale_item2", "Scale_item3"], ranges=[(0, W)] * 3))
model.add(D(layer_type=L.Sub, bottom_names=["Scale_item1", "item_his1"], top_names=["sub_ih"]))
model.add(D(layer_type=L.ElementwiseMultiply, bottom_names=["Scale_item2", "item_his2"],
            top_names=["ElementWiseMul_i"]))
model.add(D(layer_type=L.Concat,
            bottom_names=["Scale_item3", "item_his3", "sub_ih", "ElementWiseMul_i"],
            top_names=["concat_i_h"]))
model.add(D(layer_type=L.InnerProduct, bottom_names=["concat_i_h"], top_names=["fc_att_i2"],
            num_output=40))
model.add(D(layer_type=L.InnerProduct, bottom_names=["fc_att_i2"], top_names=["fc_att_i3"],
            num_output=1))
model.add(D(layer_type=L.Reshape, bottom_names=["fc_att_i3"], top_names=["reshape_score"],
            leading_dim=HIS))
model.add(D(layer_type=L.Softmax, bottom_names=["reshape_score"], top_names=["softmax_att_i"]))
model.add(D(layer_type=L.Scale, bottom_names=["softmax_att_i"], top_names=["Scale_i"],
            axis=0, factor=W))
model.add(D(layer_type=L.Reshape, bottom_names=["item_his4"], top_names=["reshape_item_his"],
            leading_dim=HIS * W))
model.add(D(layer_type=L.ElementwiseMultiply, bottom_names=["Scale_i", "reshape_item_his"],
            top_names=["ElementwiseMul_ih"]))
model.add(D(layer_type=L.ReduceSum, bottom_names=["ElementwiseMul_ih"], top_names=["reduce_ih"],
            axis=1))
model.add(D(layer_type=L.Reshape, bottom_names=["item_his5"], top_names=["reshape_his"],
            leading_dim=W, time_step=HIS))
model.add(D(layer_type=L.ReduceMean, bottom_names=["reshape_his"],
            top_names=["reduce_item_his"], axis=1))
model.add(D(layer_type=L.Reshape, bottom_names=["reduce_item_his"],
            top_names=["reshape_reduce_item_his"], leading_dim=W))
model.add(D(layer_type=L.Reshape, bottom_names=["sparse_embedding_user"],
            top_names=["reshape_user"], leading_dim=EMB))
model.add(D(layer_type=L.Concat,
            bottom_names=["reshape_user", "reshape_reduce_item_his", "reduce_ih", "item2"],
            top_names=["concat_din_i"]))
model.add(D(layer_type=L.InnerProduct, bottom_names=["concat_din_i"], top_names=["fc_din_i1"],
            num_output=64))
model.add(D(layer_type=L.PReLU_Dice, bottom_names=["fc_din_i1"], top_names=["dice_1"],
            elu_alpha=0.2, eps=1e-8))
model.add(D(layer_type=L.InnerProduct, bottom_names=["dice_1"], top_names=["fc_din_i2"],
            num_output=32))
model.add(D(layer_type=L.PReLU_Dice, bottom_names=["fc_din_i2"], top_names=["dice_2"],
            elu_alpha=0.2, eps=1e-8))
model.add(D(layer_type=L.InnerProduct, bottom_names=["dice_2"], top_names=["fc_din_i3"],
            num_output=1))
model.add(D(layer_type=L.BinaryCrossEntropyLoss, bottom_names=["fc_din_i3", "label"],
            top_names=["loss"]))
model.compile()
model.summary()
model.fit(max_iter=MAX_ITER, display=100, eval_interval=MAX_ITER, snapshot=MAX_ITER,
          snapshot_prefix=os.path.join(OUT_DIR, "din"))
model.graph_to_json(graph_config_file=os.path.join(OUT_DIR, "din.json"))
for _ in range(solver.max_eval_batches):
    model.eval()
metrics = dict(model.get_eval_metrics())
print(f"[HUGECTR][INFO] trained model: {metrics}")

reloaded = hugectr.Model(solver, reader, optimizer)
reloaded.construct_from_json(graph_config_file=os.path.join(OUT_DIR, "din.json"),
                             include_dense_network=True)
reloaded.compile()
reloaded.load_dense_weights(os.path.join(OUT_DIR, f"din_dense_{MAX_ITER}.model"))
reloaded.load_sparse_weights([os.path.join(OUT_DIR, f"din{i}_sparse_{MAX_ITER}.model")
                              for i in range(3)])
for _ in range(solver.max_eval_batches):
    reloaded.eval()
reloaded_metrics = dict(reloaded.get_eval_metrics())
print(f"[HUGECTR][INFO] reloaded model: {reloaded_metrics}")
