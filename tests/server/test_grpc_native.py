"""The native gRPC transport (server/native, server/grpc/native.py) against real gRPC clients:
the same answers and errors as the grpc.aio front end, its own refusals (compression, size,
unknown methods, messages that are not protobuf), many calls at once, a drain on stop."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
from doubler_model import Doubler, doubler_loader, write_doubler_repository
from polling import until

from tierserve.server.app import BackgroundServer
from tierserve.server.grpc.gen import grpc_predict_v2_pb2 as pb
from tierserve.server.grpc.native import NativeGrpcServer, native_available
from tierserve.server.runtime.servables import RankingServable
from tierserve.server.settings import Settings

needs_native = pytest.mark.skipif(
    not native_available(),
    reason="tierserve-native is not built (make setup builds it when cargo is installed)",
)
SERVICE = "/inference.GRPCInferenceService/"


def _settings(root, transport: str, **extra) -> Settings:
    return Settings.build(
        model_repository=write_doubler_repository(root), http_port=0, grpc_port=0,
        grpc_transport=transport, poll_interval_s=0, **extra,
    )  # fmt: skip


def _request(rows: int, seed: int, request_id: str = "") -> pb.ModelInferRequest:
    rng = np.random.default_rng(seed)
    dense = rng.random((rows, 3), dtype=np.float32)
    keys = rng.integers(0, 1000, (rows, 2)).astype(np.int64)
    request = pb.ModelInferRequest(model_name="m", id=request_id)
    request.inputs.add(name="DES", datatype="FP32", shape=[rows, 3])
    request.inputs.add(name="CATCOLUMN", datatype="INT64", shape=[rows, 2])
    request.raw_input_contents.extend([dense.tobytes(), keys.tobytes()])
    return request


def _zeros(rows: int) -> pb.ModelInferRequest:
    request = _request(rows, 0)
    request.raw_input_contents[:] = [bytes(rows * 3 * 4), bytes(rows * 2 * 8)]
    return request


def _expected(request: pb.ModelInferRequest) -> np.ndarray:
    rows = request.inputs[0].shape[0]
    dense = np.frombuffer(request.raw_input_contents[0], np.float32).reshape(rows, 3)
    keys = np.frombuffer(request.raw_input_contents[1], np.int64).reshape(rows, 2)
    return (2 * dense.sum(1) + keys.sum(1)).astype(np.float32)


def _call(channel: grpc.Channel, method: str, response_type=pb.ModelInferResponse):
    return channel.unary_unary(
        SERVICE + method,
        request_serializer=lambda message: message if isinstance(message, bytes)
        else message.SerializeToString(),
        response_deserializer=response_type.FromString,
    )  # fmt: skip


def _output(response: pb.ModelInferResponse) -> np.ndarray:
    return np.frombuffer(response.raw_output_contents[0], np.float32).reshape(-1)


@needs_native
def test_both_transports_answer_the_same(tmp_path):
    requests = [_request(rows, seed, f"r{seed}") for seed, rows in enumerate((1, 7, 16))]
    answers = {}
    for transport in ("native", "python"):
        with BackgroundServer(_settings(tmp_path / transport, transport), doubler_loader) as server:
            grpc_server = server.app.state.grpc_server
            assert isinstance(grpc_server, NativeGrpcServer) == (transport == "native")
            with grpc.insecure_channel(server.grpc_url) as channel:
                infer = _call(channel, "ModelInfer")
                answers[transport] = [infer(r, timeout=30) for r in requests]
                meta = _call(channel, "ModelMetadata", pb.ModelMetadataResponse)(
                    pb.ModelMetadataRequest(name="m"), timeout=30
                )
                assert [i.name for i in meta.inputs][:2] == ["DES", "CATCOLUMN"]
                live = _call(channel, "ServerLive", pb.ServerLiveResponse)
                assert live(pb.ServerLiveRequest(), timeout=30).live
    for request, native, python in zip(requests, answers["native"], answers["python"]):
        assert native == python  # the same message, field for field
        assert native.id == request.id and native.model_name == "m"
        np.testing.assert_allclose(_output(native), _expected(request), rtol=1e-6)


@needs_native
def test_errors_are_the_grpc_aio_front_ends(tmp_path):
    codes = {}
    for transport in ("native", "python"):
        with (
            BackgroundServer(_settings(tmp_path / transport, transport), doubler_loader) as server,
            grpc.insecure_channel(server.grpc_url) as channel,
        ):
            infer = _call(channel, "ModelInfer")
            unknown = _request(1, 0)
            unknown.model_name = "nope"
            bad_shape = _request(2, 0)
            bad_shape.inputs[0].shape[:] = [2, 4]
            found = []
            for request in (unknown, bad_shape):
                with pytest.raises(grpc.RpcError) as error:
                    infer(request, timeout=30)
                found.append((error.value.code(), error.value.details()))
            codes[transport] = found
    assert codes["native"] == codes["python"]
    assert [code for code, _ in codes["native"]] == [
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.INVALID_ARGUMENT,
    ]
    assert "nope" in codes["native"][0][1] and "DES" in codes["native"][1][1]


@needs_native
def test_what_the_transport_itself_refuses(tmp_path):
    settings = _settings(tmp_path, "native", max_request_bytes=4096)
    with (
        BackgroundServer(settings, doubler_loader) as server,
        grpc.insecure_channel(server.grpc_url) as channel,
    ):
        infer = _call(channel, "ModelInfer")
        gzip = {"compression": grpc.Compression.Gzip}
        refusals = []
        for message, method, options in (
            (b"\xff\xff\xff", "ModelInfer", {}),  # not a protobuf message
            (_request(1, 0), "NoSuchMethod", {}),
            (_request(400, 0), "ModelInfer", {}),  # over max_request_bytes
            (_zeros(400), "ModelInfer", gzip),  # small, but not once inflated
        ):
            with pytest.raises(grpc.RpcError) as error:
                _call(channel, method)(message, timeout=30, **options)
            refusals.append((error.value.code(), error.value.details()))
        # and it still answers, compressed messages too
        request = _request(16, 1)
        for options in ({}, gzip, {"compression": grpc.Compression.Deflate}):
            answer = infer(request, timeout=30, **options)
            np.testing.assert_allclose(_output(answer), _expected(request), rtol=1e-6)
    (invalid, why), (unimplemented, which), (exhausted, size), (inflated, how) = refusals
    assert invalid == grpc.StatusCode.INVALID_ARGUMENT and "ModelInferRequest" in why
    assert unimplemented == grpc.StatusCode.UNIMPLEMENTED and "NoSuchMethod" in which
    assert exhausted == grpc.StatusCode.RESOURCE_EXHAUSTED and "4096" in size
    assert inflated == grpc.StatusCode.RESOURCE_EXHAUSTED and "4096" in how


@needs_native
def test_many_calls_at_once_each_get_their_own_answer(tmp_path):
    with BackgroundServer(_settings(tmp_path, "native"), doubler_loader) as server:
        requests = [_request(1 + i % 5, i, f"call-{i}") for i in range(256)]
        with grpc.insecure_channel(server.grpc_url) as channel:
            infer = _call(channel, "ModelInfer")
            with ThreadPoolExecutor(32) as pool:
                answers = list(pool.map(lambda r: infer(r, timeout=60), requests))
        executions = server.plane.model_statistics("m", "")["model_stats"][0]
    for request, answer in zip(requests, answers):
        assert answer.id == request.id
        np.testing.assert_allclose(_output(answer), _expected(request), rtol=1e-6)
    # the batcher merged calls that arrived together
    assert executions["execution_count"] < len(requests), executions


@needs_native
def test_admin_calls_read_the_authorization_metadata(tmp_path):
    settings = _settings(tmp_path, "native", admin_token="s3cret")
    with (
        BackgroundServer(settings, doubler_loader) as server,
        grpc.insecure_channel(server.grpc_url) as channel,
    ):
        load = _call(channel, "RepositoryModelLoad", pb.RepositoryModelLoadResponse)
        with pytest.raises(grpc.RpcError) as error:
            load(pb.RepositoryModelLoadRequest(model_name="m"), timeout=30)
        assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "Bearer" in error.value.details()
        load(
            pb.RepositoryModelLoadRequest(model_name="m"),
            metadata=[("authorization", "Bearer s3cret")],
            timeout=60,
        )


@needs_native
def test_stop_answers_the_calls_in_flight(tmp_path):
    settings = _settings(tmp_path, "native", shutdown_grace_s=10)
    model = _Gate()
    server = BackgroundServer(settings, lambda n, v, d, c: RankingServable(n, v, model)).start()
    request = _request(2, 3, "in-flight")
    answer: dict = {}

    def call():
        with grpc.insecure_channel(server.grpc_url) as channel:
            try:
                answer["ok"] = _call(channel, "ModelInfer")(request, timeout=30)
            except grpc.RpcError as exc:
                answer["error"] = exc.code()

    caller = threading.Thread(target=call)
    caller.start()
    transport = server.app.state.grpc_server.transport
    assert until(lambda: transport.in_flight > 0, timeout=30, interval=0.005)
    # the call runs on until the stop has begun
    threading.Thread(target=lambda: until(lambda: server._server.should_exit, interval=0.005)
                     and model.release.set(), daemon=True).start()  # fmt: skip
    server.stop()
    caller.join(timeout=30)
    assert "ok" in answer, answer
    np.testing.assert_allclose(_output(answer["ok"]), _expected(request), rtol=1e-6)


@pytest.mark.parametrize("setting", ["grpc_transport", "http_transport"])
def test_native_without_the_package_is_refused_by_name(tmp_path, setting):
    root = write_doubler_repository(tmp_path)
    code = (
        "import sys; sys.modules['tierserve_native'] = None\n"  # as if it were not installed
        "from tierserve.core.errors import ConfigError\n"
        "from tierserve.server.app import create_app\n"
        "from tierserve.server.settings import Settings\n"
        f"root = {str(root)!r}\n"
        "try:\n"
        f"    create_app(Settings.build(model_repository=root, {setting}='native'))\n"
        "except ConfigError as exc:\n"
        "    print(exc)\n"
        f"create_app(Settings.build(model_repository=root, {setting}='auto'))\n"
        "print('auto ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    refusal, auto = out.stdout.strip().splitlines()
    assert setting in refusal and "tierserve-native" in refusal
    assert auto == "auto ok"


def _sample(server, name: str, **labels) -> float:
    """One sample of the server's own metrics registry (0 when absent)."""
    value = server.plane.metrics.registry.get_sample_value(name, labels)
    return value or 0.0


