"""Two processes on one RocksDB path: the second gets an error naming the lock and the first."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from tierserve.core.errors import BackendUnavailableError
from tierserve.ps.rocksdb_tier import RocksDBConfig
from tierserve.ps.tier_registry import create_tier

HOLDER = """
import sys
from tierserve.ps.rocksdb_tier import RocksDBConfig
from tierserve.ps.tier_registry import create_tier
import numpy as np
tier = create_tier(RocksDBConfig(path=sys.argv[1]))
tier.create_table("hps_et.m.t", 2)
tier.insert("hps_et.m.t", np.arange(3), np.ones((3, 2), np.float32))
tier.flush()
print("open", flush=True)
sys.stdin.read()  # hold the database until the test closes our stdin
tier.close()
"""


@pytest.fixture
def holder(tmp_path):
    path = tmp_path / "rdb"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "open"
        yield path, proc
    finally:
        proc.stdin.close()
        proc.wait(30)


def test_second_process_is_told_who_holds_the_lock(holder):
    path, proc = holder
    with pytest.raises(BackendUnavailableError) as info:
        create_tier(RocksDBConfig(path=str(path)))
    message = str(info.value)
    assert f"{path}/LOCK" in message
    assert f"pid {proc.pid} (" in message and "-c" in message  # the other process, named
    assert "read_only" in message
    # As the message says: read-only opens beside the writer.
    with create_tier(RocksDBConfig(path=str(path), read_only=True)) as reader:
        _, found = reader.lookup("hps_et.m.t", np.arange(4))
        assert found.tolist() == [True, True, True, False]


def test_same_process_twice_says_so(tmp_path):
    with (
        create_tier(RocksDBConfig(path=str(tmp_path / "rdb"))),
        pytest.raises(BackendUnavailableError, match="this process, which already has it"),
    ):
        create_tier(RocksDBConfig(path=str(tmp_path / "rdb")))


def test_opens_once_the_other_process_is_gone(tmp_path):
    path = tmp_path / "rdb"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout.readline().strip() == "open"
    proc.stdin.close()
    proc.wait(30)
    with create_tier(RocksDBConfig(path=str(path))) as tier:
        assert tier.size("hps_et.m.t") == 3
