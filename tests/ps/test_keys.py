"""The one key rule (tierserve.ps.keys) and 32-bit models through every tier."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from model32 import DIM, train_model32

from tierserve.core.errors import ConfigError, InvalidInputError
from tierserve.ps.config import ModelConfig, PSConfig
from tierserve.ps.hierarchy import HierarchicalParameterServer
from tierserve.ps.keys import MAX_KEY32, as_keys, narrow_keys
from tierserve.ps.sparse_file import read_sparse_model


def test_64_bit_keys_keep_their_values():
    keys = np.array([5, -1, 2**40], np.int64)
    assert as_keys(keys) is keys  # no copy in the usual case
    np.testing.assert_array_equal(as_keys(np.array([5, -1], np.int32)), [5, -1])
    np.testing.assert_array_equal(as_keys(np.array([2**64 - 1], np.uint64)), [-1])
    np.testing.assert_array_equal(as_keys([[1, 2], [3, 4]]), [1, 2, 3, 4])
    assert as_keys(np.array([], np.float32)).dtype == np.int64
    with pytest.raises(InvalidInputError, match="integers"):
        as_keys(np.array([1.5]))


def test_32_bit_keys_are_unsigned_ints():
    # int32 arrays hold the unsigned bits of a 32-bit key, as a uint32 Norm file does
    np.testing.assert_array_equal(as_keys(np.array([-1, 7], np.int32), 32), [MAX_KEY32, 7])
    np.testing.assert_array_equal(
        as_keys(np.array([MAX_KEY32, 7], np.uint32), 32), [MAX_KEY32, 7])
    np.testing.assert_array_equal(as_keys(np.array([MAX_KEY32, 0], np.int64), 32),
                                  [MAX_KEY32, 0])
    for bad in (2**32, -1):
        with pytest.raises(InvalidInputError, match=f"CATCOLUMN: {bad} is not a 32-bit key"):
            as_keys(np.array([1, bad], np.int64), 32, "CATCOLUMN")
    assert narrow_keys(np.array([MAX_KEY32]), 32).dtype == np.uint32
    with pytest.raises(ValueError, match="key_bits"):
        as_keys(np.array([1], np.int32), 16)


def test_the_cuda_source_has_the_mixer_constants_of_ps_partition():
    from tierserve.ps import partition

    cu = (Path(__file__).resolve().parents[2] / "cuda" / "embedding_cache.cu").read_text()
    code = "\n".join(line for line in cu.splitlines() if not line.lstrip().startswith("//"))
    found = {int(h, 16) for h in re.findall(r"0x([0-9A-Fa-f]{16})ULL", code)}
    assert found == {partition.FMIX_C1, partition.FMIX_C2}


def test_one_mixer_for_partitions_cache_sets_and_the_trainer():
    """The set hash, the trainer's key-seeded init and generated data use ps.partition's
    constants: computed here from the constants, they agree."""
    from tierserve.cache.hashing import set_of
    from tierserve.ps import partition
    from tierserve.trainer.data import planted

    keys = np.array([0, 1, 2**31 + 5, -7], np.int64)
    m = 2**64
    h = [(int(k) % m) * partition.FMIX_C1 % m for k in keys]
    h = [((x ^ (x >> 32)) * partition.FMIX_C2 % m) >> 32 for x in h]
    np.testing.assert_array_equal(set_of(keys, 1000), [(x * 1000) >> 32 for x in h])
    x = np.arange(4, dtype=np.uint64)
    np.testing.assert_array_equal(planted.mix64(x), partition.splitmix64(x))
    np.testing.assert_array_equal(partition.splitmix64(x),
                                  partition.mix64((x + np.uint64(partition.GOLDEN)).view(np.int64)))


@pytest.fixture(scope="module")
def model32(tmp_path_factory):
    return train_model32(tmp_path_factory.mktemp("m32"))


def _tier(kind: str, request, tmp_path):
    if kind == "hash_map":
        return {"type": "hash_map"}, {"type": "disabled"}
    if kind == "parallel_hash_map":
        return {"type": "parallel_hash_map", "num_partitions": 3}, {"type": "disabled"}
    if kind == "redis_cluster":
        cluster = request.getfixturevalue("redis_cluster")
        return ({"type": "redis_cluster", "address": cluster.addresses, "num_partitions": 4},
                {"type": "disabled"})
    return ({"type": "hash_map", "initial_cache_rate": 0.0},
            {"type": "rocks_db", "path": str(tmp_path / "rocks")})


@pytest.mark.parametrize("kind", [
    "hash_map", "parallel_hash_map", "rocks_db",
    pytest.param("redis_cluster", marks=pytest.mark.redis_cluster),
])
def test_a_32_bit_model_is_served_by_every_tier(kind, model32, request, tmp_path):
    table = read_sparse_model(model32.sparse, DIM)
    keys = np.asarray(table.keys)
    assert keys.max() > 2**31  # keys that are negative as int32
    vdb, pdb = _tier(kind, request, tmp_path)
    model = ModelConfig(model=f"m32{kind.replace('_', '')}", sparse_files=[str(model32.sparse)],
                        embedding_vecsize_per_table=[DIM],
                        maxnum_catfeature_query_per_table_per_sample=[4],
                        embedding_table_names=["emb"])
    config = PSConfig(supportlonglong=False, volatile_db=vdb, persistent_db=pdb, models=[model])
    with HierarchicalParameterServer(config) as ps:
        want = np.asarray(table.embeddings)
        name = model.model
        # the same keys as uint32, as int32 (their unsigned bits) and as int64 values
        for given in (keys.astype(np.uint32), keys.astype(np.uint32).view(np.int32), keys):
            np.testing.assert_array_equal(ps.lookup(name, "emb", given), want)
        with pytest.raises(InvalidInputError, match="not a 32-bit key"):
            ps.lookup(name, "emb", np.array([2**32 + 1], np.int64))
        # an update through the 32-bit path lands on the key the int64 path reads
        ps.insert(name, "emb", np.array([-3], np.int32), np.ones((1, DIM), np.float32))
        np.testing.assert_array_equal(ps.lookup(name, "emb", [MAX_KEY32 - 2]), np.ones((1, DIM)))
        if kind == "redis_cluster":
            ps.unload_model(name)


def test_a_sparse_file_with_64_bit_keys_is_refused_by_a_32_bit_server(tmp_path):
    from tierserve.ps.sparse_file import write_sparse_model

    write_sparse_model(tmp_path / "t", np.array([1, 2**33]), np.zeros((2, 2), np.float32))
    model = ModelConfig(model="m", sparse_files=[str(tmp_path / "t")],
                        embedding_vecsize_per_table=[2],
                        maxnum_catfeature_query_per_table_per_sample=[1])
    with pytest.raises(ConfigError, match="8589934592 is not a 32-bit key"):
        HierarchicalParameterServer(PSConfig(supportlonglong=False, volatile_db={"type": "hash_map"},
                                             models=[model]))
