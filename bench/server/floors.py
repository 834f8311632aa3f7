"""Servers that answer an infer request without doing any work: the transports' own cost.

    python -m bench.server.floors http PORT     # uvicorn + httptools, answering nothing
    python -m bench.server.floors grpc PORT     # grpc.aio, as tierserve serves gRPC

``bench.server.run`` drives them with the same load generator as the real servers
(:mod:`bench.server.loadgen`: wrk and h2load, or ``--loadgen python``).  The CPU
each spends per request is a floor under any Python server on the same transport, and with it
a ceiling on what dynamic batching can gain: with batching the model's share of a request
shrinks to its share of a merged batch, while the transport's cost stays whole.

The HTTP floor reads the whole body and answers 200 with a fixed binary-tensor reply over
plain uvicorn with httptools (its fastest HTTP/1.1 parser); the gRPC floor
answers ``ModelInfer`` with fixed bytes, never parsing the request.
"""

from __future__ import annotations

import asyncio
import sys

#: A KServe v2 binary-tensor reply of about the real one's size (one FP32 output, batch 1).
_JSON = (
    b'{"model_name":"dlrm","model_version":"1","outputs":[{"name":"OUTPUT0","datatype":'
    b'"FP32","shape":[1,1],"parameters":{"binary_data_size":4}}]}'
)
HTTP_BODY = _JSON + b"\x00\x00\x00\x3f"
HTTP_HEADERS = [
    (b"content-length", str(len(HTTP_BODY)).encode()),
    (b"content-type", b"application/octet-stream"),
    (b"inference-header-content-length", str(len(_JSON)).encode()),
]
#: A serialized ``ModelInferResponse`` naming the model (any non-empty reply will do).
GRPC_REPLY = b"\n\x04dlrm\x12\x011"


async def empty_asgi(scope, receive, send) -> None:
    """Read the request, answer the fixed reply (lifespan: nothing to do)."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            kind = message["type"].rsplit(".", 1)[1]  # startup or shutdown
            await send({"type": f"lifespan.{kind}.complete"})
            if kind == "shutdown":
                return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": HTTP_HEADERS})
    await send({"type": "http.response.body", "body": HTTP_BODY})


def serve_http(port: int) -> None:
    import uvicorn

    uvicorn.run(
        empty_asgi, host="127.0.0.1", port=port, log_level="warning", access_log=False,
        loop="asyncio", http="httptools",
    )  # fmt: skip


def serve_grpc(port: int) -> None:
    import grpc

    async def model_infer(request: bytes, context) -> bytes:
        return GRPC_REPLY

    handler = grpc.method_handlers_generic_handler(
        "inference.GRPCInferenceService",
        {"ModelInfer": grpc.unary_unary_rpc_method_handler(model_infer)},
    )

    async def main() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await server.wait_for_termination()

    asyncio.run(main())


if __name__ == "__main__":
    kind, port = sys.argv[1], int(sys.argv[2])
    {"http": serve_http, "grpc": serve_grpc}[kind](port)
