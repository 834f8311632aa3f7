"""tierserve against Seldon MLServer serving the same DLRM, same load, same run.

    python -m bench.server.mlserver --mlserver-venv /tmp/mlsrv --train-dir /tmp/b

MLServer runs in its own virtual environment (``pip install mlserver==1.7.1 uvloop==0.21``:
its workers crash with uvloop 0.22 and later, its open issue 2286; plus ``pip install -e``
this checkout for the runtime), with a custom runtime that calls the same
``InferenceModel.predict_batch`` as ``bench.server.run``'s peer, adaptive batching
``max_batch_size`` 64 and ``max_batch_time`` 1 ms.  tierserve runs ``tierserve serve
--workers 1`` (``--server-args`` for others, e.g. ``'--workers 2'``).  Both get the
64-client batch-1 load of ``bench.server.run`` (:mod:`bench.server.loadgen`: wrk and h2load by default, ``--loadgen
python`` for asyncio; JSON tensors over HTTP, since MLServer has no binary extension; the same
serialized request over gRPC), alternating turns, and one client at batch 1, 64 and 1024
over HTTP JSON; answers are checked equal first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.server import clients
from bench.server import run as R

RUNTIME = """
import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class TierserveRuntime(MLModel):
    async def load(self) -> bool:
        import sys
        sys.path.insert(0, {root!r})
        from bench.server.run import predictor
        from pathlib import Path
        self.model, self.predict_fn = predictor(Path({version!r}))
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        arrays = {{i.name: NumpyCodec.decode_input(i) for i in payload.inputs}}
        des = np.ascontiguousarray(arrays["DES"], dtype=np.float32)
        cat = np.ascontiguousarray(arrays["CATCOLUMN"], dtype=np.int64)
        out = self.predict_fn(des, cat)
        return InferenceResponse(
            model_name=self.name, outputs=[NumpyCodec.encode_output("OUTPUT0", out)]
        )
"""


def start_mlserver(venv: Path, folder: Path, version: Path, http: int, grpc: int, metrics: int):
    model = folder / "dlrm"
    model.mkdir(parents=True)
    (model / "runtime.py").write_text(RUNTIME.format(root=str(R.ROOT), version=str(version)))
    (model / "model-settings.json").write_text(json.dumps({
        "name": "dlrm", "implementation": "runtime.TierserveRuntime",
        "max_batch_size": 64, "max_batch_time": 0.001,
    }))  # fmt: skip
    (folder / "settings.json").write_text(json.dumps({
        "http_port": http, "grpc_port": grpc, "metrics_port": metrics, "host": "127.0.0.1",
    }))  # fmt: skip
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    log = (folder / "mlserver.log").open("w")
    proc = subprocess.Popen([str(venv / "bin" / "mlserver"), "start", str(folder)], cwd=folder,
                            env=env, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    import httpx

    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if (
                httpx.get(f"http://127.0.0.1:{http}/v2/models/dlrm/ready", timeout=2).status_code
                == 200
            ):
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"MLServer did not start: {(folder / 'mlserver.log').read_text()[-2000:]}")


def json_call(url: str):
    import httpx

    client = httpx.Client(timeout=60)

    def call(des, cat):
        body = {"inputs": [
            {"name": "DES", "datatype": "FP32", "shape": list(des.shape), "data": des.reshape(-1).tolist()},
            {"name": "CATCOLUMN", "datatype": "INT64", "shape": list(cat.shape), "data": cat.reshape(-1).tolist()},
        ]}  # fmt: skip
        r = client.post(f"http://{url}/v2/models/dlrm/infer", content=json.dumps(body))
        r.raise_for_status()
        out = r.json()["outputs"][0]
        return np.asarray(out["data"], np.float32).reshape(out["shape"])

    return call


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mlserver-venv", required=True, type=Path)
    parser.add_argument("--train-dir", required=True, type=Path)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--calls", type=int, default=60, help="one-client calls per batch size")
    parser.add_argument(
        "--server-args", default="--workers 1", metavar="ARGS",
        help="arguments for tierserve serve (default '--workers 1')",
    )  # fmt: skip
    R.add_load_arguments(parser)
    args = parser.parse_args()
    generator = R.use_load_arguments(args)
    from tierserve.server.app import free_port

    out = args.train_dir / "out"
    if not (out / f"dlrm_dense_{args.iterations}.model").exists():
        out = R.train(args.train_dir, args.iterations)
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        version = R.make_repository(out, args.iterations, repo)
        data = R.batches_from(version, args.train_dir / "data")
        _, predict = R.predictor(version)
        t_http, t_grpc = free_port(), free_port()
        m_http, m_grpc = free_port(), free_port()
        ours = R.start_server(
            repo, t_http, t_grpc, batching=True, extra=R._with_workers(args.server_args)
        )
        peer = start_mlserver(args.mlserver_venv, Path(tmp) / "mlserver", version, m_http,
                              m_grpc, free_port())  # fmt: skip
        try:
            calls = {"tierserve": json_call(f"127.0.0.1:{t_http}"),
                     "mlserver": json_call(f"127.0.0.1:{m_http}")}  # fmt: skip
            want = predict(*data[64])
            for name, call in calls.items():
                got = call(*data[64])
                assert np.abs(got - want).max() <= 1e-5, f"{name} != predict"
            latency = {name: {} for name in calls}
            for b in R.BATCHES:
                times = {name: [] for name in calls}
                for _ in range(args.calls):
                    for name, call in calls.items():
                        t0 = time.perf_counter()
                        call(*data[b])
                        times[name].append(time.perf_counter() - t0)
                for name in calls:
                    latency[name][b] = statistics.median(times[name]) * 1e3
            clients.HTTP_JSON = True  # MLServer reads JSON tensors only
            both = R.concurrency_runs(
                {"tierserve": (ours, t_http, t_grpc), "mlserver": (peer, m_http, m_grpc)},
                data, args.seconds,
            )  # fmt: skip
        finally:
            for proc in (ours, peer):
                proc.terminate()
                proc.wait()
    print(f"tierserve serve {args.server_args}, load generator {generator}")
    print("one client, HTTP JSON, p50 ms:")
    for b in R.BATCHES:
        t, m = latency["tierserve"][b], latency["mlserver"][b]
        print(f"  batch {b:>5}: tierserve {t:8.3f}  mlserver {m:8.3f}  ({m / t:.2f}x)")
    for protocol in ("http", "grpc"):
        t, m = both["tierserve"][protocol], both["mlserver"][protocol]
        print(
            f"64 concurrent batch-1 {protocol} clients: tierserve {t['rows_s']:,.0f} rows/s, "
            f"MLServer {m['rows_s']:,.0f} ({t['rows_s'] / m['rows_s']:.2f}x); server CPU ms per "
            f"request {t['server_cpu_ms_per_request']:.3f} / {m['server_cpu_ms_per_request']:.3f}"
            f"; load generator {t['client_cpu_ms_per_request']:.3f} / "
            f"{m['client_cpu_ms_per_request']:.3f}; other jobs' cores "
            f"{max(t['foreign_cores_turns'] + m['foreign_cores_turns']):.2f} at most"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