@needs_native
def test_calls_are_counted_as_on_grpc_aio(tmp_path):
    counted = {}
    for transport in ("native", "python"):
        settings = _settings(tmp_path / transport, transport)
        with (
            BackgroundServer(settings, doubler_loader) as server,
            grpc.insecure_channel(server.grpc_url) as channel,
        ):
            infer = _call(channel, "ModelInfer")
            for seed in range(3):
                infer(_request(2, seed), timeout=30)
            bad = _request(2, 0)
            bad.inputs[0].shape[:] = [2, 4]
            with pytest.raises(grpc.RpcError):
                infer(bad, timeout=30)
            labels = {"model": "m", "protocol": "grpc"}
            counted[transport] = (
                _sample(server, "tierserve_requests_total", **labels),
                _sample(
                    server, "tierserve_request_errors_total", status="INVALID_ARGUMENT", **labels
                ),
                _sample(server, "tierserve_request_latency_seconds_count", **labels),
            )
    assert counted["native"] == counted["python"] == (4, 1, 4)


def test_the_serve_flag_sets_the_transport():
    from tierserve.clients.cli import build_parser
    from tierserve.clients.serve import settings_from_args

    parser = build_parser()
    chosen = {
        flag: settings_from_args(
            parser.parse_args(["serve", "--model-repository", "r", *flag])
        ).grpc_transport
        for flag in ((), ("--grpc-transport", "python"), ("--grpc-transport", "native"))
    }
    assert chosen == {
        (): "auto",
        ("--grpc-transport", "python"): "python",
        ("--grpc-transport", "native"): "native",
    }
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--model-repository", "r", "--grpc-transport", "fast"])


