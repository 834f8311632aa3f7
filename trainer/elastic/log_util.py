"""DLRover's ``dlrover.trainer.util.log_util.default_logger``: the logger ``dlrover.trainer``
at INFO, in DLRover's format, on stderr (DLRover also writes ``./log<pid>``; here the log goes
where the process's stderr goes)."""

from __future__ import annotations

import logging
import sys

FORMAT = "[%(asctime)s] [%(levelname)s][%(filename)s:%(lineno)d:%(funcName)s] %(message)s"


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record comes (as Python's last-resort
    handler), so a replaced stderr still gets the log."""

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self):  # noqa: D401
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def _default_logger() -> logging.Logger:
    logger = logging.getLogger("dlrover.trainer")
    logger.setLevel(logging.INFO)
    if not logger.handlers:
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter(FORMAT))
        logger.addHandler(handler)
        logger.propagate = False  # one line per message, as DLRover's logger
    return logger


default_logger = _default_logger()

__all__ = ["FORMAT", "default_logger"]
