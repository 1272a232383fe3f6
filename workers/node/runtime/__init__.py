"""The microVM runtime: VMs, disk layers, snapshots and forks on one node."""

from workers.node.runtime.guest import (
    ENVD_PORT,
    InitRefused,
    http_request,
    init_envd,
    wait_and_init,
    wait_envd,
)
from workers.node.runtime.layers import LayerStore
from workers.node.runtime.memfile import allocated_bytes, clone_or_sparse_copy
from workers.node.runtime.runtime import Runtime, Timing, Vm
from workers.node.runtime.snapshot import Snapshot

__all__ = [
    "ENVD_PORT",
    "InitRefused",
    "LayerStore",
    "Runtime",
    "Snapshot",
    "Timing",
    "Vm",
    "allocated_bytes",
    "clone_or_sparse_copy",
    "http_request",
    "init_envd",
    "wait_and_init",
    "wait_envd",
]