class _Broken(Doubler):
    def predict_batch(self, batch):
        raise RuntimeError("the model failed")


@pytest.mark.parametrize("transport", ["native", "python"])
def test_a_failing_model_is_an_internal_error_in_the_metrics(tmp_path, transport):
    if transport == "native" and not native_available():
        pytest.skip("tierserve-native is not built")
    settings = _settings(tmp_path, transport)
    loader = lambda n, v, d, c: RankingServable(n, v, _Broken())  # noqa: E731
    with (
        BackgroundServer(settings, loader) as server,
        grpc.insecure_channel(server.grpc_url) as channel,
    ):
        with pytest.raises(grpc.RpcError) as error:
            _call(channel, "ModelInfer")(_request(2, 0), timeout=30)
        assert error.value.code() == grpc.StatusCode.INTERNAL
        assert error.value.details() == "internal error"  # nothing of the exception leaks
        labels = {"model": "m", "protocol": "grpc"}
        assert _sample(server, "tierserve_request_errors_total", status="INTERNAL", **labels) == 1


class _Gate(Doubler):
    """A Doubler whose executions are recorded (rows of each) and wait until the test
    sets ``release``."""

    def __init__(self) -> None:
        self.running = threading.Event()
        self.release = threading.Event()
        self.rows: list[int] = []

    def predict_batch(self, batch):
        self.rows.append(batch.batch_size)
        self.running.set()
        assert self.release.wait(60)
        return super().predict_batch(batch)


