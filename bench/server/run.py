"""Benchmark of the server against InferenceModel.predict in the same run.

    python -m bench.server.run                    # the trainer issue's DLRM (see 1.)
    python -m bench.server.run --quick            # fewer requests
    python -m bench.server.run --train-dir /tmp/b # keep the trained model for the next run
    python -m bench.server.run --volatile redis_cluster

1. Trains the trainer issue's DLRM (``tests/trainer/scripts/dlrm.py`` with 26 tables of dim 16,
   ~1M keys in all, power-law keys, bottom MLP 13-512-256-16, top MLP 512-256-1; the same model
   as ``bench.trainer.run``) for a few iterations and writes it into a model repository (hash
   map tier).  The sparse file then holds every key of the ~1M (vectors the few training
   iterations never touched are drawn at random), so the tier is as large as the model's.
2. Times ``InferenceModel.predict_batch`` on fixed batches of 1, 64 and 1024 rows (the peer).
   The peer's process gets the malloc settings ``tierserve serve`` gives itself
   (``server/runtime/allocator.py``; ``--no-malloc-tuning`` leaves both at glibc's defaults) and its
   BLAS thread count (1, or what ``--server-args`` gives ``--blas-threads``).
3. Starts ``tierserve serve`` in a subprocess and sends the same batches, one client, over HTTP
   (tritonclient.http, binary tensors) and gRPC (tritonclient.grpc): throughput and p50/p99.
   Overhead = end-to-end p50 minus predict p50, over predict p50.  The ``-raw`` paths send
   the same requests built once and read the replies without tritonclient: the server's and
   the connection's share alone.
4. 64 concurrent batch-1 clients against the server with dynamic batching on and a second one
   with it off, in alternating turns: throughput ratio, over gRPC and over HTTP.  The load
   generator must cost little CPU per request, since it shares the cores with the server:
   :mod:`bench.server.loadgen` sends real KServe v2 requests (the same bytes tritonclient
   sends, built once), by default with the native ``wrk`` (64 HTTP/1.1 keep-alive
   connections, binary tensor extension) and ``h2load`` (64 HTTP/2 connections, one call in
   flight on each), ``--loadgen python`` with asyncio in this process; every reply is checked
   (a run with a failed one stops the benchmark).  It is the same for batched and unbatched.
5. The same load against servers that answer without doing any work (``bench.server.floors``:
   uvicorn + httptools, and grpc.aio): the transport's own CPU per request.  The unbatched
   server's CPU per request over that floor plus predict's time per row at batch 64 bounds
   the ratio of 4. while the server is bound by its CPU: batching shrinks the model's share
   of a request to that, and the transport's share not at all.

Prints a table (and with ``--json FILE`` writes the figures there).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The server runs one BLAS thread per inference thread (tierserve serve's default); the peer
# gets the same, set before numpy loads.
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import numpy as np  # noqa: E402

from bench.server import loadgen  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BATCHES = (1, 64, 1024)
# The trainer issue's DLRM (bench.trainer.run): 26 tables x dim 16, ~1M keys, MLPs 512-256.
SLOTS = 26
KEYS = 1_000_000
MODEL_ENV = {
    "EMB_DIM": "16",
    "BOTTOM": "512,256",
    "TOP": "512,256",
    "SLOT_SIZES": ",".join([str(KEYS // SLOTS)] * SLOTS),
    "WORKSPACE_MB": "512",
}


def train(workdir: Path, iterations: int) -> Path:
    """Run the trainer's DLRM script; returns its output folder."""
    out = workdir / "out"
    env = {
        **os.environ,
        "DATA_DIR": str(workdir / "data"),
        "OUT_DIR": str(out),
        "MAX_ITER": str(iterations),
        "BATCH": "1024",
        "EVAL_BATCHES": "1",
        "NUM_FILES": "2",
        "TIERSERVE_FORCE_CPU": "1",
        **MODEL_ENV,
    }
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, str(ROOT / "tests" / "trainer" / "scripts" / "dlrm.py")],
        env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=workdir,
    )  # fmt: skip
    return out


