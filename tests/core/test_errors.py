import pytest

from tierserve.core import errors


def test_retryable_and_hierarchy():
    assert errors.BackendUnavailableError.retryable and not errors.InvalidInputError.retryable
    assert issubclass(errors.MalformedMessageError, errors.InvalidInputError)
    assert errors.ConfigError("bad").to_dict() == {"error": "bad"}


def test_the_errors_know_no_transport():
    """HTTP and gRPC statuses are the server's mapping (tests/server/test_errors.py)."""
    for cls in [errors.TierserveError, *errors.TierserveError.__subclasses__()]:
        assert not hasattr(cls, "http_status") and not hasattr(cls, "grpc_status"), cls


def test_require_extra_names_the_extra():
    with pytest.raises(errors.MissingExtraError, match=r"pip install 'tierserve\[gpu\]'"):
        errors.require_extra("no_such_module_xyz", "gpu", "the GPU cache")
