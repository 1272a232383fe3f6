"""What the node's handler modules need of the node (the node worker is one): named here so
that `forks.py` and `openings.py` depend on the pieces, not on the worker that holds them
(which imports them: a back-reference would make the two one module in two files)."""

from __future__ import annotations

from typing import Protocol

from bus import Bus
from domain import sandbox as sb
from workers.node.capacity import Ledger
from workers.node.journal import Journal
from workers.node.ports import GuestConfig, Host
from workers.node.routes import RoutePublisher

__all__ = ["NodeSite"]


class NodeSite(Protocol):
    @property
    def bus(self) -> Bus: ...
    @property
    def host(self) -> Host: ...
    @property
    def node_id(self) -> str: ...
    @property
    def capacity(self) -> Ledger: ...
    @property
    def journal(self) -> Journal: ...
    @property
    def route_publisher(self) -> RoutePublisher: ...
    def guest_config(self, state: sb.Sandbox | sb.CreateSandbox) -> GuestConfig: ...
