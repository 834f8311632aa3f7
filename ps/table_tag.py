"""Table tags: the one name of an embedding table across Kafka, Redis and RocksDB.

A tag is ``hps_et.<model>.<table>`` (docs/formats.md, Files and messages 5); model and table names
match ``[A-Za-z0-9_-]{1,120}``, which also keeps them safe as file and URL path components.
"""

from __future__ import annotations

import re

from tierserve.core.errors import InvalidInputError

NAME_PATTERN = r"[A-Za-z0-9_-]{1,120}"
TAG_PREFIX = "hps_et"

_NAME_RE = re.compile(rf"^{NAME_PATTERN}$")
_TAG_RE = re.compile(rf"^{TAG_PREFIX}\.({NAME_PATTERN})\.({NAME_PATTERN})$")


def is_valid_name(name: object) -> bool:
    """True when ``name`` may be used as a model or table name."""
    return isinstance(name, str) and _NAME_RE.match(name) is not None


def check_name(name: object, what: str = "name") -> str:
    """Return ``name`` or raise :class:`InvalidInputError` saying which name broke the pattern."""
    if not is_valid_name(name):
        raise InvalidInputError(f"{what} {name!r} must match {NAME_PATTERN}")
    return name  # type: ignore[return-value]


def table_tag(model: str, table: str) -> str:
    """The tag ``hps_et.<model>.<table>`` of one embedding table."""
    return f"{TAG_PREFIX}.{check_name(model, 'model name')}.{check_name(table, 'table name')}"


def parse_table_tag(tag: str) -> tuple[str, str]:
    """Split a tag into ``(model, table)``; raise :class:`InvalidInputError` if it is not one."""
    match = _TAG_RE.match(tag) if isinstance(tag, str) else None
    if match is None:
        raise InvalidInputError(f"{tag!r} is not a table tag {TAG_PREFIX}.<model>.<table>")
    return match.group(1), match.group(2)
