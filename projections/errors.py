"""Errors of the read side. Driver errors are translated into these at the edge."""

from __future__ import annotations

__all__ = ["ProjectionError", "ProjectionTimeout", "RebuildError"]


class ProjectionError(Exception):
    """Root of every error raised by `projections`."""


class ProjectionTimeout(ProjectionError):
    """A projection did not reach a sequence in time (`wait_for`)."""


class RebuildError(ProjectionError):
    """A rebuild could not complete or swap in its tables."""
