"""The error types shared by every tierserve package.

Every error a caller can see derives from :class:`TierserveError`.  Retryable network faults
(:class:`BackendUnavailableError` and its subclasses) are kept apart from data errors, which
retrying cannot fix.  The HTTP status and gRPC status code a front end answers each error
with are the server's (:mod:`tierserve.server.errors`), not these classes'.
"""

from __future__ import annotations


class TierserveError(Exception):
    """Base of all tierserve errors.

    ``retryable`` tells retry strategies whether trying again can help.
    """

    retryable: bool = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def to_dict(self) -> dict[str, str]:
        """The JSON error body of the KServe v2 protocol."""
        return {"error": self.message}


# --- data errors: the request, file or message is wrong; retrying cannot help -------------


class InvalidInputError(TierserveError):
    """A request, argument or record is malformed or has the wrong shape or type."""



class ConfigError(InvalidInputError):
    """A configuration (``ps.json``, parameter object, CLI option) is invalid."""


class MalformedMessageError(InvalidInputError):
    """A Kafka update message does not follow the wire format (docs/formats.md, Files and messages
    6)."""


class CorruptModelFileError(TierserveError):
    """A model file or folder is missing, truncated or inconsistent."""



class IncompleteModelError(CorruptModelFileError):
    """A model version folder lacks a file its manifest or ``ps.json`` names, or holds one
    shorter or longer than recorded: perhaps still being copied."""


class NotFoundError(TierserveError):
    """A model, version, table or route does not exist."""



class ReadOnlyError(TierserveError):
    """A write was sent to a tier or model that was opened read-only."""



class CapacityExceededError(TierserveError):
    """A configured capacity bound (workspace, cache size, request size) would be exceeded."""



class PayloadTooLargeError(CapacityExceededError):
    """A request body exceeds the configured size limit."""



class UnauthorizedError(TierserveError):
    """A protected endpoint was called without a valid bearer token."""



# --- availability errors ------------------------------------------------------------------


class NotReadyError(TierserveError):
    """The model or server exists but cannot serve yet (loading, unloading)."""

    retryable = True


class RequestCancelledError(TierserveError):
    """The client gave up on a request (its deadline passed, it cancelled or it hung up)
    before the request ran: it was dropped without running."""



class BackendUnavailableError(TierserveError):
    """A storage backend or broker could not be reached; the same call may succeed later."""

    retryable = True


class BackendSkippedError(BackendUnavailableError):
    """A backend is being skipped after repeated failures (its circuit is open): nothing was
    sent to it, and the same call may succeed once its back-off ends."""


class StorageFullError(BackendUnavailableError):
    """A storage backend has no room for a write: a full disk under RocksDB, a Redis node at
    ``maxmemory`` that evicts nothing.  Space can be freed, so it is retryable."""



class MissingExtraError(ImportError, TierserveError):
    """An optional backend was requested but its extra is not installed."""


    def __init__(self, feature: str, extra: str, module: str) -> None:
        TierserveError.__init__(
            self,
            f"{feature} needs the optional package {module!r}; "
            f"install it with: pip install 'tierserve[{extra}]'",
        )
        self.extra = extra


def require_extra(module: str, extra: str, feature: str):
    """Import ``module`` or raise :class:`MissingExtraError` naming the extra to install."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(feature, extra, module) from exc
