"""Namespaces of ``tierserve.trainer.tf`` (``tf.losses``, ``tf.train``, ...): a module-like
object over what exists, whose missing names raise :class:`UnsupportedError` naming the
name, why (for names refused on purpose) and the closest supported ones."""

from __future__ import annotations

import difflib
import types
from typing import Any

from tierserve.core.errors import ConfigError


class UnsupportedError(ConfigError, AttributeError):
    """A TensorFlow name tierserve's trainer does not have (an AttributeError too, so
    ``hasattr`` and ``getattr(..., default)`` work as with a missing attribute)."""


class RefusedError(ConfigError):
    """A TensorFlow feature refused on purpose (Keras models, DeepRec's EmbeddingVariable):
    not an AttributeError, so ``from ... import`` shows the reason instead of Python's
    generic "cannot import name"."""


def unsupported(qualified: str, names: Any, why: str | None = None,
                instead: str | None = None) -> ConfigError:
    """The error for ``qualified`` (``tf.matmul``): ``why`` it is refused (a
    :class:`RefusedError`), or the closest of ``names`` (an :class:`UnsupportedError`);
    ``instead`` names what to use."""
    if why is not None:
        return RefusedError(f"{qualified}: {why}" + ("" if instead is None else f"; use {instead}"))
    public = sorted(n for n in names if not n.startswith("_"))
    prefix, _, leaf = qualified.rpartition(".")
    msg = f"{qualified} is not supported by tierserve's trainer"
    if instead is None:
        close = difflib.get_close_matches(leaf, public, n=3, cutoff=0.6)
        if close:
            instead = " or ".join(f"{prefix}.{c}" for c in close)
        elif public:
            return UnsupportedError(f"{msg} ({prefix} has: {', '.join(public)})")
    return UnsupportedError(msg if instead is None else f"{msg}; closest supported: {instead}")


class Namespace(types.ModuleType):
    """``name`` over ``sources`` (modules or dicts, searched in order); ``refused`` maps a
    name to (why, instead) for names refused on purpose; ``hints`` a name to what to use."""

    def __init__(self, name: str, *sources: Any, refused: dict | None = None,
                 hints: dict | None = None, doc: str | None = None) -> None:
        super().__init__(name, doc)
        self._sources = sources
        self._refused = dict(refused or {})
        self._hints = dict(hints or {})

    def _names(self) -> set[str]:
        out: set[str] = set()
        for src in self._sources:
            out.update(src if isinstance(src, dict) else getattr(
                src, "__all__", [n for n in dir(src) if not n.startswith("_")]))
        return out

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        if attr in self._refused:
            why, instead = self._refused[attr]
            raise unsupported(f"{self.__name__}.{attr}", (), why, instead)
        for src in self._sources:
            if isinstance(src, dict):
                if attr in src:
                    return src[attr]
            elif attr in self._names() or hasattr(src, attr) and not attr.startswith("_"):
                try:
                    return getattr(src, attr)
                except AttributeError:
                    continue
        raise unsupported(f"{self.__name__}.{attr}", self._names(),
                          instead=self._hints.get(attr))

    def __dir__(self) -> list[str]:
        return sorted(self._names())

    def __repr__(self) -> str:
        return f"<tierserve namespace {self.__name__}>"
