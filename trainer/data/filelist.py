"""HugeCTR file lists: the first line is the number of data files, then one path per line.

As HugeCTR's ``FileList``, the reader takes the first line's count of paths and ignores lines
after them: HugeCTR's own data generator (v3.9 and later) lists every Norm file twice.  Extra
lines that are not such a repeat draw a warning.

Relative paths are resolved against the list's own folder first (lists written by tierserve
are relocatable) and, when nothing exists there, against the current directory (HugeCTR's
tools write paths relative to where they ran).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from pathlib import Path

from .errors import DataFileError


def read_file_list(path: str | os.PathLike) -> list[str]:
    """The data files a file list names, in order, as resolved paths."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise DataFileError(str(path), "file list does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DataFileError(str(path), f"cannot read file list: {exc}") from None
    lines = [ln.strip() for ln in lines if ln.strip()]
    if not lines:
        raise DataFileError(str(path), "file list is empty (first line: number of files)")
    try:
        count = int(lines[0])
    except ValueError:
        raise DataFileError(
            str(path), f"first line must be the number of files, got {lines[0]!r}"
        ) from None
    entries, extra = lines[1 : 1 + max(count, 0)], lines[1 + max(count, 0) :]
    if count != len(entries) or count < 1:
        raise DataFileError(
            str(path), f"first line says {count} files but {len(entries)} paths follow"
        )
    if extra and set(extra) != set(entries):
        warnings.warn(
            f"{path}: the first line says {count} files; the {len(extra)} lines after them are "
            "ignored, as HugeCTR ignores them",
            UserWarning,
            stacklevel=2,
        )
    return [_resolve(path.parent, entry) for entry in entries]


def _resolve(base: Path, entry: str) -> str:
    if os.path.isabs(entry):
        return entry
    beside = base / entry
    if beside.exists() or not Path(entry).exists():
        return str(beside)
    return str(Path(entry))


def write_file_list(path: str | os.PathLike, files: Sequence[str | os.PathLike]) -> Path:
    """Write a file list naming ``files`` (relative to the list's folder where possible)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    base = path.parent.resolve()
    lines = [str(len(files))]
    for f in files:
        f = Path(f).resolve()
        try:
            lines.append(str(f.relative_to(base)))
        except ValueError:
            lines.append(str(f))
    path.write_text("\n".join(lines) + "\n")
    return path
