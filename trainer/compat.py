"""Warnings for HugeCTR parameters the trainer accepts but cannot honour (see
:mod:`tierserve.ps.compat`, which the whole codebase shares)."""

from tierserve.ps.compat import HugeCTRCompatibilityWarning, reset_warnings, warn_once

__all__ = ["HugeCTRCompatibilityWarning", "reset_warnings", "warn_once"]
