"""What REST and gRPC decide alike: model names, the admin token, and what an error tells.

- :func:`model_name`: a name that cannot exist is an unknown model (404 / NOT_FOUND), as
  Triton answers; repository load and unload use :func:`load_name` (400 for a bad name).
- :class:`AdminToken`: repository load and unload need ``Bearer <token>`` when one is set.
- :func:`repository_parameters`: what a load or unload request may carry besides the name.
- :func:`public_message`, :func:`public_index`: an error's message and the repository index
  as a client sees them, without the server's file paths (the log keeps the whole message).
"""

from __future__ import annotations

import hmac
import logging
import re

from tierserve.core.errors import (
    InvalidInputError,
    NotFoundError,
    TierserveError,
    UnauthorizedError,
)
from tierserve.ps.table_tag import check_name

log = logging.getLogger("tierserve.server")


def model_name(name: str) -> str:
    """``name`` if it can name a model; else :class:`NotFoundError`."""
    try:
        return check_name(name, "model name")
    except InvalidInputError as exc:
        raise NotFoundError(exc.message) from None


def load_name(name: str) -> str:
    """``name`` if it can name a model; else :class:`InvalidInputError` (load, unload)."""
    return check_name(name, "model name")


#: Repository request parameters taken, by action: unload's ``unload_dependents`` (a model
#: here has no dependents, so either value unloads just the model).  Load overrides
#: (``config``, ``file:<path>``) are not supported and are refused rather than ignored.
REPOSITORY_PARAMETERS = {"load": frozenset(), "unload": frozenset({"unload_dependents"})}


def repository_parameters(action: str, parameters: object) -> None:
    """Refuse (:class:`InvalidInputError`, naming it) a ``parameters`` entry that repository
    ``action`` (``load``, ``unload``) does not support."""
    if not isinstance(parameters, dict):
        raise InvalidInputError(f"repository {action}: 'parameters' must be a JSON object")
    unsupported = sorted(set(parameters) - REPOSITORY_PARAMETERS[action])
    if unsupported:
        supported = ", ".join(sorted(REPOSITORY_PARAMETERS[action])) or "none"
        raise InvalidInputError(
            f"repository {action}: parameter {', '.join(map(repr, unsupported))} is not "
            f"supported (supported: {supported}); the model's files and ps.json define it"
        )


class AdminToken:
    """Checks the ``authorization`` header (HTTP) or metadata (gRPC) of protected calls."""

    def __init__(self, token: str | None) -> None:
        if token is not None and not token.strip():
            # An empty token would protect nothing while looking configured.
            raise ValueError("admin_token is empty; give a non-empty token or none")
        self.token = token

    def check(self, authorization: str | None, where: str = "header") -> None:
        """Raise :class:`UnauthorizedError` unless ``authorization`` is ``Bearer <token>``."""
        if self.token is None:
            return
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            given.strip().encode(), self.token.encode()
        ):
            raise UnauthorizedError(
                f"repository load and unload need {where} 'Authorization: Bearer <token>'"
            )


# An absolute POSIX path: a slash not preceded by a word character, dot or slash (so
# "application/json" and "KServe v2/..." stay), then path characters.
_PATH = re.compile(r"(?<![\w./])/[^\s'\"`,;:()\[\]{}<>]+")


def public_text(text: str) -> str:
    """``text`` with absolute file paths cut to their last component (``.../name``)."""
    return _PATH.sub(_last_part, text) if "/" in text else text


def public_message(exc: TierserveError) -> str:
    """``exc``'s message as :func:`public_text` cuts it; the whole message is logged when
    anything was cut."""
    message = exc.message
    public = public_text(message)
    if public != message:
        log.info("answered %s: %s", type(exc).__name__, message)
    return public


def public_index(index: list[dict[str, str]]) -> list[dict[str, str]]:
    """The repository index with the paths of its failure reasons cut."""
    return [{**m, "reason": public_text(m.get("reason", ""))} for m in index]


def _last_part(match: re.Match) -> str:
    path = match.group(0)
    cut = path.rstrip("/.")
    tail = cut.rsplit("/", 1)[-1]
    return (f".../{tail}" if tail else "...") + path[len(cut) :]


def error_body(exc: TierserveError) -> dict[str, str]:
    """The JSON error body of the KServe v2 protocol, paths removed."""
    return {"error": public_message(exc)}