@pytest.mark.parametrize("transport", ["native", "python"])
def test_calls_whose_client_gave_up_do_not_run(tmp_path, transport):
    """Calls queued behind a running batch whose deadline passes, or that the client
    cancels, are dropped before they run, and counted CANCELLED, on both transports."""
    if transport == "native" and not native_available():
        pytest.skip("tierserve-native is not built")
    model = _Gate()
    loader = lambda n, v, d, c: RankingServable(n, v, model)  # noqa: E731
    with (
        BackgroundServer(_settings(tmp_path, transport), loader) as server,
        grpc.insecure_channel(server.grpc_url) as channel,
    ):
        infer = _call(channel, "ModelInfer")
        batcher = server.plane.repository.entries["m"].handle.extras["batcher"]
        first = infer.future(_request(16, 1), timeout=30)  # a whole batch: it runs alone
        assert model.running.wait(30)
        late = infer.future(_request(2, 2), timeout=2)  # expires while the first runs
        gone = infer.future(_request(3, 3), timeout=30)
        assert until(lambda: batcher.queued == 2, timeout=30)  # both wait behind the first
        gone.cancel()
        late.exception()  # its deadline passed
        assert until(lambda: batcher.waiting() == 0, timeout=30)  # the server saw both go
        model.release.set()
        np.testing.assert_allclose(_output(first.result()), _expected(_request(16, 1)), rtol=1e-6)
        assert late.exception().code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert gone.cancelled()
        after = _request(4, 4)
        np.testing.assert_allclose(_output(infer(after, timeout=30)), _expected(after), rtol=1e-6)
        assert model.rows == [16, 4]  # neither the late nor the cancelled call ran
        labels = {"model": "m", "protocol": "grpc"}
        assert until(
            lambda: _sample(server, "tierserve_request_errors_total", status="CANCELLED",
                            **labels) == 2, timeout=10,
        )  # fmt: skip


@needs_native
def test_the_transport_answers_a_passed_deadline_itself(tmp_path):
    """A call still unanswered at its grpc-timeout gets DEADLINE_EXCEEDED from the
    transport at that time, not when the model is done; a malformed grpc-timeout is
    refused naming the header."""
    model = _Gate()
    loader = lambda n, v, d, c: RankingServable(n, v, model)  # noqa: E731
    with BackgroundServer(_settings(tmp_path, "native"), loader) as server:
        host, port = server.grpc_url.rsplit(":", 1)
        request = _request(2, 5).SerializeToString()
        framed = b"\x00" + len(request).to_bytes(4, "big") + request
        answers = {}
        for timeout in ("200m", "2x", "99999999H"):
            started = time.monotonic()
            answers[timeout] = (_raw_h2_call(host, int(port), framed, timeout), time.monotonic() - started)
            model.release.set()  # the first run is held until its call was answered
        assert model.rows == [2, 2]  # the malformed one never reached the model
    (status, message), took = answers["200m"]
    # answered while its run was still held, at its deadline, not before
    assert status == "4" and took >= 0.2, (status, message, took)
    (status, message), _ = answers["2x"]
    assert status == "13" and "grpc-timeout" in message, (status, message)
    (status, message), _ = answers["99999999H"]  # the longest there is: answered
    assert status == "0", (status, message)


def _raw_h2_call(host: str, port: int, framed: bytes, timeout: str) -> tuple[str, str]:
    """``(grpc-status, grpc-message)`` of one ModelInfer call sent by ``nghttp`` with the
    ``grpc-timeout`` header as given (grpc clients do not send a malformed one)."""
    import tempfile

    from services.install import ensure_command

    ensure_command("nghttp", "nghttp2-client")
    with tempfile.NamedTemporaryFile(suffix=".bin") as body:
        body.write(framed)
        body.flush()
        done = subprocess.run(
            ["nghttp", "-v", "--no-dep", "-d", body.name,
             "-H", "content-type: application/grpc", "-H", "te: trailers",
             "-H", f"grpc-timeout: {timeout}",
             f"http://{host}:{port}{SERVICE}ModelInfer"],
            capture_output=True, timeout=30,
        )  # fmt: skip
    output = done.stdout.decode("utf-8", "replace")  # with the binary response, if any
    found = dict(re.findall(r"(grpc-status|grpc-message): (.*)", output))
    return found.get("grpc-status", ""), found.get("grpc-message", "")
