"""HybridBackend's embedding options (``emb_device``, ``emb_dtype``, ``emb_unique``, ...) as
the feature columns apply them: checked (honoured, refused or warned, see
:mod:`tierserve.trainer.hybrid`), resolved per column from the column's own options, the
call's, the enclosing :func:`scope` and the ``HB_EMB_*`` environment variables.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any

import numpy as np

from tierserve.core.compat import warn_once
from tierserve.core.errors import ConfigError

OPTIONS = ("emb_device", "emb_dtype", "emb_unique", "emb_pad", "emb_segment_rank",
           "emb_num_groups", "emb_wire_dtype", "emb_buffer_size", "emb_backend")
_DEFAULTS = {"emb_device": "", "emb_dtype": "float32", "emb_unique": False, "emb_pad": False,
             "emb_segment_rank": 0, "emb_num_groups": 1, "emb_wire_dtype": "float32",
             "emb_buffer_size": 0, "emb_backend": "DEFAULT"}
_ENV = {"emb_num_groups": "HB_EMB_NUM_GROUPS", "emb_wire_dtype": "HB_EMB_WIRE_DTYPE",
        "emb_buffer_size": "HB_EMB_BUFFER_SIZE"}
_EXCHANGE = ("emb_num_groups", "emb_wire_dtype", "emb_buffer_size", "emb_backend")

_local = threading.local()


def _dtype_name(value: Any) -> str:
    name = getattr(value, "name", None)
    if isinstance(name, str):
        return name
    try:
        return np.dtype(getattr(value, "as_numpy_dtype", value)).name
    except TypeError:
        return str(value)


def check_options(options: dict[str, Any], where: str = "") -> dict[str, Any]:
    """``options`` validated: unknown names refused, every option honoured, refused or warned
    about by name (see the module docstring)."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ConfigError(f"{where or 'embedding options'}: unknown option(s) {unknown} "
                          f"(known: {', '.join(OPTIONS)})")
    return dict(options)


def current_options() -> dict[str, Any]:
    """The options of the enclosing ``hb.function`` / ``hb.scope`` blocks, innermost last."""
    out: dict[str, Any] = {}
    for level in getattr(_local, "stack", []):
        out.update(level)
    return out


def _env_value(option: str) -> Any:
    var = _ENV.get(option)
    raw = os.environ.get(var) if var else None
    if raw is None or raw == "":
        return None
    return raw


def resolve(column_name: str, column_options: dict[str, Any], call_options: dict[str, Any]
            ) -> dict[str, Any]:
    """The effective options of one column: column > call > scope > environment > default,
    each checked (refused or warned once by name where not honoured)."""
    scoped = current_options()
    out: dict[str, Any] = {}
    for option in OPTIONS:
        value = None
        for source in (column_options, call_options, scoped):
            if option in source:
                v = source[option]
                if isinstance(v, dict):
                    if column_name not in v:
                        continue
                    v = v[column_name]
                value = v
                break
        env = False
        if value is None:
            value = _env_value(option)
            env = value is not None
        if value is None:
            value = _DEFAULTS[option]
        out[option] = value
        _check(option, value, column_name, env)
    return out


def _check(option: str, value: Any, column: str, from_env: bool) -> None:
    label = _ENV[option] if from_env else option
    if option == "emb_device":
        dev = str(value or "").lower()
        if dev and not (dev.startswith("/cpu") or dev.startswith("/gpu") or dev.startswith(
                "/device:cpu") or dev.startswith("/device:gpu") or dev in ("cpu", "gpu")):
            raise ConfigError(f"emb_device {value!r} (column {column!r}): expected '/cpu:0' or "
                              "'/gpu:N'")
    elif option == "emb_dtype":
        if _dtype_name(value) != "float32":
            raise ConfigError(f"emb_dtype {_dtype_name(value)} (column {column!r}): the "
                              "trainer's embedding tables store float32; use float32")
    elif option == "emb_unique":
        if bool(value):
            warn_once("emb_unique", "the table's lookup deduplicates ids anyway; the hint "
                      "changes nothing here", stacklevel=5)
    elif option == "emb_pad":
        if bool(value):
            raise ConfigError(f"emb_pad=True (column {column!r}) is not supported: lookups "
                              "return pooled [batch, dimension] results")
    elif option == "emb_segment_rank":
        if int(value) != 0:
            raise ConfigError(f"emb_segment_rank={value} (column {column!r}) is not "
                              "supported: ids are pooled per example (rank 0)")
    elif option in _EXCHANGE:
        default = _DEFAULTS[option]
        same = (_dtype_name(value) == default if option == "emb_wire_dtype"
                else str(value).upper() == str(default).upper() if option == "emb_backend"
                else int(value) == int(default))
        if not same:
            warn_once(label, f"{value!r} has no effect: training runs in one process, with no "
                      "embedding exchange between workers", stacklevel=5)


def gpu_requested(options: dict[str, Any]) -> bool:
    dev = str(options.get("emb_device") or "").lower()
    return "gpu" in dev


@contextlib.contextmanager
def scope(**options: Any):
    """Embedding options for every feature-column lookup inside the block."""
    check_options(options, "hb.scope")
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    stack.append(options)
    try:
        yield
    finally:
        stack.pop()
