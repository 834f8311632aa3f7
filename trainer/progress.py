"""Progress of long work: a tqdm bar on a terminal, plain periodic lines elsewhere.

A bar drawn with ``\\r`` into a pipe or a log file is one ever-growing line; so when the
stream is not a terminal, :func:`progress_bar` prints one plain line every
:data:`PLAIN_INTERVAL_S` seconds instead (from a timer, so a slow step still shows it is
alive), and a last one when the work ends.  ``TIERSERVE_NO_PROGRESS=1`` silences both.
:func:`heartbeat` does the same for work with no count: a line every few seconds while it
runs.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, TextIO

#: Seconds between the plain lines written where no terminal shows a bar.
PLAIN_INTERVAL_S = 5.0


def _silenced() -> bool:
    return os.environ.get("TIERSERVE_NO_PROGRESS") == "1"


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed, or not a real stream
        return False


class PlainProgress:
    """tqdm's ``update``/``set_postfix``/``write``/``close`` as plain lines: ``desc: n/total
    unit (rate/s, elapsed)`` every ``interval`` seconds while it runs, and once at the end."""

    def __init__(self, total: int | None = None, unit: str = "it", desc: str = "",
                 file: TextIO | None = None, interval: float = PLAIN_INTERVAL_S,
                 disable: bool = False) -> None:  # fmt: skip
        self.total, self.unit, self.desc = total, unit, desc or "progress"
        self.file = file if file is not None else sys.stderr
        self.interval = interval
        self.disable = disable
        self.n = 0
        self.postfix = ""
        self._start = time.monotonic()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._closed = False
        self._timer = None
        if not disable:
            self._timer = threading.Thread(target=self._tick, daemon=True, name="progress")
            self._timer.start()

    def _tick(self) -> None:
        while not self._stop.wait(self.interval):
            self._line()

    def _line(self, final: bool = False) -> None:
        with self._lock:
            elapsed = time.monotonic() - self._start
            count = f"{self.n}/{self.total}" if self.total else f"{self.n}"
            rate = self.n / elapsed if elapsed > 0 else 0.0
            tail = f", {self.postfix}" if self.postfix else ""
            state = "done in" if final else "elapsed"
            text = (f"{self.desc}: {count} {self.unit} ({rate:,.1f} {self.unit}/s, "
                    f"{state} {elapsed:.0f} s{tail})")  # fmt: skip
            print(text, file=self.file, flush=True)

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix(self, **kwargs: Any) -> None:
        self.postfix = ", ".join(f"{k}={v}" for k, v in kwargs.items())

    def set_description(self, desc: str) -> None:
        self.desc = desc

    def write(self, text: str) -> None:
        """Print a line (as ``tqdm.write`` does, also when the bar itself is off)."""
        print(text, file=self.file, flush=True)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._timer is not None:
            self._timer.join()
            self._line(final=True)

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def progress_bar(total: int | None = None, unit: str = "it", desc: str = "",
                 file: TextIO | None = None, disable: bool = False, **tqdm_options: Any):
    """A progress bar over ``total`` ``unit`` (None: unknown): tqdm when ``file`` (default
    stderr) is a terminal, else :class:`PlainProgress`; disabled by ``disable`` or
    ``TIERSERVE_NO_PROGRESS=1``."""
    stream = file if file is not None else sys.stderr
    disable = disable or _silenced()
    if not _is_tty(stream):
        return PlainProgress(total, unit, desc, stream, disable=disable)
    from tqdm.auto import tqdm

    return tqdm(total=total, unit=unit, desc=desc or None, file=stream, disable=disable,
                mininterval=tqdm_options.pop("mininterval", 1.0), **tqdm_options)  # fmt: skip


@contextlib.contextmanager
def heartbeat(what: str, file: TextIO | None = None,
              interval: float = PLAIN_INTERVAL_S) -> Iterator[None]:
    """While the block runs, print ``what ... (N s)`` every ``interval`` seconds."""
    stream = file if file is not None else sys.stdout
    stop = threading.Event()
    start = time.monotonic()

    def beat() -> None:
        while not stop.wait(interval):
            print(f"{what} ... ({time.monotonic() - start:.0f} s)", file=stream, flush=True)

    thread = threading.Thread(target=beat, daemon=True, name="heartbeat")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
