import json

import numpy as np
import pytest

from tierserve.core.errors import InvalidInputError
from tierserve.server.runtime.tensors import (
    TensorSpec,
    check_inputs,
    decode_rest_request,
    encode_rest_response,
)


def _binary_body(arrays):
    inputs, raw = [], b""
    for name, (datatype, a) in arrays.items():
        data = a.tobytes()
        inputs.append({"name": name, "datatype": datatype, "shape": list(a.shape),
                       "parameters": {"binary_data_size": len(data)}})  # fmt: skip
        raw += data
    header = json.dumps({"inputs": inputs}).encode()
    return header + raw, len(header)


def test_json_and_binary_decode_to_the_same_arrays():
    des = np.arange(6, dtype=np.float32).reshape(2, 3)
    cat = np.array([[1, 2], [3, 4]], dtype=np.int64)
    body, n = _binary_body({"DES": ("FP32", des), "CATCOLUMN": ("INT64", cat)})
    binary = decode_rest_request(body, n)
    js = decode_rest_request(
        json.dumps(
            {
                "inputs": [
                    {"name": "DES", "datatype": "FP32", "shape": [2, 3], "data": des.tolist()},
                    {
                        "name": "CATCOLUMN",
                        "datatype": "INT64",
                        "shape": [2, 2],
                        "data": [1, 2, 3, 4],
                    },
                ]
            }
        ).encode(),  # fmt: skip
        None,
    )
    for d in (binary, js):
        np.testing.assert_array_equal(d.inputs["DES"], des)
        np.testing.assert_array_equal(d.inputs["CATCOLUMN"], cat)
        assert d.inputs["CATCOLUMN"].dtype == np.int64


@pytest.mark.parametrize(
    "body, header, message",
    [
        (b"{", None, "not valid JSON"),
        (b"[]", None, "JSON object"),
        (b'{"inputs": []}', None, "non-empty 'inputs'"),
        (b'{"inputs": [{"name": "A", "datatype": "FP32", "shape": [2], "data": [1]}]}', None,
         "needs 2"),
        (b'{"inputs": [{"name": "A", "datatype": "INT64", "shape": [1], "data": [1.5]}]}', None,
         "not INT64"),
        (b'{"inputs": [{"name": "A", "datatype": "STR", "shape": [1], "data": [1]}]}', None,
         "not supported"),
        (b'{"inputs": [{"name": "A", "datatype": "FP32", "shape": [-1], "data": [1]}]}', None,
         "non-negative"),
        (b'{"inputs": [{"name": "A", "datatype": "FP32", "shape": [1], "parameters": '
         b'{"binary_data_size": 4}}]}', 10_000, "Inference-Header-Content-Length"),
    ],
)  # fmt: skip
def test_bad_bodies_name_the_problem(body, header, message):
    with pytest.raises(InvalidInputError, match=message):
        decode_rest_request(body, header)


def test_truncated_and_extra_binary_data():
    body, n = _binary_body({"A": ("FP32", np.ones(4, np.float32))})
    with pytest.raises(InvalidInputError, match="truncated"):
        decode_rest_request(body[:-3], n)
    with pytest.raises(InvalidInputError, match="no input claims"):
        decode_rest_request(body + b"1234", n)


def test_check_inputs_names_input_and_expected_shape():
    specs = [TensorSpec("DES", "FP32", (-1, 13)), TensorSpec("X", "INT32", (-1,), optional=True)]
    check_inputs(specs, {"DES": np.zeros((2, 13), np.float32)})
    with pytest.raises(
        InvalidInputError, match=r"'DES' has shape \[2, 5\]; expected FP32 with shape \[-1, 13\]"
    ):
        check_inputs(specs, {"DES": np.zeros((2, 5), np.float32)})
    with pytest.raises(InvalidInputError, match="'DES' has datatype FP64"):
        check_inputs(specs, {"DES": np.zeros((2, 13))})
    with pytest.raises(InvalidInputError, match="'DES' is missing"):
        check_inputs(specs, {})
    with pytest.raises(InvalidInputError, match="unexpected input 'Y'"):
        check_inputs(specs, {"DES": np.zeros((2, 13), np.float32), "Y": np.zeros(1)})


def test_response_binary_and_json():
    out = {"OUTPUT0": np.array([[0.25], [0.5]], dtype=np.float32)}
    body, n = encode_rest_response("m", "1", "id7", out, {"OUTPUT0": True})
    header = json.loads(body[:n])
    assert header["outputs"][0]["parameters"]["binary_data_size"] == 8
    np.testing.assert_array_equal(np.frombuffer(body[n:], np.float32), [0.25, 0.5])
    body, n = encode_rest_response("m", "1", "", out, {"OUTPUT0": False})
    assert n is None and json.loads(body)["outputs"][0]["data"] == [0.25, 0.5]


def test_json_codec_reads_and_writes_what_the_stdlib_did():
    """orjson parses; what it refuses and json read (NaN literals, a byte-order mark, UTF-16,
    lone surrogates, numbers beyond FP64) is still read, and answers still encode."""
    from tierserve.server.runtime.tensors import dump_json, parse_json

    assert parse_json(b'{"a": [1, 2.5, -3]}') == {"a": [1, 2.5, -3]}
    assert parse_json(memoryview(b"[1]")) == [1]
    nan = parse_json(b"[NaN, Infinity, 1e400]")
    assert np.isnan(nan[0]) and nan[1] == nan[2] == float("inf")
    assert parse_json("\ufeff[1]".encode()) == [1]
    assert parse_json('{"id": "x"}'.encode("utf-16")) == {"id": "x"}
    assert parse_json(b'"\\ud800"') == "\ud800"
    with pytest.raises(InvalidInputError, match="not valid JSON"):
        parse_json(b"[1,")
    with pytest.raises(InvalidInputError, match="nested too deep"):
        parse_json(b"[" * 100_000)
    # answers: the same values as json writes them, and ids orjson cannot encode
    out = {"OUTPUT0": np.array([0.1, 1e-7, 3e38], np.float32)}
    body, _ = encode_rest_response("m", "1", "\ud800x", out, {})
    decoded = json.loads(body)
    assert decoded["id"] == "\ud800x"
    assert decoded["outputs"][0]["data"] == out["OUTPUT0"].tolist()
    assert json.loads(dump_json({"a": 2**70})) == {"a": 2**70}


def test_integers_beyond_64_bits_are_refused_for_integer_inputs():
    body = json.dumps({"inputs": [{"name": "K", "datatype": "INT64", "shape": [2],
                                   "data": [1, 2**70]}]}).encode()  # fmt: skip
    with pytest.raises(InvalidInputError, match="'K'.*not INT64 integers"):
        decode_rest_request(body, None)
