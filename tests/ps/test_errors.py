import pytest

from tierserve.core import errors


def test_statuses_and_retryable():
    assert (errors.InvalidInputError.http_status, errors.InvalidInputError.grpc_status) == (
        400,
        "INVALID_ARGUMENT",
    )
    assert (errors.NotFoundError.http_status, errors.NotFoundError.grpc_status) == (
        404,
        "NOT_FOUND",
    )
    assert errors.BackendUnavailableError.retryable and not errors.InvalidInputError.retryable
    assert issubclass(errors.MalformedMessageError, errors.InvalidInputError)
    assert errors.ConfigError("bad").to_dict() == {"error": "bad"}


def test_every_grpc_status_name_exists():
    grpc = pytest.importorskip("grpc")
    for cls in [errors.TierserveError, *errors.TierserveError.__subclasses__()]:
        stack = [cls]
        while stack:
            c = stack.pop()
            assert c.grpc_status in grpc.StatusCode.__members__, c
            stack.extend(c.__subclasses__())


def test_require_extra_names_the_extra():
    with pytest.raises(errors.MissingExtraError, match=r"pip install 'tierserve\[gpu\]'"):
        errors.require_extra("no_such_module_xyz", "gpu", "the GPU cache")
