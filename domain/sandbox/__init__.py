"""The sandbox aggregate: commands, events, state and the pure decide/evolve over them."""

from domain.sandbox.clock import Clock, clock_of, fold_clock, tick
from domain.sandbox.commands import *  # noqa: F403
from domain.sandbox.commands import __all__ as _commands
from domain.sandbox.decide import DEFAULT_POLICY, decide
from domain.sandbox.events import *  # noqa: F403
from domain.sandbox.events import __all__ as _events
from domain.sandbox.evolve import State, evolve, fold
from domain.sandbox.network import MAX_EGRESS_ENTRIES, check_egress
from domain.sandbox.spec import SPEC_FIELDS, SandboxSpec, upcast_requested_v1
from domain.sandbox.state import RECENT_COMMANDS, Sandbox, ttl_on_resume
from domain.sandbox.timer import (
    drop_command,
    expiry_command,
    fork_child_command,
    orphan_commands,
    retention_command,
)
from domain.sandbox.values import *  # noqa: F403
from domain.sandbox.values import __all__ as _values

__all__ = [
    *_commands,
    *_events,
    *_values,
    "DEFAULT_POLICY",
    "MAX_EGRESS_ENTRIES",
    "Clock",
    "RECENT_COMMANDS",
    "SPEC_FIELDS",
    "Sandbox",
    "SandboxSpec",
    "State",
    "check_egress",
    "clock_of",
    "decide",
    "drop_command",
    "evolve",
    "expiry_command",
    "fold",
    "fold_clock",
    "fork_child_command",
    "orphan_commands",
    "retention_command",
    "tick",
    "ttl_on_resume",
    "upcast_requested_v1",
]
