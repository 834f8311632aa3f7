"""``ModelInfer`` answers bytes built from a remembered prefix (``encode_infer_response_bytes``):
they parse to the message ``encode_infer_response`` builds, and tritonclient reads them."""

from __future__ import annotations

import numpy as np
import pytest

from tierserve.server.grpc.aio import encode_infer_response, encode_infer_response_bytes
from tierserve.server.grpc.gen import grpc_predict_v2_pb2 as pb
from tierserve.server.runtime.dataplane import InferResult


def _result(outputs: dict, request_id: str = "", version: str = "1") -> InferResult:
    return InferResult("m", version, request_id, outputs, dict.fromkeys(outputs, True))


CASES = {
    "one fp32": _result({"OUTPUT0": np.arange(4, dtype=np.float32).reshape(4, 1)}),
    "with id": _result({"OUTPUT0": np.ones((2, 1), np.float32)}, request_id="r-ü" * 50),
    "big-endian": _result({"OUTPUT0": np.arange(6, dtype=">f4").reshape(2, 3)}),
    "strided": _result({"OUTPUT0": np.arange(12, dtype=np.float64).reshape(3, 4)[:, ::2]}),
    "empty": _result({"OUTPUT0": np.zeros((0, 1), np.float32)}),
    "two outputs": _result({"A": np.array([True, False]), "B": np.arange(3, dtype=np.int64)}),
    "large": _result({"OUTPUT0": np.ones((70000, 1), np.float32)}, request_id="x"),
    "other version": _result(
        {"OUTPUT0": np.arange(4, dtype=np.float32).reshape(4, 1)}, version="2"
    ),  # fmt: skip
}


@pytest.mark.parametrize("name", list(CASES))
def test_bytes_parse_to_the_message(name):
    result = CASES[name]
    for _ in range(2):  # built, then from the remembered prefix
        got = pb.ModelInferResponse.FromString(encode_infer_response_bytes(result))
        assert got == encode_infer_response(result), name


def test_tritonclient_reads_the_answer(tmp_path):
    import tritonclient.grpc as tg
    from doubler_model import doubler_loader, write_doubler_repository

    from tierserve.server.app import BackgroundServer
    from tierserve.server.settings import Settings

    settings = Settings.build(
        model_repository=write_doubler_repository(tmp_path), http_port=0, grpc_port=0,
        poll_interval_s=0,
    )  # fmt: skip
    with BackgroundServer(settings, loader=doubler_loader) as server:
        client = tg.InferenceServerClient(server.grpc_url)
        des = tg.InferInput("DES", [2, 3], "FP32")
        des.set_data_from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
        cat = tg.InferInput("CATCOLUMN", [2, 2], "INT64")
        cat.set_data_from_numpy(np.array([[1, 2], [3, 4]], np.int64))
        for request_id in ("", "req-1"):
            answer = client.infer("m", [des, cat], request_id=request_id)
            assert answer.as_numpy("OUTPUT0").tolist() == [[9.0], [31.0]]
            response = answer.get_response()
            assert (response.model_name, response.model_version, response.id) == (
                "m", "1", request_id,
            )  # fmt: skip
        with pytest.raises(tg.InferenceServerException, match="unknown model"):
            client.infer("nope", [des, cat])
