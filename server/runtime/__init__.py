"""What serves a model, whatever the transport: the data plane, servables, tensors, dynamic
batching, admission, the model repository and its loader, metrics and the process's memory
settings.  Imports no front end (:mod:`tierserve.server.http`, :mod:`tierserve.server.grpc`)."""
