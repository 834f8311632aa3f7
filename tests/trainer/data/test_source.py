"""hugectr.data.DataSourceParams / DataSource on local paths (fsspec), and the Model methods
that take data_source_params."""

from __future__ import annotations

import numpy as np
import pytest

import tierserve.trainer as hugectr
from tierserve.core.errors import ConfigError


def test_move_to_local_copies_files_and_folders(tmp_path):
    remote = tmp_path / "remote"
    (remote / "train").mkdir(parents=True)
    (remote / "train" / "a.data").write_bytes(b"abc")
    (remote / "file_list.txt").write_text("1\na.data\n")
    (remote / "m0_sparse_10.model").mkdir()
    (remote / "m0_sparse_10.model" / "key").write_bytes(np.arange(3).tobytes())
    local = tmp_path / "local"
    params = hugectr.data.DataSourceParams(
        use_hdfs=False,
        hdfs_train_source=str(remote / "train"), local_train_source=str(local / "train"),
        hdfs_train_filelist=str(remote / "file_list.txt"),
        local_train_filelist=str(local / "file_list.txt"),
        hdfs_sparse_model=[str(remote / "m0_sparse_10.model")],
        local_sparse_model=[str(local / "m0_sparse_10.model")],
    )
    written = hugectr.data.DataSource(params).move_to_local()
    assert len(written) == 3
    assert (local / "train" / "a.data").read_bytes() == b"abc"
    assert (local / "file_list.txt").read_text() == "1\na.data\n"
    assert (local / "m0_sparse_10.model" / "key").read_bytes() == np.arange(3).tobytes()


def test_bad_data_source_settings_are_named(tmp_path):
    params = hugectr.data.DataSourceParams(hdfs_dense_model=str(tmp_path / "missing"),
                                           local_dense_model=str(tmp_path / "x"))
    with pytest.raises(ConfigError, match="does not exist"):
        hugectr.data.DataSource(params).move_to_local()
    params = hugectr.data.DataSourceParams(hdfs_sparse_model=["a", "b"], local_sparse_model=["a"])
    with pytest.raises(ConfigError, match="hdfs_sparse_model has 2 paths"):
        hugectr.data.DataSource(params).move_to_local()
    with pytest.raises(ConfigError, match="move_to_local"):
        hugectr.DataReaderParams(data_reader_type="Norm", source="x",
                                 data_source_params=hugectr.data.DataSourceParams(use_hdfs=True))
    with pytest.raises(ConfigError, match="DataSourceParams"):
        hugectr.DataReaderParams(data_reader_type="Norm", source="x", data_source_params=3)


def test_model_loads_and_saves_with_local_data_source_params(tmp_path):
    from model32 import train_model32

    m = train_model32(tmp_path / "m")
    params = hugectr.data.DataSourceParams(use_hdfs=False)
    solver = hugectr.CreateSolver(batchsize=256, batchsize_eval=256, max_eval_batches=2)
    reader = hugectr.DataReaderParams(data_reader_type="Norm", source=[str(m.train_list)],
                                      eval_source=str(m.eval_list), check_type="Sum")
    model = hugectr.Model(solver, reader, hugectr.CreateOptimizer())
    model.construct_from_json(str(m.graph), True)
    model.compile()
    model.load_dense_weights(str(m.dense), params)
    model.load_sparse_weights([str(m.sparse)], params)
    model.fit(max_iter=2, display=100, eval_interval=100, snapshot=2,
              snapshot_prefix=str(tmp_path / "out" / "again"), data_source_params=params)
    assert (tmp_path / "out" / "again0_sparse_2.model").is_dir()
    with pytest.raises(ConfigError, match="DataSourceParams"):
        model.load_dense_weights(str(m.dense), "hdfs")
