"""tierserve inference server: InferenceModel, data plane, REST and gRPC front ends."""
