"""The serving forward (InferenceGraph) of a saved model with BatchNorm and Dropout equals the
trainer's inference forward, and rejects inputs of the wrong shape with clear errors."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import tierserve.trainer as hugectr
from tierserve.core.errors import CorruptModelFileError, InvalidInputError
from tierserve.model.inference_graph import InferenceGraph

from .script_runner import embeddings_for
from .test_model_api import _quiet, data, first_eval_batch, make_model, small_net  # noqa: F401


@pytest.fixture(scope="module")
def saved(data, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("saved")
    dropout = hugectr.DenseLayer(layer_type=hugectr.Layer_t.Dropout, bottom_names=["relu1"],
                                 top_names=["drop1"], dropout_rate=0.3)
    model = small_net(make_model(data), extra=[dropout])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        model.compile()
    for _ in range(10):
        model.train()
    model.save_params_to_files(str(out / "m"), 10)
    model.graph_to_json(str(out / "m.json"))
    return model, out


def test_serving_forward_equals_training_inference(saved):
    model, out = saved
    graph = InferenceGraph(out / "m.json", out / "m_dense_10.model")
    batch = first_eval_batch(model)
    emb = embeddings_for(model, batch)
    want = model.predict_batch(batch)
    got = graph.predict(batch.dense, emb)
    assert got.shape == (batch.batch_size, 2)
    assert np.abs(got - want).max() <= 1e-5
    # a list in graph order works too, and BatchNorm uses the running statistics
    got = graph.predict(batch.dense, [emb["emb_wide"], emb["emb_deep"]])
    assert np.abs(got - want).max() <= 1e-5
    assert not np.array_equal(graph.states[4][1], np.ones(8, np.float32))


def test_bad_inputs_are_named(saved):
    model, out = saved
    graph = InferenceGraph(out / "m.json", out / "m_dense_10.model")
    batch = first_eval_batch(model)
    emb = embeddings_for(model, batch)
    with pytest.raises(InvalidInputError, match=r"table 'emb_deep' have shape \(256, 3, 5\)"):
        graph.predict(batch.dense, {**emb, "emb_deep": np.zeros((256, 3, 5), np.float32)})
    with pytest.raises(InvalidInputError, match="no embeddings given for table 'emb_wide'"):
        graph.predict(batch.dense, {"emb_deep": emb["emb_deep"]})
    with pytest.raises(InvalidInputError, match=r"expected \[batch, 3\]"):
        graph.predict(np.zeros((256, 4), np.float32), emb)
    with pytest.raises(InvalidInputError, match="hold 10 samples, the embeddings 256"):
        graph.predict(np.zeros((10, 3), np.float32), emb)
    short = out / "short.model"
    short.write_bytes(b"\0" * 12)
    with pytest.raises(CorruptModelFileError, match="short.model holds 3 float32 values; the "
                                                    "graph needs 170"):
        InferenceGraph(out / "m.json", short)
