# The new document's Inference API: InferenceParams, VolatileDatabaseParams,
# PersistentDatabaseParams, UpdateSourceParams and InferenceModel.predict / evaluate, on a
# model trained with HugeCTR's default 32-bit keys (i64_input_key=False).  The document shows
# the objects one by one; here they are put together.  Files: m32.json, m32_dense_30.model,
# m320_sparse_30.model, eval_list.txt (Norm, 32-bit keys).
import tierserve.trainer as hugectr

vdb = hugectr.inference.VolatileDatabaseParams()
vdb.type = hugectr.DatabaseType_t.hash_map
vdb.algorithm = hugectr.DatabaseHashMapAlgorithm_t.phm
vdb.overflow_margin = 1000000
vdb.overflow_policy = hugectr.DatabaseOverflowPolicy_t.evict_oldest
vdb.overflow_resolution_target = 0.8
vdb.initial_cache_rate = 1.0
vdb.refresh_time_after_fetch = True
vdb.update_filters = [".+"]

pdb = hugectr.inference.PersistentDatabaseParams()
pdb.type = hugectr.DatabaseType_t.rocks_db
pdb.path = "./rocksdb"
pdb.num_threads = 2
pdb.read_only = False
pdb.max_get_batch_size = 10000
pdb.max_set_batch_size = 10000

source = hugectr.inference.UpdateSourceParams()
source.type = hugectr.UpdateSourceType_t.null

inference_params = hugectr.inference.InferenceParams(
    model_name="m32",
    max_batchsize=256,
    hit_rate_threshold=0.9,
    dense_model_file="m32_dense_30.model",
    sparse_model_files=["m320_sparse_30.model"],
    use_gpu_embedding_cache=True,
    cache_size_percentage=0.5,
    i64_input_key=False,
    volatile_db=vdb,
    persistent_db=pdb,
    update_source=source,
)
inference_model = hugectr.inference.InferenceModel("m32.json", inference_params)
predictions = inference_model.predict(
    4, "eval_list.txt", hugectr.DataReaderType_t.Norm, hugectr.Check_t.Sum
)
auc = inference_model.evaluate(
    4, "eval_list.txt", hugectr.DataReaderType_t.Norm, hugectr.Check_t.Sum
)
print("predictions", predictions.shape, "AUC", auc)
