import copy
import json

import pytest

from tierserve.core.errors import CorruptModelFileError
from tierserve.model.graph_json import Graph, load_graph_json, save_graph_json

WDL = {
    "solver": {"batchsize": 1024, "model_name": "wdl"},
    "optimizer": {"type": "Adam", "update_type": "Global"},
    "layers": [
        {
            "name": "data",
            "type": "Data",
            "label": {"top": "label", "label_dim": 1},
            "dense": {"top": "dense", "dense_dim": 13},
            "sparse": [
                {
                    "top": "wide_data",
                    "type": "DistributedSlot",
                    "max_feature_num_per_sample": 30,
                    "slot_num": 1,
                },
                {
                    "top": "deep_data",
                    "type": "DistributedSlot",
                    "max_feature_num_per_sample": 30,
                    "slot_num": 26,
                },
            ],
        },
        {
            "name": "sparse_embedding2",
            "type": "DistributedSlotSparseEmbeddingHash",
            "bottom": "wide_data",
            "top": "sparse_embedding2",
            "sparse_embedding_hparam": {"embedding_vec_size": 1, "combiner": "sum"},
        },
        {
            "name": "sparse_embedding1",
            "type": "DistributedSlotSparseEmbeddingHash",
            "bottom": "deep_data",
            "top": "sparse_embedding1",
            "sparse_embedding_hparam": {"embedding_vec_size": 16, "combiner": "sum"},
        },
        {
            "name": "reshape1",
            "type": "Reshape",
            "bottom": "sparse_embedding1",
            "top": "reshape1",
            "leading_dim": 416,
        },
        {"name": "concat1", "type": "Concat", "bottom": ["reshape1", "dense"], "top": "concat1"},
        {
            "name": "fc1",
            "type": "InnerProduct",
            "bottom": "concat1",
            "top": "fc1",
            "fc_param": {"num_output": 1},
        },
        {
            "name": "loss",
            "type": "BinaryCrossEntropyLoss",
            "bottom": ["fc1", "label"],
            "top": "loss",
        },
    ],
}


def test_round_trip(tmp_path):
    path = save_graph_json(tmp_path / "wdl.json", WDL)
    graph = load_graph_json(path)
    assert isinstance(graph, Graph)
    assert graph.to_dict() == WDL
    assert [layer["name"] for layer in graph.layers_of_type("InnerProduct")] == ["fc1"]
    assert json.loads(path.read_text()) == WDL


def _broken(mutate):
    data = copy.deepcopy(WDL)
    mutate(data)
    return data


@pytest.mark.parametrize(
    "mutate, message",
    [
        (
            lambda d: d["layers"][5].update(bottom="concat9"),
            "layer 'fc1' \\(InnerProduct\\) has bottom 'concat9'",
        ),
        (lambda d: d["layers"][4].update(bottom=["reshape1", "fc1"]), "layer 'concat1'.*'fc1'"),
        (lambda d: d["layers"].pop(0), "first layer must be of type 'Data'"),
        (lambda d: d["layers"][3].pop("top"), "layer 'reshape1' \\(Reshape\\) has no 'top'"),
        (lambda d: d["layers"][3].pop("type"), "layer 'reshape1' has no 'type'"),
        (lambda d: d["layers"][5].update(name="concat1"), "'concat1' is used twice"),
        (lambda d: d.pop("layers"), "'layers' list"),
    ],
)
def test_structure_errors_name_the_layer(tmp_path, mutate, message):
    path = tmp_path / "g.json"
    path.write_text(json.dumps(_broken(mutate)))
    with pytest.raises(CorruptModelFileError, match=message):
        load_graph_json(path)


def test_not_json(tmp_path):
    (tmp_path / "g.json").write_text("{")
    with pytest.raises(CorruptModelFileError, match="not valid JSON"):
        load_graph_json(tmp_path / "g.json")
    with pytest.raises(CorruptModelFileError, match="does not exist"):
        load_graph_json(tmp_path / "none.json")


def test_save_refuses_invalid_graph(tmp_path):
    with pytest.raises(CorruptModelFileError):
        save_graph_json(tmp_path / "g.json", _broken(lambda d: d["layers"][5].update(bottom="x")))
    assert not (tmp_path / "g.json").exists()
