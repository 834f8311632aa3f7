"""The serving commands end to end: demo, serve (subprocess), predict and evaluate."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from tierserve.clients.cli import main
from tierserve.clients.demo_model import train_demo_model, write_repository
from tierserve.model.graph_json import load_graph_json
from tierserve.server.app import BackgroundServer, free_port
from tierserve.server.settings import Settings
from tierserve.trainer.hugectr.inference_data import epoch_batches


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return train_demo_model(tmp_path_factory.mktemp("cli") / "train", iterations=30,
                            batch_size=256)  # fmt: skip


def test_help_texts_explain_the_commands(capsys):
    for command in ("serve", "predict", "evaluate", "demo"):
        with pytest.raises(SystemExit) as exit_:
            main([command, "--help"])
        assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "--model-repository" in out and "Examples:" in out and "--format" in out


def test_predict_and_evaluate(demo, tmp_path, capsys):
    repo = tmp_path / "repo"
    write_repository(demo, repo)
    out = tmp_path / "preds.txt"
    assert main(["predict", "--model", str(repo / "dlrm"), "--data", demo.eval_source,
                 "--output", str(out), "--batch-size", "500", "--no-progress"]) == 0  # fmt: skip
    preds = np.loadtxt(out)
    graph = load_graph_json(demo.graph)
    batches = list(epoch_batches(graph, demo.eval_source, "Norm", "Sum", None, 500))
    # Keys never seen in training: the server answers with the default vector, the trainer's
    # in-memory table does not, so only rows with known keys are compared.
    trainer = np.concatenate([demo.model.predict_batch(b) for b in batches]).reshape(-1)
    assert preds.shape == trainer.shape
    seen = np.concatenate([np.isin(b.sparse[0].keys.reshape(b.batch_size, -1),
                                   _trained_keys(demo)).all(1) for b in batches])  # fmt: skip
    np.testing.assert_allclose(preds[seen], trainer[seen], atol=1e-5)
    assert main(["evaluate", "--model", str(repo / "dlrm" / "1"), "--data", demo.eval_source,
                 "--no-progress"]) == 0  # fmt: skip
    assert "AUC 0." in capsys.readouterr().out
    assert main(["evaluate", "--model", str(tmp_path), "--data", demo.eval_source]) == 2
    criteo = ["evaluate", "--model", str(repo / "dlrm"), "--data", "x.tsv", "--format", "criteo"]
    assert main(criteo) == 2
    assert "--hash-buckets" in capsys.readouterr().err


def _trained_keys(demo):
    from tierserve.ps.sparse_file import read_sparse_model

    return np.asarray(read_sparse_model(demo.sparse_files[0], 16).keys)


def test_serve_subprocess_with_config(demo, tmp_path):
    repo = tmp_path / "repo"
    write_repository(demo, repo)
    port = free_port()
    env = {**os.environ, "TIERSERVE_ADMIN_TOKEN": "t0k"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tierserve.clients.cli", "serve", "--config",
         str(repo / "ps.json"), "--http-port", str(port), "--no-grpc", "--log-level", "warning"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/v2/health/ready").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
            time.sleep(0.2)  # the readiness poll's pace
        assert httpx.get(f"{url}/v2/models/dlrm").json()["versions"] == ["1"]
        r = httpx.post(f"{url}/v2/repository/models/dlrm/unload")
        assert r.status_code == 401
        r = httpx.post(f"{url}/v2/repository/models/dlrm/unload",
                       headers={"Authorization": "Bearer t0k"})  # fmt: skip
        assert r.status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_demo_prints_one_prediction_made_over_http(tmp_path):
    """On the embedded default install (no httpx: it is a dev dependency), with RocksDB kept
    outside the model repository, where every folder is a model."""
    # port 0: the server picks free ports when it starts (a port found free here could be
    # taken by another process during the training, and so could the gRPC port beside it)
    args = ["demo", "--workdir", str(tmp_path), "--iterations", "20", "--port", "0",
            "--grpc-port", "0", "--exit-after-check"]  # fmt: skip
    program = (
        "import sys; sys.modules['httpx'] = None\n"
        "from tierserve.clients.cli import main\n"
        f"sys.exit(main({args!r}))"
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                            timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "click probability:" in result.stdout
    served = re.search(r"serving on http://127\.0\.0\.1:(\d+) \(HTTP\) and 127\.0\.0\.1:(\d+)",
                       result.stdout)  # fmt: skip
    assert served and "0" not in served.groups(), result.stdout
    assert f"127.0.0.1:{served[1]}/v2/models/dlrm/infer" in result.stdout
    assert sorted(p.name for p in (tmp_path / "repository").iterdir()) == ["dlrm", "ps.json"]
    assert (tmp_path / "repository.rocksdb").is_dir()
    assert "ERROR" not in result.stderr


def test_the_readme_predict_example_runs_as_written(demo, tmp_path):
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    match = re.search(r"curl -s -X POST localhost:8000/predict -d '(.+)'", readme)
    assert match, "the README has no /predict curl example"
    write_repository(demo, tmp_path / "repo")
    settings = Settings.build(model_repository=tmp_path / "repo", http_port=0, grpc_port=None)
    with BackgroundServer(settings) as server:
        r = httpx.post(f"http://{server.http_url}/predict", content=match.group(1))
    assert r.status_code == 200, r.text
    [[score]] = r.json()["outputs"]["OUTPUT0"]
    assert 0.0 < score < 1.0


def _serve(repo: Path, port: int, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tierserve.clients.cli", "serve", "--model-repository", str(repo),
         "--http-port", str(port), "--no-grpc", "--workers", "1", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def test_startup_refuses_what_cannot_become_ready_and_retries_what_can(demo, tmp_path):
    """The README's rule.  A repository without ps.json cannot become ready without a change:
    refused at startup, one line, exit 2.  A RocksDB another server holds can: the server
    starts, answers not ready with the reason in the repository index, and serves once the
    other lets go."""
    from polling import until

    bare = tmp_path / "bare"
    write_repository(demo, bare)
    (bare / "ps.json").unlink()
    proc = _serve(bare, free_port())
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2, out
    assert out.strip().splitlines() == [
        f"tierserve serve: error: {bare / 'ps.json'}: no such file; a model repository needs "
        "a ps.json beside its model folders (the tiers and each model's entry; see "
        "docs/serving.md)"
    ]

    repo = tmp_path / "repo"
    write_repository(demo, repo)  # a hash map in front of a writable RocksDB
    holder = BackgroundServer(Settings.build(model_repository=repo, http_port=0, grpc_port=None))
    holder.start()
    port = free_port()
    proc = _serve(repo, port, "--poll-interval", "0.5")
    url = f"http://127.0.0.1:{port}"
    try:
        def up() -> bool:
            try:
                return httpx.get(f"{url}/v2/health/live", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        assert until(up, timeout=120), proc.poll()
        assert httpx.get(f"{url}/v2/health/ready").status_code == 503
        [entry] = httpx.post(f"{url}/v2/repository/index").json()
        assert entry["name"] == "dlrm" and entry["state"] == "UNAVAILABLE", entry
        assert "LOCK" in entry["reason"] and "retry" in entry["reason"], entry
        holder.stop()  # the other server lets go of the RocksDB
        assert until(lambda: httpx.get(f"{url}/v2/health/ready").status_code == 200,
                     timeout=120), httpx.post(f"{url}/v2/repository/index").json()  # fmt: skip
    finally:
        holder.stop()
        proc.terminate()
        out, _ = proc.communicate(timeout=60)
    # one log format, tierserve's lines and (on --http-transport python) uvicorn's alike
    lines = [line for line in out.splitlines() if line.strip()]
    assert any("tierserve" in line for line in lines)
    fmt = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR) [\w.]+: ")
    assert all(fmt.match(line) for line in lines), [line for line in lines if not fmt.match(line)]
