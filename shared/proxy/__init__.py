"""The sandbox proxy: E2B's envd and guest-port traffic streamed to a guest, HTTP and
WebSocket (`stream`, `websocket`), addressed by headers or host name (`hosts`), and the
route table that finds a sandbox's guest from the nodes' routes bucket (`routes`). The API
serves it in front of its control plane; each node serves it for the VMs it runs (an API
on another host reaches guests through it)."""

from shared.proxy.hosts import host_label, sandbox_target, stray_host
from shared.proxy.routes import AutoResume, RouteTable
from shared.proxy.stream import (
    ASGIApp,
    Receive,
    Resolver,
    SandboxProxy,
    SandboxUnavailable,
    Scope,
    Send,
    TrafficRefused,
    Upstream,
)

__all__ = [
    "ASGIApp",
    "AutoResume",
    "Receive",
    "Resolver",
    "RouteTable",
    "SandboxProxy",
    "SandboxUnavailable",
    "Scope",
    "Send",
    "TrafficRefused",
    "Upstream",
    "host_label",
    "sandbox_target",
    "stray_host",
]
