"""Every route of the console, for `api.app` to mount."""

from __future__ import annotations

from typing import Any

from api.console import fleet, pages, sandboxes, terminal

__all__ = ["ROUTES"]

ROUTES: list[Any] = [*pages.ROUTES, *fleet.ROUTES, *sandboxes.ROUTES, *terminal.ROUTES]
