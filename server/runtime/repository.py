"""The model repository: which version of which model serves, loading, polling and swapping.

Layout ``DIR/<model>/<version>/`` (a version is a folder named by a positive integer in ASCII
digits holding the graph JSON, the dense file and the sparse folders) plus ``DIR/ps.json`` for
the tiers and each model's settings.  The highest version serves.  :meth:`ModelRepository.poll`
picks up a new version once its files have stopped changing between two polls and swaps it
in.  Other folders in a model folder are skipped (with a log line, once; hidden ones, such as
a version being written, silently).  A model or version folder that resolves outside the
repository (a symlink) is refused.

A model keeps its kind (:attr:`Servable.kind`: ranking model or embedding store) from one
version to the next: a version of another kind is refused with the reason in the index, and
the old one serves on.  Unloading the model and loading it again is the explicit switch.

The repository owns each version's lifecycle: the loader *stages* a version (its tables are
loaded beside the serving ones and change nothing served); the repository then *commits* it
(:meth:`Servable.commit`) and switches the serving handle in one step, or, when loading failed,
nothing changes.  Each version reads its own tables, so every answer is wholly one version's.
Requests in flight finish on the version they started with; once the last of them is done the
replaced version is *discarded* (its tables dropped) and closed, on a thread of its own.

A version that fails to load is logged and remembered as failed with the reason (shown in the
index, also while an older version serves on).  A failure of a backend (an unreachable tier, a held lock) is retried with exponential
backoff on each poll; any other failure waits until the version's files or ``ps.json`` change.

Model names must match the table-tag pattern, so a name never escapes the repository folder.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tierserve.core.errors import (
    BackendUnavailableError,
    InvalidInputError,
    NotFoundError,
    NotReadyError,
    TierserveError,
)
from tierserve.model.version_folder import version_number
from tierserve.ps.config import PSConfig, load_ps_config
from tierserve.ps.retry import EqualJitterBackoff
from tierserve.ps.table_tag import check_name, is_valid_name

from .servables import Servable

log = logging.getLogger("tierserve.server.runtime.repository")

#: A plain function that builds the servable of ``model`` ``version`` from ``version_dir``
#: (None in ``--config`` mode) and the repository's ps config.
LoadFunction = Callable[[str, str, "Path | None", PSConfig], Servable]


class Loader(abc.ABC):
    """What the repository loads servables with: :class:`~.loader.RepositoryLoader`
    (InferenceModels over parameter servers) or, for a plain :data:`LoadFunction`, a
    :class:`FunctionLoader` (:func:`as_loader`)."""

    @abc.abstractmethod
    def __call__(
        self, model: str, version: str, version_dir: Path | None, ps_config: PSConfig
    ) -> Servable:
        """The servable of ``model`` ``version``."""

    def tier_stats(self) -> dict[str, dict[str, Any]]:
        """Per-tier counters for /metrics (none by default)."""
        return {}

    def healthy(self) -> bool:
        """False while something the models need is down (a Kafka consumer stopped)."""
        return True

    def not_ready_reason(self) -> str | None:
        """Why the loader keeps the server from being ready (the body of a 503 on
        ``/v2/health/ready``), or None when it does not (the default)."""
        return None

    def close(self) -> None:  # noqa: B027 - nothing to release by default
        """Release what the loader holds (parameter servers, consumers)."""


class FunctionLoader(Loader):
    """A :class:`Loader` over a plain function (or any callable): no tiers of its own,
    always healthy."""

    def __init__(self, load: LoadFunction) -> None:
        self.load = load

    def __call__(
        self, model: str, version: str, version_dir: Path | None, ps_config: PSConfig
    ) -> Servable:
        return self.load(model, version, version_dir, ps_config)


def as_loader(loader: Loader | LoadFunction | None) -> Loader | None:
    """``loader`` as a :class:`Loader`: another callable is wrapped in a
    :class:`FunctionLoader`; None stays None (a repository that only lists its models)."""
    if loader is None or isinstance(loader, Loader):
        return loader
    return FunctionLoader(loader)


class Handle:
    """A servable plus the count of requests using it; see the module docstring.

    Retired, it takes no new requests; when the last one is released the servable is
    discarded (unless retired at shutdown) and closed.
    """

    def __init__(self, servable: Servable):
        self.servable = servable
        self.extras: dict[str, Any] = {}  # the data plane keeps its batcher here
        self._users = 0
        self._retired = False
        self._discard = True
        self._lock = threading.Lock()

    def acquire(self) -> Handle:
        with self._lock:
            self._users += 1
        return self

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            close = self._retired and self._users == 0
        if close:
            # Releases happen on request threads and the event loop; dropping tables may
            # wait on a tier, so it runs on a thread of its own.
            threading.Thread(target=self._close, name="tierserve-retire", daemon=True).start()

    def retire(self, discard: bool = True) -> None:
        """No new requests; discard (``discard=False``: at shutdown, only close) and close the
        servable once the current requests are done."""
        with self._lock:
            self._retired = True
            self._discard = discard
            close = self._users == 0
        if close:
            self._close()

    def _close(self) -> None:
        name, version = self.servable.name, self.servable.version
        steps = (self.servable.discard, self.servable.close) if self._discard else (
            self.servable.close,
        )
        for step in steps:
            try:
                step()
            except Exception:
                log.exception("%s of %s version %s failed", step.__name__, name, version)


#: Backoff between retries of a version whose backend failed: base, doubling, cap (seconds),
#: with equal jitter (between half and all of it) so that replicas do not retry in step.
RETRY_BASE_S, RETRY_CAP_S = 1.0, 60.0
RETRY_BACKOFF = EqualJitterBackoff(cap=RETRY_CAP_S, base=RETRY_BASE_S)


@dataclass
class _Failure:
    """Why a version failed to load, and when it may be tried again."""

    signature: tuple  # its files and ps.json when it failed
    reason: str
    retryable: bool  # a backend failed (tier unreachable, lock held): retry with backoff
    attempts: int = 1
    retry_at: float = 0.0

    def due(self, signature: tuple, now: float) -> bool:
        """Whether to load the version again: its files changed, or its backoff ran out."""
        return signature != self.signature or (self.retryable and now >= self.retry_at)


@dataclass
class ModelEntry:
    """One model's state in the repository."""

    name: str
    handle: Handle | None = None
    state: str = "UNAVAILABLE"  # READY | LOADING | UNAVAILABLE
    reason: str = ""
    failed: dict[str, _Failure] = field(default_factory=dict)  # by version
    unloaded: bool = False  # unloaded through the API: polling leaves it alone

    @property
    def version(self) -> str:
        return self.handle.servable.version if self.handle else ""


