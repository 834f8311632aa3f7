"""``tierserve publish`` through a real broker into a parameter server's tier."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from polling import until

from tierserve.clients.cli import main
from tierserve.ps import HierarchicalParameterServer
from tierserve.ps.config import parse_ps_config
from tierserve.ps.kafka_apply import UpdateConsumer
from tierserve.ps.kafka_source import KafkaUpdateSourceConfig
from tierserve.ps.sparse_file import write_sparse_model

pytestmark = pytest.mark.kafka


def test_publish_a_sparse_folder_into_a_served_table(tmp_path, kafka_broker, capsys):
    model = f"m{uuid.uuid4().hex[:10]}"
    keys = np.arange(2500, dtype=np.int64)
    loaded = np.zeros((keys.size, 8), np.float32)
    write_sparse_model(tmp_path / "v1", keys, loaded)
    retrained = np.random.default_rng(0).random((keys.size, 8), dtype=np.float32)
    write_sparse_model(tmp_path / "v2", keys, retrained)
    ps = HierarchicalParameterServer(parse_ps_config({
        "volatile_db": {"type": "hash_map", "update_filters": [model]},
        "models": [{"model": model, "sparse_files": [str(tmp_path / "v1")],
                    "embedding_vecsize_per_table": [8],
                    "maxnum_catfeature_query_per_table_per_sample": [1],
                    "embedding_table_names": ["t"]}],
    }))  # fmt: skip
    config = KafkaUpdateSourceConfig(brokers=kafka_broker.bootstrap, poll_timeout_ms=100,
                                     metadata_refresh_interval_ms=500)  # fmt: skip
    with ps, UpdateConsumer(ps, config, "volatile", replica=uuid.uuid4().hex) as consumer:
        code = main(["publish", str(tmp_path / "v2"), "--model", model, "--table", "t",
                     "--brokers", kafka_broker.bootstrap, "--max-batch-size", "1000", "--quiet"])
        assert code == 0
        assert f"published 2500 keys of {model}/t in 3 messages" in capsys.readouterr().out
        assert until(lambda: consumer.stats.keys >= keys.size)
        assert consumer.stats.keys == keys.size and consumer.stats.messages == 3
        np.testing.assert_array_equal(ps.lookup(model, "t", keys), retrained)


def test_publish_names_a_bad_table_name(tmp_path, capsys):
    write_sparse_model(tmp_path / "s", np.arange(3), np.zeros((3, 2), np.float32))
    code = main(["publish", str(tmp_path / "s"), "--model", "m", "--table", "bad name",
                 "--brokers", "127.0.0.1:1", "--quiet"])  # fmt: skip
    assert code == 2
    assert "table name 'bad name'" in capsys.readouterr().err


def test_progress_counts_what_the_broker_acknowledged(tmp_path, kafka_broker, capsys):
    """The bar's last line counts messages delivered (not queued): 3 of 3."""
    write_sparse_model(tmp_path / "s", np.arange(2500, dtype=np.int64),
                       np.zeros((2500, 4), np.float32))  # fmt: skip
    code = main(["publish", str(tmp_path / "s"), "--model", f"m{uuid.uuid4().hex[:8]}",
                 "--table", "t", "--brokers", kafka_broker.bootstrap])  # fmt: skip
    assert code == 0
    err = capsys.readouterr().err  # not a terminal: plain lines
    assert "\r" not in err
    assert "delivered: 3/3 messages" in err.strip().splitlines()[-1], err


def test_a_publish_no_broker_acknowledges_fails_naming_the_brokers(tmp_path, capsys):
    """Nothing listens at the brokers' address: exit 1 with what was delivered and where it
    went, never a bar at 100% or an empty list of failures."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{s.getsockname()[1]}"
    write_sparse_model(tmp_path / "s", np.arange(2500, dtype=np.int64),
                       np.zeros((2500, 4), np.float32))  # fmt: skip
    code = main(["publish", str(tmp_path / "s"), "--model", "m", "--table", "t",
                 "--brokers", closed, "--timeout", "3"])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 1
    assert "0 of 3 messages delivered" in captured.err and closed in captured.err, captured.err
    assert "failures: []" not in captured.err and "3/3" not in captured.err
    assert "published" not in captured.out
