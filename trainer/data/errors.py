"""The error raised for a data file that cannot be read as its format says.

:class:`DataFileError` names the file and, where known, the record (0-based, counted within
that file), the slot and the field, both in its message and as attributes, so that callers
and tests can tell exactly where the data is broken.
"""

from __future__ import annotations

from tierserve.core.errors import InvalidInputError


class DataFileError(InvalidInputError):
    """A data file (Norm, Raw, Parquet, CSV) or file list is missing, truncated or corrupt."""

    def __init__(
        self,
        file: str,
        problem: str,
        *,
        record: int | None = None,
        slot: int | None = None,
        field: str | None = None,
    ) -> None:
        where = [str(file)]
        if record is not None:
            where.append(f"record {record}")
        if slot is not None:
            where.append(f"slot {slot}")
        if field is not None:
            where.append(f"field {field}")
        super().__init__(f"{', '.join(where)}: {problem}")
        self.file = str(file)
        self.record = record
        self.slot = slot
        self.field = field
        self.problem = problem
