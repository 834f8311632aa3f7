"""The server's one log format, for tierserve's own loggers and uvicorn's alike.

uvicorn is started without a logging config of its own (``log_config=None`` in
:func:`tierserve.server.http.python.uvicorn_config`), so its records reach the root logger set up
here and read like every other line: ``time LEVEL logger: message``.
"""

from __future__ import annotations

import logging
from typing import Literal, get_args

LogLevel = Literal["debug", "info", "warning", "error"]
LEVELS: tuple[str, ...] = get_args(LogLevel)


def log_format(worker: int | None = None) -> str:
    """The format of every log line; a pool's worker processes add ``[worker N]``."""
    tag = "" if worker is None else f" [worker {worker}]"
    return f"%(asctime)s %(levelname)s %(name)s{tag}: %(message)s"


def configure_logging(level: str = "info", worker: int | None = None) -> None:
    """Send log records at ``level`` and above to stderr in :func:`log_format`."""
    logging.basicConfig(level=level.upper(), format=log_format(worker), force=True)
