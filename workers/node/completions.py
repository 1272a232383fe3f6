"""Ids of the node's completions (`Complete*` commands): derived from the request they
complete, so a redelivered request completes once."""

from __future__ import annotations

from uuid import UUID

from domain import Command
from domain import sandbox as sb

__all__ = ["completion_id"]


def completion_id(request: Command, what: str) -> UUID:
    """The id of the command that completes `request` with `what`."""
    return sb.derived_command_id(str(request.command_id), what)
