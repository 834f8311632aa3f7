"""The HTTP status and gRPC status code each error answers with: the one mapping every front
end (the exception handler, the fast paths, the gRPC servicers, the Triton model) reads.

The error classes themselves (:mod:`tierserve.core.errors`) know nothing of transports; an
error takes the status of the nearest class in its hierarchy that is listed here, and an error
of no tierserve class is a 500 / ``INTERNAL``.
"""

from __future__ import annotations

from tierserve.core import errors as e

from .runtime.admission import ServerBusyError

#: class -> (HTTP status, name of a ``grpc.StatusCode`` member, kept as a string so the
#: HTTP side needs no grpc import)
STATUS: dict[type[BaseException], tuple[int, str]] = {
    e.TierserveError: (500, "INTERNAL"),
    e.InvalidInputError: (400, "INVALID_ARGUMENT"),
    e.CorruptModelFileError: (400, "INVALID_ARGUMENT"),
    e.NotFoundError: (404, "NOT_FOUND"),
    e.ReadOnlyError: (409, "FAILED_PRECONDITION"),
    e.CapacityExceededError: (507, "RESOURCE_EXHAUSTED"),
    e.PayloadTooLargeError: (413, "RESOURCE_EXHAUSTED"),
    ServerBusyError: (503, "RESOURCE_EXHAUSTED"),
    e.UnauthorizedError: (401, "UNAUTHENTICATED"),
    e.NotReadyError: (503, "UNAVAILABLE"),
    e.RequestCancelledError: (499, "CANCELLED"),  # nginx's "client closed request"
    e.BackendUnavailableError: (503, "UNAVAILABLE"),
    e.StorageFullError: (507, "RESOURCE_EXHAUSTED"),
    e.MissingExtraError: (501, "UNIMPLEMENTED"),
}
_UNKNOWN = (500, "INTERNAL")


def status_of(exc: BaseException) -> tuple[int, str]:
    """(HTTP status, gRPC status name) for ``exc``: its nearest listed class's."""
    for cls in type(exc).__mro__:
        found = STATUS.get(cls)
        if found is not None:
            return found
    return _UNKNOWN


def http_status(exc: BaseException) -> int:
    """The HTTP status a front end answers ``exc`` with."""
    return status_of(exc)[0]


def grpc_status(exc: BaseException) -> str:
    """The name of the ``grpc.StatusCode`` member a gRPC front end answers ``exc`` with."""
    return status_of(exc)[1]
