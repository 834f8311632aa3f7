"""``tierserve convert --storage-dtype``: a sparse model folder into compact rows."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from tierserve.clients.cli import main
from tierserve.ps.row_codec import RowCodec
from tierserve.ps.sparse_file import read_rows, write_sparse_model


@pytest.mark.parametrize("dtype", ["float16", "int8"])
def test_convert_writes_the_rows_the_server_would_store(tmp_path, dtype, capsys):
    rng = np.random.default_rng(0)
    keys = rng.permutation(1000).astype(np.int64)
    emb = rng.standard_normal((1000, 12)).astype(np.float32)
    src = write_sparse_model(tmp_path / "t0_sparse_0.model", keys, emb)
    os.utime(src / "emb_vector", ns=(10**18, 10**18))  # older than anything written now
    dst = tmp_path / "out" / "t0_sparse_0.model"
    assert main(["convert", "--storage-dtype", dtype, "--quiet", str(src), str(dst)]) == 0
    assert f"({dtype} rows)" in capsys.readouterr().out
    codec = RowCodec(dtype, 12)
    got_keys, words = read_rows(dst, codec)
    np.testing.assert_array_equal(got_keys, keys)
    np.testing.assert_array_equal(np.asarray(words).view(np.uint32), codec.encode(emb).view(np.uint32))
    assert (dst / f"emb_vector.{dtype}").stat().st_size == 1000 * codec.words * 4
    # as old as its source: the update replay starts from when the rows were taken
    assert (dst / f"emb_vector.{dtype}").stat().st_mtime_ns == (src / "emb_vector").stat().st_mtime_ns
    from tierserve.ps.update_replay import _creation_ms

    assert _creation_ms([str(dst)]) == _creation_ms([str(src)]) > 0


def test_convert_refuses_what_the_layout_cannot_hold(tmp_path):
    emb = np.ones((3, 4), np.float32)
    emb[2, 0] = 1e6
    src = write_sparse_model(tmp_path / "s.model", np.arange(3), emb)
    result = subprocess.run(
        [sys.executable, "-m", "tierserve.clients.cli", "convert", "--storage-dtype", "float16",
         str(src), str(tmp_path / "d.model")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode != 0
    assert "magnitude 1e+06, beyond float16" in result.stderr
    assert not (tmp_path / "d.model").exists()


def test_a_sparse_folder_without_storage_dtype_is_refused_clearly(tmp_path):
    src = write_sparse_model(tmp_path / "s.model", np.arange(3), np.ones((3, 4), np.float32))
    with pytest.raises(SystemExit, match="is a sparse model folder; give --storage-dtype"):
        main(["convert", str(src), str(tmp_path / "d")])
