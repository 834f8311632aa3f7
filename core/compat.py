"""Warnings for HugeCTR parameters that tierserve accepts but cannot honour on this build.

Each such parameter, when set to anything but its default, warns once per process with a
:class:`HugeCTRCompatibilityWarning` naming the parameter and saying what happens instead.
Parameters that cannot be honoured and would change results are refused with
:class:`~tierserve.core.errors.ConfigError` instead (see docs/hugectr.md).
"""

from __future__ import annotations

import threading
import warnings

_warned: set[str] = set()
_lock = threading.Lock()


class HugeCTRCompatibilityWarning(UserWarning):
    """A HugeCTR parameter was given that has no effect here; the message says why."""


def warn_once(parameter: str, instead: str, stacklevel: int = 3) -> None:
    """Warn (once per process per ``parameter``) that ``parameter`` is not honoured and
    ``instead`` happens."""
    with _lock:
        if parameter in _warned:
            return
        _warned.add(parameter)
    warnings.warn(f"{parameter}: {instead}", HugeCTRCompatibilityWarning, stacklevel=stacklevel)


def reset_warnings() -> None:
    """Forget which parameters have warned (for tests)."""
    with _lock:
        _warned.clear()
