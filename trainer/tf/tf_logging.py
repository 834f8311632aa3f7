"""``tf.logging`` / ``tf.compat.v1.logging``: TensorFlow's logging functions over Python's
``logging`` (logger ``"tensorflow"``, which ``tf.get_logger()`` returns).  Setting the
verbosity also sets tierserve's trainer loggers (``tierserve.trainer``), so
``tf.logging.set_verbosity(tf.logging.INFO)`` shows the training progress the way
TensorFlow's does."""

from __future__ import annotations

import logging as _logging
from typing import Any

DEBUG, INFO, WARN, ERROR, FATAL = (_logging.DEBUG, _logging.INFO, _logging.WARNING,
                                   _logging.ERROR, _logging.CRITICAL)
WARNING = WARN

_logger = _logging.getLogger("tensorflow")


def get_logger() -> _logging.Logger:
    """The ``"tensorflow"`` logger (``tf.get_logger()``)."""
    return _logger


def set_verbosity(level: int) -> None:
    """The threshold for the ``"tensorflow"`` and ``tierserve.trainer`` loggers; a handler
    to stderr is added once when the root logger has none."""
    for name in ("tensorflow", "tierserve.trainer"):
        _logging.getLogger(name).setLevel(level)
    if not _logging.getLogger().handlers and not _logger.handlers:
        handler = _logging.StreamHandler()
        handler.setFormatter(_logging.Formatter("%(levelname)s:%(name)s:%(message)s"))
        for name in ("tensorflow", "tierserve.trainer"):
            _logging.getLogger(name).addHandler(handler)


def get_verbosity() -> int:
    return _logger.getEffectiveLevel()


def debug(msg: Any, *args: Any, **kwargs: Any) -> None:
    _logger.debug(msg, *args, **kwargs)


def info(msg: Any, *args: Any, **kwargs: Any) -> None:
    _logger.info(msg, *args, **kwargs)


def warning(msg: Any, *args: Any, **kwargs: Any) -> None:
    _logger.warning(msg, *args, **kwargs)


warn = warning


def error(msg: Any, *args: Any, **kwargs: Any) -> None:
    _logger.error(msg, *args, **kwargs)


def fatal(msg: Any, *args: Any, **kwargs: Any) -> None:
    _logger.critical(msg, *args, **kwargs)


def log(level: int, msg: Any, *args: Any, **kwargs: Any) -> None:
    _logger.log(level, msg, *args, **kwargs)


__all__ = ["DEBUG", "ERROR", "FATAL", "INFO", "WARN", "WARNING", "debug", "error", "fatal",
           "get_logger", "get_verbosity", "info", "log", "set_verbosity", "warn", "warning"]
