"""The HTTP and gRPC status each error answers with (server/errors.py)."""

import pytest

from tierserve.core import errors
from tierserve.server.errors import STATUS, grpc_status, http_status, status_of
from tierserve.server.runtime.admission import ServerBusyError


def _all_error_classes() -> list[type]:
    found, stack = [], [errors.TierserveError]
    while stack:
        cls = stack.pop()
        found.append(cls)
        stack.extend(cls.__subclasses__())
    return found


def test_statuses():
    assert status_of(errors.InvalidInputError("x")) == (400, "INVALID_ARGUMENT")
    assert status_of(errors.NotFoundError("x")) == (404, "NOT_FOUND")
    assert status_of(errors.RequestCancelledError("x")) == (499, "CANCELLED")
    assert status_of(errors.MissingExtraError("GPU", "gpu", "cupy")) == (501, "UNIMPLEMENTED")


def test_a_subclass_takes_its_nearest_listed_class():
    assert status_of(errors.ConfigError("x")) == (400, "INVALID_ARGUMENT")
    assert status_of(errors.IncompleteModelError("x")) == (400, "INVALID_ARGUMENT")
    assert status_of(errors.BackendSkippedError("x")) == (503, "UNAVAILABLE")
    assert status_of(errors.StorageFullError("x")) == (507, "RESOURCE_EXHAUSTED")
    assert status_of(errors.PayloadTooLargeError("x")) == (413, "RESOURCE_EXHAUSTED")
    assert status_of(ServerBusyError("x")) == (503, "RESOURCE_EXHAUSTED")


def test_anything_else_is_internal():
    assert status_of(ValueError("x")) == (500, "INTERNAL")
    assert http_status(errors.TierserveError("x")) == 500
    assert grpc_status(KeyError("x")) == "INTERNAL"


def test_every_error_class_has_a_status_and_every_grpc_name_exists():
    grpc = pytest.importorskip("grpc")
    for cls in _all_error_classes():
        assert any(c in STATUS for c in cls.__mro__), cls
    for code, name in STATUS.values():
        assert 400 <= code < 600 and name in grpc.StatusCode.__members__, name