def _signature(path: Path) -> tuple:
    items = []
    for p in sorted(path.rglob("*")):
        try:
            st = p.stat()
        except FileNotFoundError:
            continue
        items.append((str(p.relative_to(path)), st.st_size, st.st_mtime_ns))
    return tuple(items)


def _has_versions(folder: Path) -> bool:
    """Whether ``folder`` looks like a model: it holds a version folder (a positive integer).
    Anything else in the repository (a RocksDB folder, a backup) is not listed as a model."""
    return any(version_number(p.name) is not None and p.is_dir() for p in folder.iterdir())


def _file_signature(path: Path) -> tuple:
    try:
        st = path.stat()
    except OSError:
        return ()
    return (st.st_size, st.st_mtime_ns)


#: Longest reason kept for the index (the log has the whole message).
REASON_CHARS = 500


def _reason(exc: BaseException) -> str:
    """Why ``exc`` refused a version, as one readable line: whitespace runs become one space,
    other unprintable characters are escaped, and it is cut at :data:`REASON_CHARS`."""
    text = str(exc) if isinstance(exc, TierserveError) else f"{type(exc).__name__}: {exc}"
    text = " ".join(text.split())
    if not text.isprintable():
        text = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 3] + "..."


def _article(noun: str) -> str:
    return "an" if noun[:1] in "aeiou" else "a"


