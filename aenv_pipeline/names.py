"""The subjects and streams a pipeline uses, from a stack's bus prefix.

The same layout as the server's `bus/subjects.py` (the one owner of aenv's names; this
client cannot import it, it needs the server's dependencies): a unit test
(`tests/unit/pipeline/test_names.py`) builds every name here and there and compares them.

With an empty prefix::

    AENV_EVT   aenv.evt.sandbox.<id>        one sandbox's history, in order
    AENV_CMD   aenv.cmd.place.create         creates, taken by any node with room
               aenv.cmd.node.<node>.<verb>   commands on a sandbox, for the node holding it

With least privilege (`aenv keys pipeline create`, `connect(scoped=True)`)::

    (request)         aenv.in.<team>.<verb>            a command, to the API's ingress
    AENV_TEAM_<team>  aenv.feed.<team>.sandbox.<id>    the team's events, secrets stripped
    AENV_FEED         aenv.feed.<team>.sandbox.<id>    every team's (the auditor's)

A prefix `t1` gives `T1_AENV_EVT`, `t1.aenv.evt.…`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

__all__ = ["VERBS", "Names", "encode_id"]

#: Subject verb of each command a pipeline sends (`bus.subjects.COMMAND_VERBS`' entries).
VERBS: Final[dict[str, str]] = {
    "CreateSandbox": "create",
    "PauseSandbox": "pause",
    "ResumeSandbox": "resume",
    "KillSandbox": "kill",
    "SetSandboxTimeout": "timeout",
    "ForkSandbox": "fork",
}

_TOKEN = re.compile(r"^[^.*>\s]+$")
_ESCAPED = {"%": "%25", ".": "%2E"}
_UNESCAPE = re.compile(r"%(25|2E)")


def _token(value: str, what: str) -> str:
    if not _TOKEN.match(value):
        raise ValueError(f"{what} {value!r} cannot be a subject token")
    return value


def encode_id(aggregate_id: str) -> str:
    """An aggregate id as one subject token (`.` and `%` escaped as in a URL)."""
    return _token("".join(_ESCAPED.get(c, c) for c in aggregate_id), "aggregate id")


def decode_id(token: str) -> str:
    """Inverse of `encode_id`."""
    return _UNESCAPE.sub(lambda m: chr(int(m.group(1), 16)), token)


@dataclass(frozen=True)
class Names:
    """The names of one aenv stack (its `AENV_BUS_PREFIX`)."""

    prefix: str = ""

    def _subject(self, *tokens: str) -> str:
        return ".".join((self.prefix, *tokens) if self.prefix else tokens)

    @property
    def event_stream(self) -> str:
        return f"{self.prefix.upper()}_AENV_EVT" if self.prefix else "AENV_EVT"

    @property
    def command_stream(self) -> str:
        return f"{self.prefix.upper()}_AENV_CMD" if self.prefix else "AENV_CMD"

    @property
    def sandbox_events_all(self) -> str:
        """Every sandbox's events (wildcard)."""
        return self._subject("aenv", "evt", "sandbox", "*")

    def sandbox_events(self, sandbox_id: str) -> str:
        """One sandbox's history."""
        return self._subject("aenv", "evt", "sandbox", encode_id(sandbox_id))

    def aggregate_id_of(self, subject: str) -> str:
        return decode_id(subject.rsplit(".", 1)[-1])

    def place_command(self, verb: str) -> str:
        return self._subject("aenv", "cmd", "place", _token(verb, "verb"))

    def ingress(self, team: str, verb: str) -> str:
        """Where a team's pipeline sends a command (the team's own NATS user may)."""
        return self._subject("aenv", "in", _token(team, "team"), _token(verb, "verb"))

    def team_stream(self, team: str) -> str:
        """The stream a team's pipeline reads: its sandboxes' events, secrets stripped."""
        name = f"AENV_TEAM_{_token(team, 'team')}"
        return f"{self.prefix.upper()}_{name}" if self.prefix else name

    @property
    def feed_stream(self) -> str:
        """Every team's stripped events: the auditor's stream."""
        return f"{self.prefix.upper()}_AENV_FEED" if self.prefix else "AENV_FEED"

    def feed(self, team: str | None, sandbox_id: str | None) -> str:
        """A sandbox's subject in the feed (None: any team's; any sandbox's)."""
        sid = encode_id(sandbox_id) if sandbox_id is not None else "*"
        return self._subject("aenv", "feed", team or "*", "sandbox", sid)

    def inbox(self, team: str | None) -> str:
        """The inbox prefix a team's pipeline (None: the auditor) receives replies on."""
        own = ("aenv", _token(team, "team")) if team is not None else ("aenv-auditor",)
        return ".".join(("_INBOX", *((self.prefix,) if self.prefix else ()), *own))

    def node_command(self, node_id: str, verb: str) -> str:
        return self._subject(
            "aenv", "cmd", "node", _token(node_id, "node id"), _token(verb, "verb")
        )
