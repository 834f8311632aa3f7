"""Numbered version folders written whole (the repository's polling never sees half of one)."""

from __future__ import annotations

import pytest

from tierserve.model.version_folder import new_version, next_version


def test_a_version_appears_whole_and_numbers_count_up(tmp_path):
    assert next_version(tmp_path / "absent") == 1
    with new_version(tmp_path / "m") as (version, staging):
        assert version == 1 and not (tmp_path / "m" / "1").exists()
        (staging / "f").write_text("x")
    assert (tmp_path / "m" / "1" / "f").read_text() == "x"
    (tmp_path / "m" / "7").mkdir()
    (tmp_path / "m" / "notes").mkdir()
    assert next_version(tmp_path / "m") == 8


def test_a_failed_write_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError), new_version(tmp_path / "m", 3) as (_, staging):
        (staging / "half").write_text("x")
        raise RuntimeError("disk full")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == []
    (tmp_path / "m" / ".4.tmp").mkdir()  # an interrupted earlier write
    with new_version(tmp_path / "m", 4) as (_, staging):
        assert not any(staging.iterdir())
    assert (tmp_path / "m" / "4").is_dir()
