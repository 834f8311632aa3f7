"""The clients of ``bench.server.run``: one client over tritonclient (HTTP, gRPC) or over
requests built once (``-raw``), the latency runs that take turns between paths, and the
64-client load of :mod:`bench.server.loadgen` with its options (``--loadgen``,
``--grpc-channels``)."""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from bench.server import loadgen


def _stats(times: list[float], rows: int) -> dict:
    times = sorted(times)
    p50 = times[len(times) // 2]
    p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
    return {
        "p50_ms": p50 * 1e3, "p99_ms": p99 * 1e3, "rows_per_s": rows / statistics.mean(times),
        "over_3x_p50": sum(t > 3 * p50 for t in times) / len(times),  # the tail: calls >3x p50
    }  # fmt: skip


def client_call(protocol: str, url: str):
    """A function that sends (dense, keys) over ``protocol`` and returns OUTPUT0."""
    if protocol == "http":
        import tritonclient.http as mod
    else:
        import tritonclient.grpc as mod
    client = mod.InferenceServerClient(url)

    def call(des, cat):
        a = mod.InferInput("DES", list(des.shape), "FP32")
        a.set_data_from_numpy(des)
        k = mod.InferInput("CATCOLUMN", list(cat.shape), "INT64")
        k.set_data_from_numpy(cat)
        return client.infer("dlrm", [a, k]).as_numpy("OUTPUT0")

    return call


def prebuilt_call(protocol: str, url: str):
    """As :func:`client_call`, but the request bytes are built once per batch (as the
    concurrency runs send them) and the reply is read with no client library: the end-to-end
    time of the server and the connection without tritonclient's own cost per call
    (building and reading the tensors' messages)."""
    built: dict = {}
    if protocol == "http":
        import http.client

        host, port = url.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port))

        def call(des, cat):
            key = (des.ctypes.data, des.shape, cat.ctypes.data, cat.shape)
            if key not in built:
                built[key] = http_request(des, cat)
            req = built[key]
            try:
                conn.request("POST", req.path, req.body, req.headers)
                reply = conn.getresponse()
            except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
                conn.close()  # the server closed the kept-alive connection: once more, anew
                conn.request("POST", req.path, req.body, req.headers)
                reply = conn.getresponse()
            body = reply.read()
            if reply.status != 200:
                raise RuntimeError(f"HTTP {reply.status}: {body[:200]!r}")
            header = reply.getheader("Inference-Header-Content-Length")
            if header is None:  # JSON tensors
                return np.asarray(json.loads(body)["outputs"][0]["data"], np.float32)
            return np.frombuffer(body, np.float32, offset=int(header))

        return call
    import grpc
    from tritonclient.grpc import service_pb2

    channel = grpc.insecure_channel(url)
    infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")

    def call(des, cat):
        key = (des.ctypes.data, des.shape, cat.ctypes.data, cat.shape)
        if key not in built:
            built[key] = grpc_request_bytes(des, cat)
        reply = service_pb2.ModelInferResponse.FromString(infer(built[key]))
        return np.frombuffer(reply.raw_output_contents[0], np.float32)

    return call


