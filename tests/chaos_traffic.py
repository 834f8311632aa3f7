"""Clients for the chaos tests (tests/integration/test_chaos.py), and the process that runs the
chaos run's 32 of them.

:class:`Clients` sends one inference request of a kind.  Run as a script, this module is the
traffic of a chaos run: 32 client threads (12 ``http``, 8 ``grpc``, 8 ``predict``, 4
``json``) that send requests until SIGTERM, then write what they saw to a pickle.  They run
in a process of their own, apart from the server under test: in the server's process their
threads shared its GIL and its malloc arenas, and a client thread stalled inside the kernel
while holding the GIL (creating a thread for gevent's resolver pool, behind a thread blocked
in ``mprotect`` for 10 s on a loaded VM) froze the server for as long, which a deployment,
whose clients are other processes, never sees.

    python tests/chaos_traffic.py HTTP_URL GRPC_URL MODEL INPUTS.npz RESULT.pkl

``INPUTS.npz`` holds ``des`` and ``cat`` (the request pool); ``RESULT.pkl`` gets
``{"answers": [(version, rows, output), ...], "failures": [str, ...]}``.  The script prints
``ready`` once its clients run.
"""

from __future__ import annotations

import pickle
import signal
import sys
import threading
import time
from types import SimpleNamespace

import httpx
import numpy as np
import tritonclient.grpc as tg
import tritonclient.http as th

#: The clients of a chaos run, by kind.
KINDS = ["http"] * 12 + ["grpc"] * 8 + ["predict"] * 8 + ["json"] * 4


class Refused(Exception):
    """A plain HTTP request answered with another status than 200."""


class Clients:
    """One client of each protocol to a server; :meth:`infer` sends one request of a kind:
    ``http`` (tritonclient, binary tensors), ``grpc`` (tritonclient), ``json`` (KServe v2
    JSON) or ``predict`` (``/predict``)."""

    def __init__(self, server, timeout: float) -> None:
        url = server.http_url
        self.http = th.InferenceServerClient(url, connection_timeout=timeout,
                                             network_timeout=timeout)  # fmt: skip
        self.grpc = tg.InferenceServerClient(server.grpc_url)
        self.plain = httpx.Client(base_url=f"http://{url}", timeout=timeout)
        self.timeout = timeout

    def infer(self, kind: str, name: str, des, cat) -> tuple[str, np.ndarray]:
        """``(model_version, OUTPUT0)`` of one request; raises what the client raises, or
        :class:`Refused` for a plain request answered with an error."""
        if kind in ("http", "grpc"):
            lib = th if kind == "http" else tg
            a = lib.InferInput("DES", list(des.shape), "FP32")
            b = lib.InferInput("CATCOLUMN", list(cat.shape), "INT64")
            if kind == "http":
                a.set_data_from_numpy(des, binary_data=True)
                b.set_data_from_numpy(cat, binary_data=True)
                r = self.http.infer(name, [a, b])
                return r.get_response()["model_version"], r.as_numpy("OUTPUT0")
            a.set_data_from_numpy(des)
            b.set_data_from_numpy(cat)
            r = self.grpc.infer(name, [a, b], client_timeout=self.timeout)
            return r.get_response().model_version, r.as_numpy("OUTPUT0")
        if kind == "predict":
            body = {"model": name, "inputs": {"DES": des.tolist(), "CATCOLUMN": cat.tolist()}}
            data = self._post("/predict", body)
            return data["version"], np.asarray(data["outputs"]["OUTPUT0"])
        body = {"inputs": [
            {"name": "DES", "datatype": "FP32", "shape": list(des.shape),
             "data": des.reshape(-1).tolist()},
            {"name": "CATCOLUMN", "datatype": "INT64", "shape": list(cat.shape),
             "data": cat.reshape(-1).tolist()},
        ]}  # fmt: skip
        data = self._post(f"/v2/models/{name}/infer", body)
        return data["model_version"], np.asarray(data["outputs"][0]["data"])

    def _post(self, path: str, body: dict) -> dict:
        r = self.plain.post(path, json=body)
        if r.status_code != 200:
            raise Refused(f"{r.status_code}: {r.text}")
        return r.json()

    def close(self) -> None:
        self.plain.close()


def run(http_url: str, grpc_url: str, name: str, inputs: str, result: str) -> None:
    """The chaos run's traffic until SIGTERM (see the module docstring)."""
    with np.load(inputs) as pool:
        des, cat = pool["des"], pool["cat"]
    server = SimpleNamespace(http_url=http_url, grpc_url=grpc_url)
    answers: list[tuple[str, np.ndarray, np.ndarray]] = []
    failures: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def client(kind: str, seed: int) -> None:
        rng = np.random.default_rng(seed)
        clients = Clients(server, timeout=30)
        while not stop.is_set():
            rows = rng.choice(len(des), size=int(rng.integers(1, 9)), replace=False)
            try:
                version, out = clients.infer(kind, name, des[rows], cat[rows])
                with lock:
                    answers.append((version, rows, np.asarray(out, np.float32).reshape(-1, 1)))
            except Exception as exc:  # noqa: BLE001 - every failure is the test's finding
                with lock:
                    failures.append(f"{kind}: {type(exc).__name__}: {str(exc)[:200]}")
            time.sleep(0.05)  # 32 clients at up to ~20 requests/s each, on 2 shared cores
        clients.close()

    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threads = [threading.Thread(target=client, args=(k, i), daemon=True)
               for i, k in enumerate(KINDS)]  # fmt: skip
    for t in threads:
        t.start()
    print("ready", flush=True)
    stop.wait()
    for t in threads:
        t.join(timeout=60)
    with lock, open(result, "wb") as f:
        pickle.dump({"answers": answers, "failures": failures}, f)


if __name__ == "__main__":
    run(*sys.argv[1:6])