class KindChangeError(InvalidInputError):
    """A version would serve as another kind of model than the version serving."""


class ModelRepository:
    """Loads, serves, polls and swaps model versions; see the module docstring."""

    def __init__(
        self,
        loader: Loader | LoadFunction | None,
        root: Path | None = None,
        config_path: Path | None = None,
    ) -> None:
        if (root is None) == (config_path is None):
            raise InvalidInputError("give a model repository folder or a ps.json, not both")
        self.loader = as_loader(loader)
        self.root = Path(root).resolve() if root is not None else None
        self.config_path = Path(config_path) if config_path is not None else None
        self._subscribers: list[Callable[[ModelEntry, Handle | None], None]] = []
        self.entries: dict[str, ModelEntry] = {}
        self._lock = threading.RLock()
        self._load_lock = threading.Lock()  # one load at a time: tiers are shared
        self._seen: dict[tuple[str, str], tuple] = {}
        self._skipped: set[Path] = set()  # folders logged as not being versions
        #: Called with (model, version) once a version is staged, before it is committed
        #: (worker processes wait there until every worker has staged it).
        self.before_commit: Callable[[str, str], None] | None = None

    def subscribe(self, on_swap: Callable[[ModelEntry, Handle | None], None]) -> None:
        """Call ``on_swap(entry, old_handle)`` after a model's serving handle changed (a new
        version serves, or the model was unloaded: ``entry.handle`` is then None)."""
        self._subscribers.append(on_swap)

    def _swapped(self, entry: ModelEntry, old: Handle | None) -> None:
        for fn in self._subscribers:
            try:
                fn(entry, old)
            except Exception:
                log.exception("swap subscriber %r failed for model %s", fn, entry.name)

    # -- discovery ------------------------------------------------------------------------

    def _ps_config_path(self) -> Path:
        return self.config_path if self.root is None else self.root / "ps.json"

    def ps_config(self) -> PSConfig:
        return load_ps_config(self._ps_config_path())

    def model_names(self) -> list[str]:
        """Models on disk (repository mode) or in ps.json (config mode)."""
        if self.root is None:
            return [m.model for m in self.ps_config().models]
        if not self.root.is_dir():
            return []
        return sorted(
            p.name for p in self.root.iterdir()
            if p.is_dir() and is_valid_name(p.name) and _has_versions(p)
        )  # fmt: skip

    def versions(self, name: str) -> list[str]:
        """The model's version folders on disk, oldest first."""
        if self.root is None:
            return ["1"]
        folder = self.root / name
        if not folder.is_dir():
            return []
        nums = []
        for p in folder.iterdir():
            number = version_number(p.name)
            if number is not None:
                if p.is_dir():
                    nums.append(number)
            elif p.is_dir() and not p.name.startswith(".") and p not in self._skipped:
                self._skipped.add(p)
                log.warning(
                    "model %s: folder %r is not a version (versions are positive integers in "
                    "ASCII digits); skipped", name, p.name,
                )  # fmt: skip
        return [str(n) for n in sorted(nums)]

    # -- serving --------------------------------------------------------------------------

    def acquire(self, name: str, version: str = "") -> Handle:
        """The serving handle of ``name`` (acquired: call ``release``)."""
        check_name(name, "model name")
        with self._lock:
            entry = self.entries.get(name)
            if entry is None or (entry.handle is None and entry.state != "LOADING"):
                if entry is not None and entry.reason:
                    raise NotReadyError(f"model {name!r} is not ready: {entry.reason}")
                raise NotFoundError(f"unknown model {name!r}")
            if entry.handle is None:
                raise NotReadyError(f"model {name!r} is loading")
            if version and version != entry.version:
                raise NotFoundError(
                    f"model {name!r} has no version {version!r} loaded "
                    f"(serving version {entry.version})"
                )
            return entry.handle.acquire()

    def index(self) -> list[dict[str, str]]:
        """Every model on disk or loaded: name, version, state, reason."""
        with self._lock:
            names = set(self.entries)
        with contextlib.suppress(TierserveError):
            names.update(self.model_names())
        out = []
        for name in sorted(names):
            entry = self.entries.get(name)
            if entry is None:
                out.append({"name": name, "version": "", "state": "UNAVAILABLE", "reason": ""})
            else:
                out.append(
                    {"name": name, "version": entry.version, "state": entry.state,
                     "reason": entry.reason}
                )  # fmt: skip
        return out

    # -- loading --------------------------------------------------------------------------

    def load_all(self) -> None:
        """Load the latest version of every model (startup); failures are logged, not raised."""
        for name in self.model_names():
            try:
                self.load(name)
            except TierserveError as exc:
                log.error("model %s: not loaded: %s", name, exc)

    def load(self, name: str, version: str | None = None) -> ModelEntry:
        """Load the latest (or given) version of ``name`` and swap it in."""
        check_name(name, "model name")
        versions = self.versions(name)
        if not versions and name not in self.model_names():
            raise NotFoundError(f"model {name!r} is not in the repository")
        if not versions:
            raise NotFoundError(f"model {name!r} has no version folder")
        version = version or versions[-1]
        with self._lock:
            entry = self.entries.setdefault(name, ModelEntry(name))
            entry.unloaded = False
            if entry.handle is None:
                entry.state = "LOADING"
        self._load_version(entry, version, raise_errors=True)
        return entry

    def _version_dir(self, name: str, version: str) -> Path | None:
        return None if self.root is None else self.root / name / version

    def _check_inside(self, name: str, version: str) -> None:
        """Refuse a model or version folder that resolves outside the repository."""
        folder = self._version_dir(name, version)
        if folder is None:
            return
        for path, what in ((folder.parent, "model"), (folder, "version")):
            real = path.resolve()
            if not real.is_relative_to(self.root):
                raise InvalidInputError(
                    f"model {name!r}: {what} folder {path} is a link to {real}, outside the "
                    "model repository; refused (copy the files into the repository)"
                )

    @staticmethod
    def _check_kind(entry: ModelEntry, version: str, servable: Servable) -> None:
        """Refuse a version of another kind than the one serving (see the module docstring)."""
        old = entry.handle.servable if entry.handle is not None else None
        before, after = (old.kind if old is not None else ""), servable.kind
        if before and after and before != after:
            raise KindChangeError(
                f"version {version} would serve as {_article(after)} {after} but version "
                f"{old.version} serves as {_article(before)} {before}; a model keeps its kind between versions (a version whose "
                "graph JSON is missing serves as an embedding store): unload the model and load "
                "it to change its kind"
            )

    def _signature(self, name: str, version: str) -> tuple:
        """What a version's load depends on: its files and ``ps.json``."""
        folder = self._version_dir(name, version)
        return (_signature(folder) if folder is not None else (), _file_signature(
            self._ps_config_path()
        ))  # fmt: skip

    def _load_version(self, entry: ModelEntry, version: str, raise_errors: bool) -> bool:
        signature = self._signature(entry.name, version)
        with self._load_lock:
            started = time.perf_counter()
            try:
                self._check_inside(entry.name, version)
                servable = self.loader(entry.name, version, self._version_dir(entry.name, version),
                                       self.ps_config())  # fmt: skip
                try:
                    self._check_kind(entry, version, servable)
                    if self.before_commit is not None:
                        self.before_commit(entry.name, version)
                    servable.commit()
                except BaseException:
                    Handle(servable).retire()
                    raise
            except Exception as exc:
                self._failed(entry, version, signature, exc)
                if raise_errors:
                    if isinstance(exc, TierserveError):
                        raise
                    raise InvalidInputError(
                        f"model {entry.name!r} version {version} failed to load: {_reason(exc)}"
                    ) from exc
                return False
        new = Handle(servable)
        with self._lock:
            old = entry.handle
            entry.handle, entry.state, entry.reason = new, "READY", ""
            entry.failed.pop(version, None)
        self._swapped(entry, old)
        if old is not None:
            old.retire()
        log.info(
            "model %s version %s is serving (loaded in %.2f s%s)",
            entry.name, version, time.perf_counter() - started,
            f", replacing version {old.servable.version}" if old else "",
        )  # fmt: skip
        return True

    def _failed(self, entry: ModelEntry, version: str, signature: tuple, exc: Exception) -> None:
        reason = _reason(exc)
        retryable = isinstance(exc, (BackendUnavailableError, OSError))
        with self._lock:
            before = entry.failed.get(version)
            attempts = before.attempts + 1 if before and before.signature == signature else 1
            delay = RETRY_BACKOFF.compute(attempts)
            entry.failed[version] = _Failure(
                signature, reason, retryable, attempts, time.monotonic() + delay
            )
            retry = f"; retry {attempts + 1} in {delay:.1f} s" if retryable else ""
            serving = f"; version {entry.version} keeps serving" if entry.handle else ""
            entry.reason = f"version {version}: {reason}{retry}"
            if entry.handle is None:
                entry.state = "UNAVAILABLE"
            else:
                entry.reason += f"; version {entry.version} serves on"
        log.error(
            "model %s version %s failed to load and is refused: %s%s%s",
            entry.name, version, reason, serving, retry,
        )  # fmt: skip

    def unload(self, name: str) -> None:
        """Stop serving ``name``; requests in flight finish first."""
        check_name(name, "model name")
        with self._lock:
            entry = self.entries.get(name)
            if entry is None or entry.handle is None:
                if name not in self.model_names():
                    raise NotFoundError(f"unknown model {name!r}")
                if entry is not None:
                    entry.unloaded = True
                return
            old = entry.handle
            entry.handle, entry.state, entry.reason, entry.unloaded = (
                None,
                "UNAVAILABLE",
                "unloaded",
                True,
            )
        self._swapped(entry, old)
        old.retire()
        log.info("model %s unloaded", name)

    def poll(self) -> None:
        """Load new models and newer versions whose files have settled (repository mode), and
        retry failed versions that are due (see the module docstring)."""
        now = time.monotonic()
        for name in self.model_names():
            with self._lock:
                entry = self.entries.get(name)
            if entry is not None and entry.unloaded:
                continue
            versions = self.versions(name)
            if not versions:
                continue
            latest = versions[-1]
            if entry is not None and entry.handle is not None and int(latest) <= int(entry.version):
                if entry.reason:  # the refused newer version is gone
                    with self._lock:
                        entry.reason = ""
                continue
            signature = self._signature(name, latest)
            key = (name, latest)
            settled = self._seen.get(key) == signature
            self._seen[key] = signature
            if not settled:
                continue  # written right now, perhaps: look again next poll
            failure = entry.failed.get(latest) if entry is not None else None
            if failure is not None and not failure.due(signature, now):
                continue  # refused, unchanged since, and not due for a retry
            with self._lock:
                entry = self.entries.setdefault(name, ModelEntry(name))
            self._load_version(entry, latest, raise_errors=False)

    def close(self) -> None:
        """Retire every version."""
        with self._lock:
            handles = [e.handle for e in self.entries.values() if e.handle is not None]
            for e in self.entries.values():
                e.handle, e.state = None, "UNAVAILABLE"
        for h in handles:
            h.retire(discard=False)  # tables in shared and persistent tiers stay
