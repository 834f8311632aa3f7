"""The older HugeCTR inference JSON as a model config: CreateParameterServer and
CreateEmbeddingCache read it as well as ps.json."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tierserve.core.errors import ConfigError
from tierserve.ps.hierarchy import CreateParameterServer
from tierserve.ps.inference_json import (
    input_key_bits,
    load_model_source,
    model_config_from_inference_json,
)
from tierserve.ps.sparse_file import write_sparse_model

LAYERS = [
    {"name": "data", "type": "Data", "label": {"top": "label", "label_dim": 1},
     "dense": {"top": "dense", "dense_dim": 13},
     "sparse": [{"top": "data1", "type": "DistributedSlot", "max_feature_num_per_sample": 30,
                 "slot_num": 26}]},
    {"name": "sparse_embedding1", "type": "DistributedSlotSparseEmbeddingHash",
     "bottom": "data1", "top": "sparse_embedding1",
     "sparse_embedding_hparam": {"embedding_vec_size": 4, "combiner": 0}},
]


def _write(tmp_path, clause, layers=LAYERS):
    path = tmp_path / "dcn_infer.json"
    path.write_text(json.dumps({"inference": clause, "layers": layers}))
    return path


def test_the_inference_clause_and_layers_make_the_model_config(tmp_path):
    write_sparse_model(tmp_path / "dcn0_sparse_100.model", np.array([1, 2**31 + 1]),
                       np.ones((2, 4), np.float32))
    path = _write(tmp_path, {"max_batchsize": 64, "hit_rate_threshold": 0.8,
                             "dense_model_file": "dcn_dense_100.model",
                             "sparse_model_file": "dcn0_sparse_100.model",
                             "input_key_type": "I32"})
    config = model_config_from_inference_json(path, "dcn")
    assert config.model == "dcn" and config.max_batch_size == 64
    assert config.sparse_files == [str(tmp_path / "dcn0_sparse_100.model")]
    assert config.embedding_vecsize_per_table == [4]
    assert config.maxnum_catfeature_query_per_table_per_sample == [30]
    assert config.embedding_table_names == ["sparse_embedding1"]
    assert input_key_bits(path) == 32
    assert load_model_source(path, "dcn")[0] is None
    with CreateParameterServer([str(path)], ["dcn"], False) as ps:
        got = ps.lookup("dcn", "sparse_embedding1", np.array([-(2**31) + 1], np.int32))
        np.testing.assert_array_equal(got, np.ones((1, 4)))  # key 2**31 + 1


def test_missing_parts_are_named(tmp_path):
    with pytest.raises(ConfigError, match="dense_model_file and sparse_model_file"):
        model_config_from_inference_json(_write(tmp_path, {"max_batchsize": 1}))
    bad = [LAYERS[0], {**LAYERS[1], "sparse_embedding_hparam": {}}]
    with pytest.raises(ConfigError, match="embedding_vec_size"):
        model_config_from_inference_json(_write(tmp_path, {"dense_model_file": "d",
                                                           "sparse_model_file": "s"}, bad))
    (tmp_path / "x.json").write_text("[1]")
    with pytest.raises(ConfigError, match="JSON object"):
        model_config_from_inference_json(tmp_path / "x.json")
