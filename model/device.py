"""Choosing the array module (``xp``) the trainer computes with: cupy on a GPU, else numpy.

Every layer, optimizer and loss is written against ``xp``; :func:`select_xp` decides once per
model which one it is, from the solver's ``vvgpu``.
"""

from __future__ import annotations

import os
import sys
import warnings
from types import ModuleType
from typing import Any

import numpy as np


def _cupy_with_device(device_id: int) -> ModuleType | None:
    if os.environ.get("TIERSERVE_FORCE_CPU"):
        return None
    try:
        import cupy
    except ImportError:
        return None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no driver or no device: cupy imports but cannot run
        return None
    if device_id >= count:
        return None
    cupy.cuda.Device(device_id).use()
    return cupy


def flatten_vvgpu(vvgpu: Any) -> list[int]:
    """``[[0, 1], [2]]`` or ``[0, 1]`` -> ``[0, 1, 2]``."""
    if vvgpu is None:
        return [0]
    out: list[int] = []
    for item in vvgpu:
        if isinstance(item, (list, tuple)):
            out.extend(int(i) for i in item)
        else:
            out.append(int(item))
    return out or [0]


def select_xp(vvgpu: Any = None, warn: bool = True) -> ModuleType:
    """cupy on the first GPU of ``vvgpu`` when cupy imports and that device is visible, else numpy.

    Falling back to numpy says so in one line on stderr, once a process (set
    ``TIERSERVE_FORCE_CPU=1`` to choose the CPU quietly).
    Only one device is used: the rest of ``vvgpu`` is accepted and ignored.
    """
    devices = flatten_vvgpu(vvgpu)
    cupy = _cupy_with_device(devices[0])
    if cupy is not None:
        if len(devices) > 1 and warn:
            warnings.warn(
                f"vvgpu lists {len(devices)} GPUs; tierserve's trainer uses one "
                f"(GPU {devices[0]})",
                stacklevel=2,
            )
        return cupy
    if warn and not os.environ.get("TIERSERVE_FORCE_CPU") and not _told_cpu:
        _told_cpu.append(True)  # once a process: a note, not a warning with a source line
        print(
            f"[tierserve] training on the CPU with numpy: no usable GPU for vvgpu={vvgpu!r} "
            "(cupy missing or no CUDA device visible; TIERSERVE_FORCE_CPU=1 says it quietly)",
            file=sys.stderr,
            flush=True,
        )
    return np


_told_cpu: list[bool] = []


def is_gpu(xp: ModuleType) -> bool:
    """Whether ``xp`` is cupy."""
    return xp is not np


def to_numpy(array: Any) -> np.ndarray:
    """A host numpy copy (or the array itself when it already is numpy)."""
    if isinstance(array, np.ndarray):
        return array
    get = getattr(array, "get", None)
    return get() if get is not None else np.asarray(array)


def to_xp(xp: ModuleType, array: Any, dtype: Any = None) -> Any:
    """``array`` on ``xp``'s device (no copy when it is there already with that dtype)."""
    if xp is np:
        return np.asarray(to_numpy(array), dtype=dtype)
    return xp.asarray(array, dtype=dtype)
