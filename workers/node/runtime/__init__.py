"""The microVM runtime: VMs, disk layers, snapshots and forks on one node."""

from workers.node.runtime.guest import (
    ENVD_PORT,
    InitRefused,
    http_request,
    init_envd,
    run_first_command,
    wait_and_init,
    wait_envd,
)
from workers.node.runtime.layers import LayerStore
from workers.node.runtime.memfile import allocated_bytes, clone_or_sparse_copy
from workers.node.runtime.runtime import Runtime
from workers.node.runtime.snapshot import Snapshot
from workers.node.runtime.vm import Timing, Vm, new_id, race_exit

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
    "new_id",
    "race_exit",
    "run_first_command",
    "wait_and_init",
    "wait_envd",
]
