"""numpy or cupy: choosing the array module (``xp``) and moving arrays between host and device."""

from __future__ import annotations

import contextlib

import numpy as np

from tierserve.core.errors import ConfigError, require_extra


def cupy_or_none():
    """The cupy module when it imports and sees at least one CUDA device, else ``None``."""
    try:
        import cupy
    except Exception:
        return None
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None
    except Exception:
        return None
    return cupy


def array_module(use_gpu: bool, device_id: int = 0):
    """numpy, or cupy after checking that device ``device_id`` exists.

    Raises :class:`~tierserve.core.errors.MissingExtraError` (extra ``gpu``) without cupy and
    :class:`~tierserve.core.errors.ConfigError` when the device does not exist.
    """
    if not use_gpu:
        return np
    cupy = require_extra("cupy", "gpu", "the GPU embedding cache")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver, no device
        raise ConfigError(f"the GPU embedding cache needs a CUDA device: {exc}") from None
    if not 0 <= device_id < count:
        raise ConfigError(f"CUDA device {device_id} does not exist ({count} device(s) found)")
    return cupy


_NULL = contextlib.nullcontext()


def device_context(xp, device_id: int):
    """A context that makes ``device_id`` current for cupy (a fresh one per use: cupy's
    ``Device`` keeps its enter/exit stack on the object); a no-op for numpy."""
    if xp is np:
        return _NULL
    return xp.cuda.Device(device_id)


def to_host(array) -> np.ndarray:
    """``array`` as a numpy array (copied from the device when it is a cupy array)."""
    if isinstance(array, np.ndarray):
        return array
    get = getattr(array, "get", None)
    return get() if get is not None else np.asarray(array)
