"""The installed tierserve's version, for the server metadata and the command line."""

from __future__ import annotations

from importlib import metadata


def version() -> str:
    """The installed distribution's version (``0+unknown`` when not installed)."""
    try:
        return metadata.version("tierserve")
    except metadata.PackageNotFoundError:
        return "0+unknown"
