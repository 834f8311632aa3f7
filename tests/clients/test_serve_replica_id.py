"""``tierserve serve --replica-id``: a bad id is refused naming the option, before anything
starts (the good path runs in tests/integration/test_server_replicas.py)."""

from __future__ import annotations

from tierserve.clients.cli import main


def test_a_bad_replica_id_is_refused_naming_the_option(tmp_path, capsys):
    code = main(["serve", "--config", str(tmp_path / "ps.json"), "--replica-id", "a b"])
    assert code == 2
    assert "--replica-id='a b'" in capsys.readouterr().err
