"""Per-request work the server remembers between requests: a binary request's JSON header is
parsed once per distinct header, inputs' names, datatypes and shapes are checked once per
distinct signature, and under concurrent load requests that arrive one per loop step (as
grpc.aio hands them over) still run in merged batches."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tierserve.core.errors import InvalidInputError
from tierserve.server.runtime import batching, tensors
from tierserve.server.runtime.batching import DynamicBatcher
from tierserve.server.runtime.servables import RankingServable
from tierserve.server.runtime.tensors import TensorSpec, check_inputs, decode_rest_request


def _binary(des: np.ndarray, cat: np.ndarray, request_id: str | None = None) -> tuple[bytes, int]:
    header = {
        "inputs": [
            {"name": "DES", "datatype": "FP32", "shape": list(des.shape),
             "parameters": {"binary_data_size": des.nbytes}},
            {"name": "CATCOLUMN", "datatype": "INT64", "shape": list(cat.shape),
             "parameters": {"binary_data_size": cat.nbytes}},
        ],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        "parameters": {"binary_data_output": True},
    }  # fmt: skip
    if request_id is not None:
        header["id"] = request_id
    raw = json.dumps(header).encode()
    return raw + des.tobytes() + cat.tobytes(), len(raw)


def _same(a, b) -> None:
    assert list(a.inputs) == list(b.inputs)
    for name in a.inputs:
        assert a.inputs[name].dtype == b.inputs[name].dtype
        np.testing.assert_array_equal(a.inputs[name], b.inputs[name])
    assert (a.declared, a.outputs, a.id, a.parameters, a.binary_output) == (
        b.declared, b.outputs, b.id, b.parameters, b.binary_output,
    )  # fmt: skip


def test_a_remembered_header_decodes_each_body_as_the_full_decoder(monkeypatch):
    monkeypatch.setattr(tensors, "_plans", {})
    rng = np.random.default_rng(0)
    for request_id in (None, "r7"):
        for _ in range(3):  # the first decodes in full and is remembered, the others reuse it
            des = rng.standard_normal((2, 13)).astype(np.float32)
            cat = rng.integers(0, 1 << 40, (2, 26))
            body, length = _binary(des, cat, request_id)
            got = decode_rest_request(body, length)
            _same(got, tensors._decode_rest_request(body, length))
            np.testing.assert_array_equal(got.inputs["CATCOLUMN"], cat)
            got.declared["DES"] = "INT8"  # what one request does to its copy stays there
            got.parameters.clear()
            got.outputs.clear()
    assert len(tensors._plans) == 2
    # the same header with a body of another size: the full decoder's error
    with pytest.raises(InvalidInputError, match="remain"):
        decode_rest_request(body[:-8], length)
    with pytest.raises(InvalidInputError, match="no input claims"):
        decode_rest_request(body + b"\0" * 8, length)
    # JSON inputs are never remembered: their values are in the header
    json_header = json.dumps({"inputs": [
        {"name": "DES", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]},
    ]}).encode()  # fmt: skip
    assert decode_rest_request(json_header, len(json_header)).inputs["DES"].tolist() == [[1, 2]]
    assert json_header not in tensors._plans


def test_a_signature_that_passed_does_not_let_another_through():
    specs = [TensorSpec("A", "FP32", (-1, 3)), TensorSpec("B", "INT64", (-1, 2))]
    good = {"A": np.zeros((4, 3), np.float32), "B": np.zeros((4, 2), np.int64)}
    for _ in range(2):
        check_inputs(specs, good, {"A": "FP32", "B": "INT64"})
    bad = [
        ({"A": np.zeros((4, 4), np.float32), "B": good["B"]}, {"A": "FP32", "B": "INT64"}),
        (good, {"A": "FP64", "B": "INT64"}),
        ({"A": good["A"]}, {"A": "FP32"}),
        ({**good, "C": good["B"]}, {"A": "FP32", "B": "INT64", "C": "INT64"}),
    ]
    for inputs, declared in bad:
        with pytest.raises(InvalidInputError):
            check_inputs(specs, inputs, declared)
    # the same names and shapes against other specs are checked against those
    other = [TensorSpec("A", "FP32", (-1, 3)), TensorSpec("B", "INT32", (-1, 2))]
    with pytest.raises(InvalidInputError, match="INT32"):
        check_inputs(other, good, {"A": "FP32", "B": "INT64"})


class Doubler:
    dense_dim, label_dim, slot_nums, max_batchsize = 3, 1, [2], 256

    def predict_batch(self, batch):
        keys = batch.sparse[0].keys.reshape(batch.batch_size, -1).sum(1)
        return (2 * batch.dense.sum(1) + keys)[:, None].astype(np.float32)


def test_a_lone_execution_under_load_does_not_stop_batching(monkeypatch):
    """Where requests arrive one per loop step (grpc.aio hands them over so), executions
    alternate between one request and a few; one execution of a single request must not
    make the next requests run unmerged while clients are concurrent.

    "Concurrent" is "an execution merged requests within the last MERGED_WINDOW_S"; the
    window is widened here so that the steps below fit in it on a loaded machine (at 0.1 s,
    two executions in the thread pool and their loop hops overran it and request 4 ran
    alone).  Request 5 joins request 4 by timer order, not by speed: its 5 ms timer is due
    before the leader's 50 ms one whatever the load."""
    monkeypatch.setattr(batching, "MERGED_WINDOW_S", 60.0)
    servable = RankingServable("m", "1", Doubler())
    executions = []
    batcher = DynamicBatcher(servable, ThreadPoolExecutor(1), max_delay_s=0.05,
                             on_batch=lambda rows, n: executions.append(n))  # fmt: skip

    def unit(i):
        return servable.prepare(
            {"DES": np.full((1, 3), i, np.float32), "CATCOLUMN": np.full((1, 2), i, np.int64)}
        )

    async def later(i, seconds):
        await asyncio.sleep(seconds)  # its arrival time is the scenario
        return await batcher.submit(unit(i))

    async def main():
        await asyncio.gather(batcher.submit(unit(1)), batcher.submit(unit(2)))  # merged
        await batcher.submit(unit(3))  # alone
        # the next two arrive 5 ms apart, within the 50 ms a batch may wait under load
        answers = await asyncio.gather(later(4, 0), later(5, 0.005))
        await batcher.close()
        return answers

    answers = asyncio.run(main())
    assert [a["OUTPUT0"].tolist() for a in answers] == [[[32.0]], [[40.0]]]
    assert executions == [2, 1, 2]
