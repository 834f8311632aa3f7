"""gRPC front ends: KServe v2 ``GRPCInferenceService`` on ``grpc.aio`` and on the native
transport, both thin over :mod:`tierserve.server.runtime`'s data plane; ``gen`` holds the
messages generated from ``proto/``."""
