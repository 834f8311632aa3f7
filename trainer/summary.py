"""TensorBoard summaries without TensorFlow: scalars written with tensorboardX (extra
``tensorboard``), readable by ``tensorboard --logdir``.

Without tensorboardX installed, a writer warns once naming the extra and writes nothing.
"""

from __future__ import annotations

import os
from typing import Any

from tierserve.core.compat import warn_once


class SummaryWriter:
    """Scalars under ``logdir`` (event files TensorBoard reads)."""

    def __init__(self, logdir: str | os.PathLike) -> None:
        self.logdir = os.fspath(logdir)
        self._writer: Any = None
        try:
            from tensorboardX import SummaryWriter as _Writer
        except ImportError:
            warn_once("save_summary_steps", "tensorboardX is not installed (pip install "
                      "'tierserve[tensorboard]'); no TensorBoard summaries are written")
            return
        os.makedirs(self.logdir, exist_ok=True)
        self._writer = _Writer(self.logdir, flush_secs=10)

    @property
    def enabled(self) -> bool:
        return self._writer is not None

    def scalars(self, values: dict[str, float], step: int) -> None:
        if self._writer is None:
            return
        for tag, value in values.items():
            self._writer.add_scalar(tag, float(value), int(step))

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def read_scalars(logdir: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the event files directly under ``logdir``: tag -> [(step, value)]
    (through tensorboard's reader when installed, else tensorboardX's protobufs)."""
    import glob
    import struct

    from tensorboardX.proto import event_pb2

    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(glob.glob(os.path.join(os.fspath(logdir), "events.out.tfevents.*"))):
        with open(path, "rb") as f:
            data = f.read()
        pos = 0
        while pos + 12 <= len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            body = data[pos + 12:pos + 12 + length]
            pos += 12 + length + 4
            event = event_pb2.Event()
            event.ParseFromString(body)
            for v in event.summary.value:
                out.setdefault(v.tag, []).append((int(event.step), float(v.simple_value)))
    return out
