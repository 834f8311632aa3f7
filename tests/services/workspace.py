"""One test session's temporary folder for service data and logs, and what to keep of it."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

KEEP_RUNS = 5  # kept log folders in the destination; older ones are removed


class Workspace:
    """A temporary folder: ``data/`` holds service data directories, ``logs/`` their logs.

    ``finish`` removes the folder, first copying the logs out when asked to (a test failed).
    It also collects startup timings for the session summary.
    """

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="tierserve-services-"))
        self.logs = self.root / "logs"
        self.data = self.root / "data"
        self.logs.mkdir()
        self.data.mkdir()
        self.timings: list[tuple[str, float]] = []

    def data_dir(self, name: str) -> Path:
        """A new, empty data directory whose name starts with ``name``."""
        return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.data))

    def log_path(self, name: str) -> Path:
        """A log file path not used before in this session: logs/NAME.log, NAME-2.log, ..."""
        path = self.logs / f"{name}.log"
        number = 1
        while path.exists():
            number += 1
            path = self.logs / f"{name}-{number}.log"
        path.touch()
        return path

    def record(self, what: str, seconds: float) -> None:
        """Note how long something took, for the summary line at the end of the session."""
        self.timings.append((what, seconds))

    def finish(self, keep_logs_under: Path | None) -> Path | None:
        """Remove the workspace; with ``keep_logs_under``, copy the logs there first.

        Returns the folder the logs were copied to, or None.
        """
        kept = None
        if keep_logs_under is not None and any(self.logs.iterdir()):
            kept = keep_logs_under / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
            shutil.copytree(self.logs, kept)
            _remove_old_runs(keep_logs_under)
        shutil.rmtree(self.root, ignore_errors=True)
        return kept


def _remove_old_runs(folder: Path) -> None:
    runs = sorted(path for path in folder.iterdir() if path.is_dir())
    for old in runs[:-KEEP_RUNS]:
        shutil.rmtree(old, ignore_errors=True)
