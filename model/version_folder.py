"""A model repository as the trainers write it: numbered version folders (``<home>/<n>/``),
each written whole, and the repository's ``ps.json`` entries.

A version's files go to a hidden folder beside it first, which is renamed into place once
complete, so a server polling the repository never sees half a version.  The trainer's
online export, the Estimator's export and the demo write versions this way, and add their
model's entry to ``ps.json`` (:func:`write_ps_entry`), so ``tierserve serve`` serves the
repository as written.
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


#: The tiers of a ``ps.json`` the trainer creates: every table in an in-process hash map.
DEFAULT_TIERS = {"volatile_db": {"type": "hash_map", "initial_cache_rate": 1.0}}


def write_ps_entry(repository: str | Path, entry: dict, *, supportlonglong: bool = True,
                   keep: tuple[str, ...] = ()) -> Path:
    """Add ``entry`` (a ``ps.json`` model entry) to ``repository/ps.json``, replacing the
    entry of the same model; the fields named in ``keep`` keep the values the file has (the
    user's tuning).  A missing ``ps.json`` is created with :data:`DEFAULT_TIERS`.  The file
    is replaced whole (written beside it, then renamed)."""
    import json
    import os

    path = Path(repository) / "ps.json"
    if path.exists():
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            from tierserve.core.errors import ConfigError

            raise ConfigError(f"{path} is not valid JSON ({exc}); fix or remove it") from None
    else:
        data = {"supportlonglong": bool(supportlonglong), **DEFAULT_TIERS, "models": []}
    models = data.get("models") or []
    old = next((m for m in models if m.get("model") == entry["model"]), None)
    if old is not None:
        entry = {**entry, **{k: old[k] for k in keep if k in old}}
    data["models"] = [m for m in models if m.get("model") != entry["model"]] + [entry]
    tmp = path.with_name(f".ps.json.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)
    return path
