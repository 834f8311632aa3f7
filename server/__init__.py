"""tierserve inference server: the app, settings and HugeCTR's inference API at the top;
the data plane and what it serves in ``runtime``; the HTTP and gRPC front ends in ``http`` and
``grpc``."""
