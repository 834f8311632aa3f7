"""The team's shared data (``../shared`` beside the repository), found relative to the
repository root so that every checkout and CI finds it the same way."""

from __future__ import annotations

from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]
SHARED = REPOSITORY.parent / "shared"

#: The 8,000-row Criteo sample (see its PROVENANCE.md).
CRITEO_SAMPLE = SHARED / "data" / "criteo" / "criteo_kaggle_head8k.csv"


def require(path: Path) -> Path:
    """``path``, or skip the test with a message naming the path that is missing."""
    if not path.is_file():
        pytest.skip(f"needs the shared data file {path}, which is missing on this machine")
    return path
