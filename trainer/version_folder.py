"""A model repository's numbered version folders (``<home>/<n>/``), each written whole.

A version's files go to a hidden folder beside it first, which is renamed into place once
complete, so a server polling the repository never sees half a version.  The trainer's
online export, the Estimator's export and the demo write versions this way.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path


def next_version(home: str | Path) -> int:
    """One more than the highest numbered version in ``home`` (1 when none)."""
    home = Path(home)
    numbers = [int(p.name) for p in home.iterdir() if p.is_dir() and p.name.isdigit()] \
        if home.is_dir() else []  # fmt: skip
    return max(numbers, default=0) + 1


@contextlib.contextmanager
def new_version(home: str | Path, version: int | None = None) -> Iterator[tuple[int, Path]]:
    """Yield ``(version, staging folder)``; the folder becomes ``home/<version>`` when the
    block ends normally and is removed when it raises.  ``version`` defaults to the next."""
    home = Path(home)
    home.mkdir(parents=True, exist_ok=True)
    version = next_version(home) if version is None else int(version)
    staging = home / f".{version}.tmp"
    if staging.exists():  # what an interrupted earlier write left
        shutil.rmtree(staging)
    staging.mkdir()
    try:
        yield version, staging
        staging.rename(home / str(version))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