def interleaved(paths: dict, data: dict, repeats: dict, rounds: int = 20) -> dict:
    """Per batch size, each path in turn for ``repeats[b] / rounds`` calls, ``rounds`` times,
    so machine noise falls on every path alike (short turns: other jobs' bursts last seconds,
    and a turn of 20 batch-1024 calls takes about one)."""
    out: dict = {name: {} for name in paths}
    for b, (des, cat) in data.items():
        samples: dict = {name: [] for name in paths}
        for fn in paths.values():
            for _ in range(3):
                fn(des, cat)
        for _ in range(rounds):
            for name, fn in paths.items():
                for _ in range(max(1, repeats[b] // rounds)):
                    t0 = time.perf_counter()
                    fn(des, cat)
                    samples[name].append(time.perf_counter() - t0)
        for name in paths:
            out[name][b] = _stats(samples[name], b)
    return out


def grpc_request_bytes(des: np.ndarray, cat: np.ndarray) -> bytes:
    """A serialized ``ModelInferRequest`` as tritonclient.grpc builds it (raw contents)."""
    import tritonclient.grpc as tg
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name="dlrm")
    for name, array, datatype in (("DES", des, "FP32"), ("CATCOLUMN", cat, "INT64")):
        inp = tg.InferInput(name, list(array.shape), datatype)
        inp.set_data_from_numpy(array)
        request.inputs.extend([inp._get_tensor()])
        request.raw_input_contents.extend([inp._get_content()])
    return request.SerializeToString()


#: The 64-client HTTP load sends JSON tensors instead of the binary extension (for peers
#: without it, as MLServer).
HTTP_JSON = False


def http_request(des: np.ndarray, cat: np.ndarray) -> loadgen.HttpRequest:
    """A KServe v2 infer request (binary tensor extension, or JSON tensors with
    :data:`HTTP_JSON`) as tritonclient.http sends it."""
    import tritonclient.http as th

    inputs = []
    for name, array, datatype in (("DES", des, "FP32"), ("CATCOLUMN", cat, "INT64")):
        inp = th.InferInput(name, list(array.shape), datatype)
        inp.set_data_from_numpy(array, binary_data=not HTTP_JSON)
        inputs.append(inp)
    body, header_length = th.InferenceServerClient.generate_request_body(inputs)
    if isinstance(body, str):
        body = body.encode()
    headers = (
        {"Content-Type": "application/octet-stream",
         "Inference-Header-Content-Length": str(header_length)}
        if header_length is not None
        else {"Content-Type": "application/json"}
    )  # fmt: skip
    return loadgen.HttpRequest("/v2/models/dlrm/infer", headers, body)


def http_request_bytes(des: np.ndarray, cat: np.ndarray, host: str) -> bytes:
    """The whole HTTP/1.1 request of :func:`http_request`, as sent on the wire."""
    return http_request(des, cat).raw(host)


#: The load generator of the concurrency runs (--loadgen): ``auto`` (native, wrk and h2load,
#: where installed; else python), ``native`` or ``python`` (see :mod:`bench.server.loadgen`).
LOADGEN = "auto"
#: gRPC connections the load generator spreads its clients over (--grpc-channels); None: the
#: generator's default (native: one per client; python: one, as tritonclient's aio client).
#: Worker processes need several: the kernel gives each connection to one worker.
GRPC_CHANNELS: int | None = None


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    """The load generator's options (--loadgen, --grpc-channels), for every serving bench."""
    parser.add_argument(
        "--loadgen", choices=loadgen.GENERATORS, default="auto",
        help="load generator of the concurrency runs: native (wrk and h2load; install with "
        f"`{loadgen.INSTALL}`), python (asyncio in this process), auto (native where "
        "installed, the default)",
    )  # fmt: skip
    parser.add_argument(
        "--grpc-channels", type=int, default=None, metavar="N",
        help="gRPC connections of the 64-client load (default: native one per client, python "
        "1 as tritonclient's aio client; worker processes need several: each connection goes "
        "to one worker)",
    )  # fmt: skip


def use_load_arguments(args: argparse.Namespace) -> str:
    """Apply :func:`add_load_arguments`' options; returns the generator that will run."""
    global LOADGEN, GRPC_CHANNELS
    LOADGEN = loadgen.resolve(args.loadgen)
    GRPC_CHANNELS = args.grpc_channels
    return LOADGEN


def concurrent_load(
    protocol: str, url: str, data: dict, clients: int, seconds: float
) -> loadgen.LoadResult:
    """``clients`` concurrent batch-1 clients over ``protocol`` for ``seconds`` with the
    load generator of :data:`LOADGEN` (replies checked)."""
    des, cat = data[1]
    if protocol == "grpc":
        return loadgen.grpc_load(url, grpc_request_bytes(des, cat), clients, seconds,
                                 LOADGEN, GRPC_CHANNELS)  # fmt: skip
    return loadgen.http_load(url, http_request(des, cat), clients, seconds, LOADGEN)


def concurrent_throughput(
    protocol: str, url: str, data: dict, clients: int, seconds: float
) -> tuple[float, float]:
    """Requests (= rows) per second of ``clients`` concurrent batch-1 clients over
    ``protocol``, and the load generator's own CPU seconds per request."""
    result = concurrent_load(protocol, url, data, clients, seconds)
    return result.rate, result.cpu_per_request
