# CreateInferenceSession, the HugeCTR 3.x form the new document's inference section grew from
# (InferenceParams, then a session whose predict takes flat dense features, keys and row
# pointers).  Files: m32.json and its model files (32-bit keys).
import tierserve.trainer as hugectr

inference_params = hugectr.inference.InferenceParams(
    model_name="m32",
    max_batchsize=64,
    hit_rate_threshold=0.5,
    dense_model_file="m32_dense_30.model",
    sparse_model_files=["m320_sparse_30.model"],
    use_gpu_embedding_cache=False,
    cache_size_percentage=0.9,
    i64_input_key=False,
)
inference_session = hugectr.inference.CreateInferenceSession("m32.json", inference_params)
