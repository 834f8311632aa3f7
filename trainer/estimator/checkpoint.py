"""Checkpoints in a model_dir: ``model.ckpt-<step>.npz`` (every variable, the embedding
tables with their optimizer state, the global step and the model's structure) and a
``checkpoint`` index naming the newest and the kept ones, as TensorFlow's.

A checkpoint is written to a temporary file, flushed and renamed, so a crash never leaves
a half-written one; the oldest beyond ``keep_checkpoint_max`` are deleted.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np

from tierserve.core.errors import CorruptModelFileError

INDEX = "checkpoint"
_NAME = re.compile(r"^(?P<base>.+)-(?P<step>\d+)\.npz$")


def _index(model_dir: Path) -> dict:
    path = model_dir / INDEX
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {"all_model_checkpoint_paths": []}
    except (OSError, ValueError) as exc:
        raise CorruptModelFileError(f"{path} cannot be read: {exc}") from None
    return data


def all_checkpoints(model_dir: str | os.PathLike) -> list[Path]:
    """Kept checkpoints, oldest first."""
    model_dir = Path(model_dir)
    names = _index(model_dir).get("all_model_checkpoint_paths", [])
    return [model_dir / n for n in names if (model_dir / n).exists()]


def latest_checkpoint(model_dir: str | os.PathLike | None) -> Path | None:
    """The newest checkpoint of ``model_dir`` (None when it has none)."""
    if model_dir is None or not Path(model_dir).is_dir():
        return None
    found = all_checkpoints(model_dir)
    return found[-1] if found else None


def step_of(path: str | os.PathLike) -> int:
    m = _NAME.match(Path(path).name)
    return int(m.group("step")) if m else -1


def save(model_dir: str | os.PathLike, arrays: dict[str, np.ndarray], step: int,
         keep_max: int = 5, basename: str = "model.ckpt") -> Path:
    """Write ``arrays`` as ``<basename>-<step>.npz``, update the index, apply retention."""
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    target = model_dir / f"{basename}-{int(step)}.npz"
    tmp = model_dir / f".{target.name}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, target)
    names = [n for n in _index(model_dir).get("all_model_checkpoint_paths", [])
             if n != target.name and (model_dir / n).exists()]
    names.append(target.name)
    if keep_max and len(names) > keep_max:
        for old in names[:-keep_max]:
            (model_dir / old).unlink(missing_ok=True)
        names = names[-keep_max:]
    index = {"model_checkpoint_path": target.name, "all_model_checkpoint_paths": names}
    tmp_index = model_dir / f".{INDEX}.{os.getpid()}.tmp"
    tmp_index.write_text(json.dumps(index, indent=1) + "\n")
    os.replace(tmp_index, model_dir / INDEX)
    return target


def load(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every array of a checkpoint file."""
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError) as exc:
        raise CorruptModelFileError(f"checkpoint {path} cannot be read: {exc}") from None
