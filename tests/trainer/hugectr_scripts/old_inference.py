# The old document's "Inference" sample.  Departures: `from mpi4py import MPI` left out (one
# process); the document defines `use_embedding_cache` but passes `use_gpu_embedding_cache`,
# which it never defines: the first is used.  Files: your_inference_config.json (the older
# inference JSON: an "inference" clause and the layers, last a Sigmoid), the model files it
# names (32-bit keys, "input_key_type": "I32"), your_inference_inputs_data.txt.
from tierserve.trainer.inference import CreateParameterServer, CreateEmbeddingCache, InferenceSession
config_file = "your_inference_config.json"
model_name = "your_model_name"
data_path = "your_inference_inputs_data.txt"
use_embedding_cache = True
# read data from file
data_file = open(data_path)
labels = [int(item) for item in data_file.readline().split(' ')]
dense_features = [float(item) for item in data_file.readline().split(' ')]
embedding_columns = [int(item) for item in data_file.readline().split(' ')]
row_ptrs = [int(item) for item in data_file.readline().split(' ')]
# create parameter server, embedding cache and inference session
parameter_server = CreateParameterServer([config_file], [model_name], False)
embedding_cache = CreateEmbeddingCache(parameter_server, 0, use_embedding_cache, 0.2, config_file, model_name, False)
inference_session = InferenceSession(config_file, 0, embedding_cache)
# make prediction and calculate accuracy
output = inference_session.predict(dense_features, embedding_columns, row_ptrs)
