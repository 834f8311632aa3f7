"""HugeCTR file lists: the first line is the number of data files, then one path per line.

As HugeCTR's ``FileList``, the reader takes the first line's count of paths and ignores lines
after them: HugeCTR's own data generator (v3.9 and later) lists every Norm file twice.  Extra
lines that are not such a repeat draw a warning.

A relative path is looked up beside the list first (lists tierserve's converter writes are
relocatable), then in the current directory (HugeCTR, and HugeCTR's tools and tierserve's
data generator, which write the paths as formed from the ``source`` they were given, open them
from the working directory), then in the list's parent folders (so a list written by such a
tool, ``./data/file_list.txt`` naming ``./data/train/gen_0.data``, is found from anywhere).
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
    if beside.exists():
        return str(beside)
    if Path(entry).exists():
        return str(Path(entry))
    for folder in base.resolve().parents:
        if (folder / entry).exists():
            return str(folder / entry)
    return str(beside)


def write_file_list(
    path: str | os.PathLike, files: Sequence[str | os.PathLike], as_given: bool = False
) -> Path:
    """Write a file list naming ``files``: relative to the list's folder where possible, or
    ``as_given`` (HugeCTR's tools list the paths they wrote, which HugeCTR opens from its
    working directory)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    base = path.parent.resolve()
    lines = [str(len(files))]
    if as_given:
        path.write_text("\n".join(lines + [os.fspath(f) for f in files]) + "\n")
        return path
    for f in files:
        f = Path(f).resolve()
        try:
            lines.append(str(f.relative_to(base)))
        except ValueError:
            lines.append(str(f))
    path.write_text("\n".join(lines) + "\n")
    return path
