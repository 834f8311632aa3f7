# The new document's DataReaderParams examples for Raw and Parquet data, and its AsyncParam
# and HybridEmbeddingParam examples.  Departures: the document's HybridEmbeddingParam line
# ends in a stray ")" (a syntax error), removed.  The MLPerf objects are accepted and warn
# (see README "HugeCTR compatibility").  Files: ./wdl_raw/train_data.bin,
# ./wdl_raw/validation_data.bin, ./parquet_data/train/_file_list.txt,
# ./parquet_data/val/_file_list.txt (written by new_data_generator_raw_parquet.py).
import tierserve.trainer as hugectr

async_param = hugectr.AsyncParam(32, 4, 716800, 2, 512, True, hugectr.Alignment_t.Non)
hybrid_embedding_param = hugectr.HybridEmbeddingParam(2, -1, 0.01, 1.3e11, 1.9e11, 1.0,
                                                    hugectr.CommunicationType.IB_NVLink_Hier,
                                                    hugectr.HybridEmbeddingType.Distributed)

raw_reader = hugectr.DataReaderParams(data_reader_type = hugectr.DataReaderType_t.Raw,
                                  source = ["./wdl_raw/train_data.bin"],
                                  eval_source = "./wdl_raw/validation_data.bin",
                                  check_type = hugectr.Check_t.Sum)
parquet_reader = hugectr.DataReaderParams(data_reader_type = hugectr.DataReaderType_t.Parquet,
                                  source = ["./parquet_data/train/_file_list.txt"],
                                  eval_source = "./parquet_data/val/_file_list.txt",
                                  check_type = hugectr.Check_t.Non,
                                  slot_size_array = [10000, 50000, 20000, 300])
async_reader = hugectr.DataReaderParams(data_reader_type = hugectr.DataReaderType_t.RawAsync,
                                  source = ["./wdl_raw/train_data.bin"],
                                  eval_source = "./wdl_raw/validation_data.bin",
                                  check_type = hugectr.Check_t.Sum,
                                  async_param = async_param)

results = {}
for name, reader, embedding_type, i64 in [
        ("Raw", raw_reader, hugectr.Embedding_t.LocalizedSlotSparseEmbeddingOneHot, False),
        ("Parquet", parquet_reader, hugectr.Embedding_t.DistributedSlotSparseEmbeddingHash, True)]:
    solver = hugectr.CreateSolver(max_eval_batches = 2, batchsize_eval = 256, batchsize = 256,
                                  lr = 0.001, vvgpu = [[0]], repeat_dataset = True,
                                  i64_input_key = i64)
    optimizer = hugectr.CreateOptimizer(optimizer_type = hugectr.Optimizer_t.Adam)
    model = hugectr.Model(solver, reader, optimizer)
    model.add(hugectr.Input(label_dim = 1, label_name = "label",
                            dense_dim = 3, dense_name = "dense",
                            data_reader_sparse_param_array =
                            [hugectr.DataReaderSparseParam("data1", 1, True, 4)]))
    model.add(hugectr.SparseEmbedding(embedding_type = embedding_type,
                                workspace_size_per_gpu_in_mb = 8,
                                embedding_vec_size = 8,
                                combiner = "sum",
                                sparse_embedding_name = "sparse_embedding1",
                                bottom_name = "data1",
                                slot_size_array = [10000, 50000, 20000, 300],
                                optimizer = optimizer,
                                hybrid_embedding_param = hybrid_embedding_param))
    model.add(hugectr.DenseLayer(layer_type = hugectr.Layer_t.Reshape,
                                bottom_names = ["sparse_embedding1"],
                                top_names = ["reshape1"],
                                leading_dim=32))
    model.add(hugectr.DenseLayer(layer_type = hugectr.Layer_t.Concat,
                                bottom_names = ["reshape1", "dense"],
                                top_names = ["concat1"]))
    model.add(hugectr.DenseLayer(layer_type = hugectr.Layer_t.InnerProduct,
                                bottom_names = ["concat1"],
                                top_names = ["fc1"],
                                num_output=1))
    model.add(hugectr.DenseLayer(layer_type = hugectr.Layer_t.BinaryCrossEntropyLoss,
                                bottom_names = ["fc1", "label"],
                                top_names = ["loss"]))
    model.compile()
    model.fit(max_iter = 10, display = 5, eval_interval = 10)
    for _ in range(solver.max_eval_batches):
        model.eval()
    results[name] = model.get_eval_metrics()
