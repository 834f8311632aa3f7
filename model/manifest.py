"""A model folder's checksum manifest: which graph and dense files belong together.

The trainer records every file it writes in ``tierserve.manifest`` (JSON) beside it (file name ->
size and SHA-256); a loader verifies the files it is about to use against it.  A dense file
from another training run of the same architecture has the right size and reads without
error, so only its checksum tells it apart.  Sparse model folders are recorded by size only:
hashing tables of many gigabytes at every load would cost more than it guards.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

from tierserve.core.errors import CorruptModelFileError, IncompleteModelError

#: Not a .json name: tools find a version's graph as its only *.json file.
MANIFEST = "tierserve.manifest"
_CHUNK = 1 << 20


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _entry(path: Path) -> dict:
    if path.is_dir():  # a sparse model folder: its files' sizes
        return {"sizes": {p.name: p.stat().st_size for p in sorted(path.iterdir()) if p.is_file()}}
    return {"size": path.stat().st_size, "sha256": _sha256(path)}


def read_manifest(folder: str | os.PathLike) -> dict[str, dict]:
    """The entries of ``folder``'s manifest by file name (empty when it has none)."""
    path = Path(folder) / MANIFEST
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise CorruptModelFileError(f"{path} cannot be read: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
        raise CorruptModelFileError(f"{path} has no 'files' object")
    return data["files"]


def _write(folder: Path, entries: dict[str, dict]) -> None:
    tmp = folder / f".{MANIFEST}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"files": entries}, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, folder / MANIFEST)


def record(paths: Iterable[str | os.PathLike]) -> None:
    """Add (or replace) the entries of ``paths`` in the manifest of each one's folder."""
    by_folder: dict[Path, list[Path]] = {}
    for p in map(Path, paths):
        by_folder.setdefault(p.parent, []).append(p)
    for folder, files in by_folder.items():
        entries = read_manifest(folder)
        entries.update({p.name: _entry(p) for p in files})
        _write(folder, entries)


def copy_entries(sources: Iterable[str | os.PathLike], target: str | os.PathLike) -> None:
    """Carry the entries of files copied into folder ``target`` from their source folders'
    manifests (files that had none get none)."""
    target = Path(target)
    entries = read_manifest(target)
    for src in map(Path, sources):
        entry = read_manifest(src.parent).get(src.name)
        if entry is not None:
            entries[src.name] = entry
    if entries:
        _write(target, entries)


def _size_problems(folder: Path, name: str, entry: dict) -> list[str]:
    """What differs between file (or sparse folder) ``name`` and its entry, by size alone."""
    path = folder / name
    if not path.exists():
        return [f"{name} is missing"]
    if "size" in entry:
        size = path.stat().st_size if path.is_file() else None
        if size != entry["size"]:
            return [f"{name} has {size} bytes, {MANIFEST} says {entry['size']}"]
    sizes = entry.get("sizes")
    if isinstance(sizes, dict):
        if not path.is_dir():
            return [f"{name} is not a folder"]
        problems = []
        for file, want in sorted(sizes.items()):
            inner = path / file
            got = inner.stat().st_size if inner.is_file() else None
            if got is None:
                problems.append(f"{name}/{file} is missing")
            elif got != want:
                problems.append(f"{name}/{file} has {got} bytes, {MANIFEST} says {want}")
        return problems
    return []


def check_complete(folder: str | os.PathLike) -> None:
    """Every file ``folder``'s manifest lists is there with its recorded size (a sparse
    folder: each of its files); no manifest, nothing to check.  Raises
    :class:`IncompleteModelError` naming what is missing or of another size (a copy still
    under way, or a damaged one), without hashing anything."""
    folder = Path(folder)
    problems = [
        problem
        for name, entry in sorted(read_manifest(folder).items())
        for problem in _size_problems(folder, name, entry)
    ]
    if problems:
        more = f" (and {len(problems) - 4} more)" if len(problems) > 4 else ""
        raise IncompleteModelError(
            f"version folder {folder} is incomplete: {'; '.join(problems[:4])}{more}"
        )


def verify(folder: str | os.PathLike, names: Iterable[str]) -> None:
    """Check the files ``names`` of ``folder`` against its manifest; files it does not list
    (models written before manifests) pass.  Raises :class:`CorruptModelFileError`."""
    folder = Path(folder)
    entries = read_manifest(folder)
    for name in names:
        entry = entries.get(name)
        if entry is None:
            continue
        path = folder / name
        if not path.exists():
            raise CorruptModelFileError(f"{path} is listed in {MANIFEST} but missing")
        got = _entry(path)
        for key in ("size", "sizes", "sha256"):
            if key in entry and got.get(key) != entry[key]:
                raise CorruptModelFileError(
                    f"{path} is not the file this model was saved with: its {key} is "
                    f"{_short(got.get(key))}, {MANIFEST} says {_short(entry[key])}"
                )


def _short(value) -> str:
    text = str(value)
    return text if len(text) <= 24 else text[:16] + "..."
