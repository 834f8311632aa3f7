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


def version_number(name: str) -> int | None:
    """The version a folder named ``name`` is: a positive integer written in ASCII digits;
    None for any other name (``'²'.isdigit()`` is true and ``int('٣')`` is 3, yet neither
    names a version)."""
    if not (name.isascii() and name.isdigit()):
        return None
    number = int(name)
    return number if number > 0 else None


def version_numbers(home: str | Path) -> list[int]:
    """The versions of the folders in ``home``, lowest first (none when it is not a folder)."""
    home = Path(home)
    if not home.is_dir():
        return []
    numbers = (version_number(p.name) for p in home.iterdir() if p.is_dir())
    return sorted(n for n in numbers if n is not None)


def next_version(home: str | Path) -> int:
    """One more than the highest numbered version in ``home`` (1 when none)."""
    return max(version_numbers(home), default=0) + 1


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
