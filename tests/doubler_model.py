"""A one-table ranking model that needs no files, for front-end tests: each row predicts
``2 * sum(dense) + sum(keys)``, so an answer shows which inputs reached the model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tierserve.server.runtime.servables import RankingServable


class Doubler:
    """2 * sum(dense) + sum(keys) per row."""

    dense_dim, label_dim, slot_nums, max_batchsize = 3, 1, [2], 16

    def predict_batch(self, batch):
        keys = batch.sparse[0].keys.reshape(batch.batch_size, -1).sum(1)
        return (2 * batch.dense.sum(1) + keys)[:, None].astype(np.float32)


def doubler_loader(name, version, version_dir, ps_config):
    """A repository loader serving :class:`Doubler` for every version."""
    return RankingServable(name, version, Doubler())


def write_doubler_repository(root: Path) -> Path:
    """A repository at ``root``: model ``m`` version 1 and the ps.json naming its table."""
    (root / "m" / "1").mkdir(parents=True)
    model = {
        "model": "m", "sparse_files": ["t0"], "dense_file": "", "network_file": "",
        "embedding_table_names": ["t0"], "embedding_vecsize_per_table": [4],
        "maxnum_catfeature_query_per_table_per_sample": [2],
    }  # fmt: skip
    (root / "ps.json").write_text(json.dumps({"supportlonglong": True, "models": [model]}))
    return root


def binary_body(des: np.ndarray, cat: np.ndarray) -> tuple[bytes, int]:
    """A KServe v2 binary-tensor infer body of ``DES`` and ``CATCOLUMN`` asking for binary
    outputs, and its JSON header's length."""
    header = json.dumps({
        "inputs": [
            {"name": "DES", "datatype": "FP32", "shape": list(des.shape),
             "parameters": {"binary_data_size": des.nbytes}},
            {"name": "CATCOLUMN", "datatype": "INT64", "shape": list(cat.shape),
             "parameters": {"binary_data_size": cat.nbytes}},
        ],
        "parameters": {"binary_data_output": True},
    }).encode()  # fmt: skip
    return header + des.tobytes() + cat.tobytes(), len(header)