def full_table(trained: Path, target: Path) -> int:
    """Write the trained sparse file to ``target`` with every key of the model's ~1M: the
    trained vectors, and random ones (the trainer's scale) for keys training never saw."""
    from tierserve.ps.sparse_file import read_sparse_model, write_sparse_model

    table = read_sparse_model(trained)
    total = (KEYS // SLOTS) * SLOTS
    keys = np.arange(total, dtype=np.int64)
    rng = np.random.default_rng(0)
    vectors = rng.uniform(-0.05, 0.05, (total, table.embeddings.shape[1])).astype(np.float32)
    known = np.asarray(table.keys, dtype=np.int64)
    inside = (known >= 0) & (known < total)
    vectors[known[inside]] = np.asarray(table.embeddings)[inside]
    extra = known[~inside]  # none expected: the generator draws keys below the slot sizes
    if extra.size:
        keys = np.concatenate([keys, extra])
        vectors = np.concatenate([vectors, np.asarray(table.embeddings)[~inside]])
    write_sparse_model(target, keys, vectors)
    return int(keys.size)


def make_repository(out: Path, iterations: int, repo: Path, volatile: dict | None = None) -> Path:
    version = repo / "dlrm" / "1"
    version.mkdir(parents=True)
    shutil.copy2(out / "dlrm.json", version / "dlrm.json")
    shutil.copy2(out / f"dlrm_dense_{iterations}.model", version)
    full_table(out / f"dlrm0_sparse_{iterations}.model",
               version / f"dlrm0_sparse_{iterations}.model")  # fmt: skip
    graph = json.loads((out / "dlrm.json").read_text())
    slots = graph["layers"][0]["sparse"][0]["slot_num"]
    ps = {
        "supportlonglong": True,
        "volatile_db": volatile or {"type": "hash_map"},
        "models": [{
            "model": "dlrm",
            "sparse_files": [f"dlrm0_sparse_{iterations}.model"],
            "dense_file": f"dlrm_dense_{iterations}.model",
            "network_file": "dlrm.json",
            "max_batch_size": 1024,
            "maxnum_des_feature_per_sample": 13,
            "maxnum_catfeature_query_per_table_per_sample": [slots],
            "embedding_vecsize_per_table": [16],
            "embedding_table_names": ["sparse_embedding1"],
            "gpucache": False,
            "slot_num": slots,
        }],
    }  # fmt: skip
    (repo / "ps.json").write_text(json.dumps(ps, indent=2))
    return version


def batches_from(version: Path, data_dir: Path):
    from tierserve.model.graph_json import load_graph_json
    from tierserve.trainer.hugectr.inference_data import wrapped_batches

    graph = load_graph_json(version / "dlrm.json")
    big = next(iter(wrapped_batches(graph, str(data_dir / "file_list_test.txt"), "Norm", "Sum",
                                    None, max(BATCHES), 1)))  # fmt: skip
    cat = big.sparse[0].keys.reshape(big.batch_size, -1)
    return {
        b: (np.ascontiguousarray(big.dense[:b]), np.ascontiguousarray(cat[:b])) for b in BATCHES
    }


def _stats(times: list[float], rows: int) -> dict:
    times = sorted(times)
    p50 = times[len(times) // 2]
    p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
    return {
        "p50_ms": p50 * 1e3, "p99_ms": p99 * 1e3, "rows_per_s": rows / statistics.mean(times),
        "over_3x_p50": sum(t > 3 * p50 for t in times) / len(times),  # the tail: calls >3x p50
    }  # fmt: skip


def predictor(version: Path, volatile: dict | None = None):
    """InferenceModel over the version's files and a function that predicts (dense, keys)."""
    from tierserve.model.batch import Batch, SparseInput
    from tierserve.server.inference_model import InferenceModel, InferenceParams

    dense_file = next(version.glob("*_dense_*.model"))
    sparse = sorted(str(p) for p in version.glob("*_sparse_*.model"))
    params = InferenceParams("dlrm", 1024, 0.9, str(dense_file), sparse, False, 0.5, True,
                             volatile_db=volatile or {"type": "hash_map"})  # fmt: skip
    model = InferenceModel(str(version / "dlrm.json"), params)

    def predict(des, cat):
        b = des.shape[0]
        batch = Batch(
            label=np.zeros((b, 1), np.float32), dense=des,
            sparse=(SparseInput(cat.reshape(-1), np.arange(cat.size + 1), cat.shape[1]),),
        )  # fmt: skip
        return model.predict_batch(batch)

    return model, predict


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


def snapshot(ref: str, where: Path) -> dict[str, str]:
    """The environment that runs ``tierserve`` as of git ``ref``: its files exported under
    ``where`` and a ``PYTHONPATH`` folder mapping ``tierserve.<pkg>`` onto them (ahead of the
    editable install's finder, which only answers what ``sys.path`` does not)."""
    src, path = where / "src", where / "path" / "tierserve"
    src.mkdir(parents=True)
    path.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", ref], cwd=ROOT, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True)
    for pkg in ("server", "ps", "cache", "trainer", "clients"):
        (path / pkg).symlink_to(src / pkg)
    if not (src / "cache" / "cuda").exists():
        (src / "cache" / "cuda").symlink_to(src / "cuda")
    return {"PYTHONPATH": str(path.parent)}


def start_server(
    repo: Path,
    http: int,
    grpc: int,
    batching: bool,
    extra: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> subprocess.Popen:
    """``tierserve serve`` in a subprocess, once it answers (``env``: added to this one's)."""
    import tritonclient.http as th

    args = [sys.executable, "-m", "tierserve.clients.cli", "serve", "--model-repository",
            str(repo), "--http-port", str(http), "--grpc-port", str(grpc), "--poll-interval", "0",
            "--log-level", "warning"]  # fmt: skip
    if not batching:
        args.append("--no-dynamic-batching")
    args.extend(extra)
    if env is None and "--workers" not in extra:  # this checkout: one process, as before
        args.extend(["--workers", "1"])
    proc = subprocess.Popen(
        args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, **(env or {})}, cwd="/" if env else None,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if th.InferenceServerClient(f"127.0.0.1:{http}").is_server_ready():
                return proc
        except Exception:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("server did not start")


def _with_workers(args: str) -> tuple[str, ...]:
    """``args`` split, with ``--workers 1`` unless they name a worker count (a server of this
    checkout would start one worker per core)."""
    split = tuple(args.split())
    return split if "--workers" in split else (*split, "--workers", "1")


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


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                todo.extend(int(c) for c in task.read_text().split())
    return out


def cpu_by_process(proc: subprocess.Popen) -> dict[int, float]:
    """CPU seconds (user + system) used so far by the server process (with its waited-for
    children) and by each of its live descendants (worker processes), by pid."""
    found = {}
    for pid in _descendants(proc.pid):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks = sum(int(f) for f in fields[11:15]) if pid == proc.pid else (
            int(fields[11]) + int(fields[12])
        )  # fmt: skip
        found[pid] = ticks / os.sysconf("SC_CLK_TCK")
    return found


def server_cpu(proc: subprocess.Popen) -> float:
    """CPU seconds (user + system) the server process and its worker processes have used so
    far (what exited workers used is counted once they were waited for)."""
    return sum(cpu_by_process(proc).values())


#: Other jobs' cores under which a turn counts as quiet (the machine is shared).
QUIET_CORES = 0.25


def machine_busy() -> float:
    """CPU seconds the whole machine has been busy (all cores, /proc/stat: not idle or
    waiting on I/O)."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def concurrency_runs(servers: dict, data: dict, seconds: float, turns: int = 4) -> dict:
    """Both protocols' concurrent throughput on each server (``name: (proc, http, grpc)``),
    with client and server CPU per request, the cores each server process used (the parent
    first: how evenly the kernel spread the load over worker processes) and the cores that
    other processes took meanwhile (``foreign_cores``: other jobs on the machine, which
    make a turn slower than the server can go).  The servers
    take ``turns`` turns of ``seconds / turns`` each, so other jobs' bursts fall on batched
    and unbatched alike; the figure is the median turn."""
    runs: dict = {(name, p): [] for name in servers for p in ("grpc", "http")}
    cores: dict = {(name, p): {} for name in servers for p in ("grpc", "http")}
    busy: dict = dict.fromkeys(runs, 0.0)
    for _ in range(turns):
        for protocol in ("grpc", "http"):
            for name, (proc, http, grpc) in servers.items():
                port = grpc if protocol == "grpc" else http
                before = cpu_by_process(proc)
                started, machine, own = time.perf_counter(), machine_busy(), time.process_time()
                result = concurrent_load(
                    protocol, f"127.0.0.1:{port}", data, 64, seconds / turns)  # fmt: skip
                elapsed = time.perf_counter() - started
                busy[(name, protocol)] += elapsed
                after = cpu_by_process(proc)
                used = {pid: after[pid] - before.get(pid, 0.0) for pid in after}
                # the python generator's CPU is this process's own
                native = result.cpu_s if result.generator != "python" else 0.0
                foreign = (
                    machine_busy() - machine - sum(used.values()) - native
                    - (time.process_time() - own)
                ) / elapsed  # fmt: skip
                server = sum(used.values()) / max(result.requests, 1)
                for pid, cpu in used.items():
                    key = "parent" if pid == proc.pid else pid
                    cores[(name, protocol)][key] = cores[(name, protocol)].get(key, 0.0) + cpu
                runs[(name, protocol)].append(
                    (result.rate, result.cpu_per_request, server, foreign)
                )
    out: dict = {name: {} for name in servers}
    for (name, protocol), turns_done in runs.items():
        out[name][protocol] = {
            "rows_s": statistics.median(t[0] for t in turns_done),
            "rows_s_turns": [t[0] for t in turns_done],
            "client_cpu_ms_per_request": statistics.median(t[1] for t in turns_done) * 1e3,
            "server_cpu_ms_per_request": statistics.median(t[2] for t in turns_done) * 1e3,
            "foreign_cores_turns": [t[3] for t in turns_done],
            "cores_by_process": {
                str(k): v / busy[(name, protocol)] for k, v in cores[(name, protocol)].items()
            },
        }
    return out


def floor_runs(seconds: float) -> dict:
    """Server CPU per request of the do-nothing servers of :mod:`bench.server.floors` under the
    same load as the real ones (64 batch-1 clients, same request bytes)."""
    import socket

    import grpc as grpc_mod

    from tierserve.server.app import free_port

    des = np.zeros((1, 13), np.float32)
    cat = np.zeros((1, SLOTS), np.int64)
    out = {}
    for protocol in ("grpc", "http"):
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.server.floors", protocol, str(port)], cwd=ROOT,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if protocol == "http":
                        socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    else:
                        with grpc_mod.insecure_channel(f"127.0.0.1:{port}") as channel:
                            grpc_mod.channel_ready_future(channel).result(timeout=1)
                    break
                except (OSError, grpc_mod.FutureTimeoutError):
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise RuntimeError(f"the {protocol} floor server did not start") from None
                    time.sleep(0.2)
            before = server_cpu(proc)
            result = concurrent_load(protocol, f"127.0.0.1:{port}", {1: (des, cat)}, 64, seconds)
            out[protocol] = {
                "rows_s": result.rate,
                "server_cpu_ms_per_request": (server_cpu(proc) - before) / result.requests * 1e3,
                "client_cpu_ms_per_request": result.cpu_per_request * 1e3,
            }
        finally:
            proc.terminate()
            proc.wait()
    return out


def model_share(predict, batch, calls: int = 20) -> float:
    """Milliseconds of ``predict`` per row of ``batch`` (the fastest of ``calls``)."""
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        predict(*batch)
        times.append(time.perf_counter() - t0)
    return min(times) / batch[0].shape[0] * 1e3


def executions(http: int) -> dict:
    """Requests and model executions the server counted (its /metrics)."""
    import urllib.request

    found = {"requests": 0, "executions": 0}
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=10).read()
    except OSError:  # a baseline without /metrics
        return found
    text = text.decode()
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name == "tierserve_batch_requests_sum":
            found["requests"] += int(float(line.rsplit(" ", 1)[1]))
        elif name == "tierserve_batch_requests_count":
            found["executions"] += int(float(line.rsplit(" ", 1)[1]))
    return found


def match_server_blas_threads(server_args: str) -> int:
    """Give this process's BLAS the thread count the server's model runs with (what
    ``server_args`` gives ``--blas-threads``, read by ``tierserve serve``'s own parser, else
    1: its default), so that ``predict`` and the server compute alike; returns it."""
    from tierserve.clients.cli import build_parser
    from tierserve.trainer.blas_threads import set_blas_threads

    serve = ["serve", "--model-repository", ".", *server_args.split()]
    threads = build_parser().parse_known_args(serve)[0].blas_threads or 1
    set_blas_threads(threads)
    return threads


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    parser.add_argument("--iterations", type=int, default=50, help="training iterations")
    parser.add_argument("--seconds", type=float, default=8.0, help="concurrency test length")
    parser.add_argument(
        "--turns", type=int, default=4,
        help="turns the concurrency test length is split into (each whole seconds long with "
        "the native load generator)",
    )  # fmt: skip
    parser.add_argument(
        "--train-dir", default=None,
        help="keep the trained model (and its data) here and reuse it on later runs",
    )  # fmt: skip
    parser.add_argument("--concurrency-only", action="store_true", help="skip the latency figures")
    parser.add_argument(
        "--no-malloc-tuning", action="store_true",
        help="glibc malloc defaults in the server and the peer (by default both raise the mmap "
        "and trim thresholds to 1 GiB, as tierserve serve does)",
    )  # fmt: skip
    parser.add_argument(
        "--baseline", default=None, metavar="GIT_REF",
        help="run the concurrency load against this checkout's server and the one of GIT_REF "
        "(both batched, alternating turns) instead of batched against unbatched",
    )  # fmt: skip
    parser.add_argument(
        "--server-args", default="", metavar="ARGS",
        help="extra arguments for this checkout's server (not the baseline's), e.g. "
        "'--workers 2'",
    )  # fmt: skip
    add_load_arguments(parser)
    parser.add_argument(
        "--compare-args", default="", metavar="ARGS",
        help="run the concurrency load against this checkout's batched server with "
        "--server-args and with these arguments (alternating turns), e.g. --server-args "
        "'--workers 2' --compare-args '--workers 1'",
    )  # fmt: skip
    parser.add_argument(
        "--volatile", choices=["hash_map", "multi_process_hash_map", "redis_cluster"],
        default="hash_map",
        help="volatile tier; redis_cluster starts a three-node cluster on loopback with the "
        "test suite's helpers (tests/services); multi_process_hash_map shares one copy of the "
        "table between worker processes (/dev/shm)",
    )  # fmt: skip
    args = parser.parse_args()
    use_load_arguments(args)
    blas_threads = match_server_blas_threads(args.server_args)
    scale = 0.3 if args.quick else 1.0
    repeats = {1: int(1000 * scale), 64: int(400 * scale), 1024: int(100 * scale)}
    from tierserve.server.app import free_port

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.train_dir:
            work = Path(args.train_dir)
            work.mkdir(parents=True, exist_ok=True)
        out = work / "out"
        if not (out / f"dlrm_dense_{args.iterations}.model").exists():
            print("training the trainer's DLRM ...", flush=True)
            out = train(work, args.iterations)
        repo = Path(tmp) / "repo"
        cluster, volatile = None, None
        if args.volatile == "redis_cluster":
            sys.path.insert(0, str(ROOT / "tests"))
            from services.redis import RedisCluster, ensure_redis

            ensure_redis()
            dirs = [Path(tmp) / f"redis-{i}" for i in range(3)]
            for d in dirs:
                d.mkdir()
            cluster = RedisCluster(dirs, [Path(tmp) / f"redis-{i}.log" for i in range(3)])
            cluster.start()
            volatile = {"type": "redis_cluster", "address": cluster.addresses}
        elif args.volatile == "multi_process_hash_map":
            volatile = {
                "type": args.volatile,
                "shared_memory_name": f"tierserve-bench-{os.getpid()}",
            }
        version = make_repository(out, args.iterations, repo, volatile)
        data = batches_from(version, work / "data")
        results: dict = {
            "cpu_count": os.cpu_count(),
            "volatile": args.volatile,
            "load_average_start": os.getloadavg()[0],
            "loadgen": LOADGEN,
            "grpc_channels": GRPC_CHANNELS,
            "blas_threads": blas_threads,
        }
        extra: tuple[str, ...] = ()
        if args.no_malloc_tuning:
            extra = ("--no-malloc-tuning",)
        else:  # the peer gets the allocator settings the server gives itself
            from tierserve.server.runtime.allocator import tune_malloc

            results["malloc_tuning"] = tune_malloc()
        model, predict = predictor(version, volatile)
        http, grpc = free_port(), free_port()
        mine = _with_workers(args.server_args)
        proc = start_server(repo, http, grpc, batching=True, extra=extra + mine)
        try:
            check = client_call("grpc", f"127.0.0.1:{grpc}")(*data[64])
            assert np.abs(check - predict(*data[64])).max() <= 1e-5, "server != predict"
            paths = {
                "predict": predict,
                "http": client_call("http", f"127.0.0.1:{http}"),
                "grpc": client_call("grpc", f"127.0.0.1:{grpc}"),
                "http-raw": prebuilt_call("http", f"127.0.0.1:{http}"),
                "grpc-raw": prebuilt_call("grpc", f"127.0.0.1:{grpc}"),
            }
            for name in ("http-raw", "grpc-raw"):
                got = paths[name](*data[64]).reshape(-1)
                assert np.abs(got - predict(*data[64]).reshape(-1)).max() <= 1e-5, name
            if not args.concurrency_only:
                results.update(interleaved(paths, data, repeats))
            u_http, u_grpc = free_port(), free_port()
            other = "baseline" if args.baseline else "unbatched"
            env, others = None, _with_workers("")
            if args.baseline:
                env, others = snapshot(args.baseline, Path(tmp) / "baseline"), ()
            elif args.compare_args:
                other, others = "compared", _with_workers(args.compare_args)
            unbatched = start_server(repo, u_http, u_grpc, batching=other != "unbatched",
                                     extra=extra + others, env=env)  # fmt: skip
            try:
                before, other_before = executions(http), executions(u_http)
                both = concurrency_runs(
                    {"batched": (proc, http, grpc), other: (unbatched, u_http, u_grpc)},
                    data, args.seconds, args.turns,
                )  # fmt: skip
                after, other_after = executions(http), executions(u_http)
            finally:
                unbatched.terminate()
                unbatched.wait()
            results["concurrent_batched"] = both["batched"]
            results[f"concurrent_{other}"] = both[other]
            results["executions"] = {k: after[k] - before[k] for k in after}
            results[f"executions_{other}"] = {k: other_after[k] - other_before[k] for k in after}
            results["floors"] = floor_runs(args.seconds / 2)
            results["predict_ms_per_row_at_64"] = model_share(predict, data[64])
        finally:
            proc.terminate()
            proc.wait()
            model.close()
            if cluster is not None:
                cluster.stop()

    results["load_average_end"] = os.getloadavg()[0]
    print(
        f"\nCPU cores: {results['cpu_count']}, BLAS threads (predict and server): "
        f"{results['blas_threads']}, volatile tier: {args.volatile}, malloc tuning: "
        f"{'off' if args.no_malloc_tuning else 'on'} (server and peer), load generator "
        f"{results['loadgen']}, load average "
        f"{results['load_average_start']:.1f} at the start, {results['load_average_end']:.1f} "
        "at the end (other jobs on the machine slow the paths unevenly)"
    )
    if not args.concurrency_only:
        print(f"{'path':<10}{'batch':>6}{'rows/s':>12}{'p50 ms':>9}{'p99 ms':>9}{'overhead':>10}"
              f"{'>3x p50':>9}")  # fmt: skip
    for path in ("predict", "http", "grpc", "http-raw", "grpc-raw") if not args.concurrency_only else ():
        for b in BATCHES:
            r = results[path][b]
            base = results["predict"][b]["p50_ms"]
            over = "" if path == "predict" else f"{(r['p50_ms'] - base) / base:>9.0%}"
            print(f"{path:<10}{b:>6}{r['rows_per_s']:>12,.0f}{r['p50_ms']:>9.3f}"
                  f"{r['p99_ms']:>9.3f}{over:>10}{r['over_3x_p50']:>9.1%}")  # fmt: skip
    if args.baseline or args.compare_args:
        other = "baseline" if args.baseline else "compared"
        against = args.baseline or args.compare_args
        for protocol in ("grpc", "http"):
            new = results["concurrent_batched"][protocol]
            old = results[f"concurrent_{other}"][protocol]
            ratio = new["rows_s"] / old["rows_s"]
            results[f"speedup_over_{other}_{protocol}"] = ratio
            turns = ", ".join(
                f"{a:,.0f}/{b:,.0f}" for a, b in zip(new["rows_s_turns"], old["rows_s_turns"])
            )
            quiet = [
                a / b
                for a, b, fa, fb in zip(
                    new["rows_s_turns"], old["rows_s_turns"],
                    new["foreign_cores_turns"], old["foreign_cores_turns"],
                )
                if max(fa, fb) < QUIET_CORES
            ]  # fmt: skip
            results[f"speedup_over_{other}_{protocol}_quiet_turns"] = quiet
            print(
                f"64 concurrent batch-1 {protocol} clients, batched: {new['rows_s']:,.0f} rows/s "
                f"here{' (' + args.server_args + ')' if args.server_args else ''}, "
                f"{old['rows_s']:,.0f} with {against} ({ratio:.2f}x; turns {turns}); "
                f"server CPU ms per request {new['server_cpu_ms_per_request']:.3f} here, "
                f"{old['server_cpu_ms_per_request']:.3f} with {against}; load generator "
                f"{new['client_cpu_ms_per_request']:.3f} / {old['client_cpu_ms_per_request']:.3f}"
            )
            for label, r in (("here", new), (against, old)):
                print(f"  cores by server process, {label} (parent first): " + ", ".join(
                    f"{k} {v:.2f}" for k, v in r["cores_by_process"].items())
                    + "; other jobs' cores per turn: " + ", ".join(
                    f"{v:.2f}" for v in r["foreign_cores_turns"]))  # fmt: skip
            print(
                f"  turn pairs where other jobs took under {QUIET_CORES} cores: {len(quiet)} of "
                f"{len(new['rows_s_turns'])}"
                + (f", ratio median {statistics.median(quiet):.2f}x (each: "
                   + ", ".join(f"{q:.2f}" for q in quiet) + ")" if quiet else "")
            )  # fmt: skip
    for protocol in ("grpc", "http") if other == "unbatched" else ():
        on = results["concurrent_batched"][protocol]
        off = results["concurrent_unbatched"][protocol]
        ratio = on["rows_s"] / off["rows_s"]
        results[f"batching_speedup_{protocol}"] = ratio
        turns = ", ".join(
            f"{a:,.0f}/{b:,.0f}" for a, b in zip(on["rows_s_turns"], off["rows_s_turns"])
        )
        print(
            f"64 concurrent batch-1 {protocol} clients: {on['rows_s']:,.0f} rows/s batched, "
            f"{off['rows_s']:,.0f} unbatched ({ratio:.1f}x; turns {turns}); CPU ms per request, server / "
            f"load generator: batched {on['server_cpu_ms_per_request']:.3f} / "
            f"{on['client_cpu_ms_per_request']:.3f}, unbatched "
            f"{off['server_cpu_ms_per_request']:.3f} / {off['client_cpu_ms_per_request']:.3f}"
        )
    share = results["predict_ms_per_row_at_64"]
    for protocol in ("grpc", "http") if other == "unbatched" else ():
        floor = results["floors"][protocol]["server_cpu_ms_per_request"]
        off = results["concurrent_unbatched"][protocol]["server_cpu_ms_per_request"]
        ceiling = off / (floor + share)
        results[f"batching_ceiling_{protocol}"] = ceiling
        print(
            f"{protocol} floor, a server that answers without any work: "
            f"{results['floors'][protocol]['rows_s']:,.0f} requests/s at {floor:.3f} ms server "
            f"CPU per request; with predict's {share:.3f} ms per row at batch 64, the unbatched "
            f"server's {off:.3f} ms bounds what batching can gain: {ceiling:.1f}x"
        )
    for protocol in ("grpc", "http"):
        floor = results["floors"][protocol]
        on = results["concurrent_batched"][protocol]["rows_s"]
        results[f"of_floor_{protocol}"] = on / floor["rows_s"]
        print(
            f"{protocol}: the batched server's {on:,.0f} rows/s is {on / floor['rows_s']:.2f}x the "
            f"do-nothing server's {floor['rows_s']:,.0f} requests/s "
            f"({floor['server_cpu_ms_per_request']:.3f} ms server CPU per request, load "
            f"generator {floor['client_cpu_ms_per_request']:.3f} ms)"
        )
    for label, key in (("batched server", "executions"), (other, f"executions_{other}")):
        ex = results[key]
        if ex["executions"]:
            print(
                f"{label}, concurrency runs: {ex['requests']:,} requests in "
                f"{ex['executions']:,} executions ({ex['requests'] / ex['executions']:.1f} per "
                "execution)"
            )
    if args.json:
        Path(args.json).write_text(
            json.dumps({str(k): v for k, v in results.items()}, indent=2, default=str)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
