"""The sandbox aggregate: commands, events, state and the pure decide/evolve over them."""

from aenv.domain.sandbox.commands import *  # noqa: F403
from aenv.domain.sandbox.commands import __all__ as _commands
from aenv.domain.sandbox.decide import DEFAULT_POLICY, decide
from aenv.domain.sandbox.events import *  # noqa: F403
from aenv.domain.sandbox.events import __all__ as _events
from aenv.domain.sandbox.evolve import State, evolve, fold
from aenv.domain.sandbox.state import RECENT_COMMANDS, Sandbox
from aenv.domain.sandbox.timer import expiry_command, fork_child_command
from aenv.domain.sandbox.values import *  # noqa: F403
from aenv.domain.sandbox.values import __all__ as _values

__all__ = [
    *_commands,
    *_events,
    *_values,
    "DEFAULT_POLICY",
    "RECENT_COMMANDS",
    "Sandbox",
    "State",
    "decide",
    "evolve",
    "expiry_command",
    "fold",
    "fork_child_command",
]
