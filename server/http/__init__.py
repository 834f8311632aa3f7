"""HTTP front ends: the KServe v2 REST routes (FastAPI), the native transport's fast path
and the uvicorn transport, both thin over :mod:`tierserve.server.runtime`'s data plane."""
