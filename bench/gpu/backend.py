"""The array module a GPU-check stage runs on: cupy on a CUDA device, or numpy for a dry run."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Backend:
    """``xp`` with what a timing loop needs from it."""

    xp: Any
    gpu: bool
    device: str

    def sync(self) -> None:
        """Wait until the device is idle (nothing on numpy)."""
        if self.gpu:
            self.xp.cuda.Device().synchronize()

    def to_device(self, array):
        return self.xp.asarray(array)

    def to_host(self, array) -> np.ndarray:
        return array if isinstance(array, np.ndarray) else array.get()


def backend(dry_run: bool) -> Backend:
    """cupy on device 0, or numpy when ``dry_run``; without a device and no dry run, exit 3
    with a message (a GPU check on a machine with no GPU measures nothing)."""
    if dry_run:
        import platform

        return Backend(np, False, f"CPU dry run ({platform.processor() or platform.machine()})")
    from tierserve.cache.device import cupy_or_none

    cp = cupy_or_none()
    if cp is None:
        sys.exit("no CUDA device visible to cupy: run with --cpu-dry-run to check the stages on the CPU")
    name = cp.cuda.runtime.getDeviceProperties(0)["name"]
    return Backend(cp, True, name.decode() if isinstance(name, bytes) else str(name))


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
