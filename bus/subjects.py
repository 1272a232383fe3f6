"""Every stream, subject, consumer and KV bucket name of aenv (design §3). The only place
subject literals are written; everyone else calls these builders.

Layout (with an empty prefix)::

    stream AENV_EVT   aenv.evt.<kind>.<id>         kind: sandbox | template | apikey |
                                                        build | volume | image | buildkey (the log;
                                                        `domain.aggregates` lists them)
    stream AENV_CMD   aenv.cmd.node.<node>.<verb>  commands on a sandbox a node holds
                      aenv.cmd.place.<verb>        creates, pulled by any node with room
                      aenv.cmd.build.<verb>        template builds, pulled by any builder
    KV     aenv_nodes <node id>                    heartbeats and live capacity

    (core)     aenv.in.<team>.<verb>          a pipeline's command, to the API's ingress
    AENV_FEED  aenv.feed.<team>.sandbox.<id>  the sandbox events, secrets stripped (auditor)
    AENV_TEAM_<team>                          one team's part of AENV_FEED (its pipelines)

A prefix `t1` gives stream `T1_AENV_EVT`, subjects `t1.aenv.evt.…`, bucket `t1_aenv_nodes`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from bus.errors import InvalidName
from domain.aggregates import AggregateKind

__all__ = [
    "COMMAND_VERBS",
    "OTHER_TEAM",
    "PIPELINE_TEAM",
    "AggregateKind",  # re-exported: each kind owns a subject family in AENV_EVT
    "Names",
    "carries",
    "decode_id",
    "encode_id",
    "pipeline_team",
    "team_token",
]

_TOKEN = re.compile(r"^[^.*>\s]+$")
#: What an aggregate id's token escapes (`%XX`, as in a URL): `.` separates tokens, and the
#: escape character itself, so that decoding is exact. `*`, `>` and whitespace are not
#: escaped: no id of ours may hold them (`carries`), and the API refuses them with a 400.
_ESCAPED = {"%": "%25", ".": "%2E"}
_UNESCAPE = re.compile(r"%(25|2E)")


#: Subject verb of each command type that travels over AENV_CMD.
COMMAND_VERBS: Final[dict[str, str]] = {
    "CreateSandbox": "create",
    "PauseSandbox": "pause",
    "ResumeSandbox": "resume",
    "KillSandbox": "kill",
    "SetSandboxTimeout": "timeout",
    "ForkSandbox": "fork",
    "SnapshotSandbox": "snapshot",
    "UpdateSandboxNetwork": "network",
    "RegisterTemplate": "template-register",
    "DeleteTemplate": "template-delete",
    "ImportTemplateImage": "template-import",
    "StartTemplateBuild": "build-start",
}


def _token(value: str, what: str) -> str:
    if not _TOKEN.match(value):
        raise InvalidName(f"{what} {value!r} cannot be a subject token")
    return value


def encode_id(aggregate_id: str) -> str:
    """The subject token of an aggregate id, without loss: template names with a `.`
    (`my.tpl`) and image references (`docker.io/library/python:3.12`) are ids too. Ids
    without `%` or `.` (every sandbox id, most names) are their own token, so the subjects
    of events written before this escape are unchanged."""
    token = "".join(_ESCAPED.get(c, c) for c in aggregate_id)
    return _token(token, "aggregate id")


def decode_id(token: str) -> str:
    """Inverse of `encode_id`."""
    return _UNESCAPE.sub(lambda m: chr(int(m.group(1), 16)), token)


#: The teams that may have pipeline users: a subject token and a stream name's tail.
PIPELINE_TEAM: Final = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
#: The feed's team token of a sandbox whose team can have no pipeline (none, or a name
#: outside `PIPELINE_TEAM`): no team's stream takes it, the auditor reads it.
OTHER_TEAM: Final = "%other"


def pipeline_team(team: str) -> str:
    """`team`, if it can have pipeline users (else `InvalidName`)."""
    if not PIPELINE_TEAM.match(team):
        raise InvalidName(f"team {team!r} cannot have pipelines: letters, digits, _ and - only")
    return team


def team_token(team: str | None) -> str:
    """A sandbox's team as its feed subject's token."""
    return team if team is not None and PIPELINE_TEAM.match(team) else OTHER_TEAM


def carries(aggregate_id: str) -> bool:
    """Whether `aggregate_id` can name an aggregate on the bus (the API refuses the rest
    with a 400 before anything is written)."""
    try:
        encode_id(aggregate_id)
    except InvalidName:
        return False
    return True


@dataclass(frozen=True)
class Names:
    """The names of one aenv stack, derived from its bus prefix."""

    prefix: str = ""

    def _subject(self, *tokens: str) -> str:
        return ".".join((self.prefix, *tokens) if self.prefix else tokens)

    def _upper(self, name: str) -> str:
        return f"{self.prefix.upper()}_{name}" if self.prefix else name

    def _lower(self, name: str) -> str:
        return f"{self.prefix}_{name}" if self.prefix else name

    # -- streams and buckets -------------------------------------------------------------
    @property
    def event_stream(self) -> str:
        """The event log: file storage, limits retention, kept until an operator prunes."""
        return self._upper("AENV_EVT")

    @property
    def command_stream(self) -> str:
        """Commands: work-queue retention, each message removed once a worker acks it."""
        return self._upper("AENV_CMD")

    @property
    def nodes_bucket(self) -> str:
        """KV bucket of node heartbeats and capacity (not events: they are state, not history)."""
        return self._lower("aenv_nodes")

    @property
    def routes_bucket(self) -> str:
        """KV bucket: running sandbox → node and guest address, for the proxy of any API
        process (ephemeral facts about live VMs, not history)."""
        return self._lower("aenv_routes")

    @property
    def secrets_bucket(self) -> str:
        """KV bucket of short-lived secrets handed from the API to a worker (a build's
        registry password): never an event, gone after its TTL."""
        return self._lower("aenv_secrets")

    @property
    def admission_bucket(self) -> str:
        """KV bucket of the teams' creation-rate token buckets (`bus.ratebuckets`): one
        number per bucket, shared by every API of the fleet."""
        return self._lower("aenv_admission")

    @property
    def gc_lease_bucket(self) -> str:
        """KV bucket of the repository GC's lease (`bus.leases`): its TTL is the GC period,
        so one node of the fleet collects per period."""
        return self._lower("aenv_gc_lease")

    # -- event subjects ------------------------------------------------------------------
    @property
    def all_events(self) -> str:
        """Wildcard of every event subject: the event stream's subject filter."""
        return self._subject("aenv", "evt", ">")

    def events_of_kind(self, kind: AggregateKind) -> str:
        """Wildcard of one aggregate type's subjects (a projection's filter)."""
        return self._subject("aenv", "evt", kind.value, "*")

    def events(self, kind: AggregateKind, aggregate_id: str) -> str:
        """The subject of one aggregate: its whole history, in order."""
        return self._subject("aenv", "evt", kind.value, encode_id(aggregate_id))

    def sandbox_events(self, sandbox_id: str) -> str:
        return self.events(AggregateKind.SANDBOX, sandbox_id)

    def aggregate_id_of(self, subject: str) -> str:
        """Inverse of `events`: the aggregate id is always the last token."""
        return decode_id(subject.rsplit(".", 1)[-1])

    @staticmethod
    def kind_of(subject: str) -> str:
        """Inverse of `events`: the aggregate's kind is the token before its id."""
        parts = subject.rsplit(".", 2)
        return parts[-2] if len(parts) == 3 else ""

    # -- command subjects ----------------------------------------------------------------
    @property
    def all_commands(self) -> str:
        return self._subject("aenv", "cmd", ">")

    def node_command(self, node_id: str, verb: str) -> str:
        """A command for the node that holds the sandbox."""
        node = _token(node_id, "node id")
        return self._subject("aenv", "cmd", "node", node, _token(verb, "verb"))

    def node_commands(self, node_id: str) -> str:
        """Wildcard of every command for one node (its durable consumer's filter)."""
        return self._subject("aenv", "cmd", "node", _token(node_id, "node id"), "*")

    def place_command(self, verb: str) -> str:
        """A command any node with room may take (creates)."""
        return self._subject("aenv", "cmd", "place", _token(verb, "verb"))

    @property
    def place_commands(self) -> str:
        return self._subject("aenv", "cmd", "place", "*")

    def is_placed(self, subject: str) -> bool:
        """Whether a command's subject is placement's (any node may take it), not a node's."""
        return subject.rsplit(".", 1)[0] == self.place_commands.rsplit(".", 1)[0]

    def build_command(self, verb: str) -> str:
        """A command for the template builders (any builder may take it)."""
        return self._subject("aenv", "cmd", "build", _token(verb, "verb"))

    @property
    def build_commands(self) -> str:
        return self._subject("aenv", "cmd", "build", "*")

    @property
    def build_consumer(self) -> str:
        """Durable pull consumer shared by the template builders."""
        return self._lower("build")

    # -- pipelines: per-team ingress and the stripped feed (docs/pipelines.md) ----------
    def ingress(self, team: str, verb: str) -> str:
        """Where a team's pipeline sends a command (core request/reply, served by the API's
        ingress, which takes the team from here and never from the body)."""
        return self._subject("aenv", "in", pipeline_team(team), _token(verb, "verb"))

    def team_ingress(self, team: str) -> str:
        """Wildcard of one team's ingress: what its pipeline user may publish to."""
        return self._subject("aenv", "in", pipeline_team(team), ">")

    def parse_ingress(self, subject: str) -> tuple[str, str] | None:
        """Inverse of `ingress`: (team, verb) of an ingress subject, None for any other."""
        start = self._subject("aenv", "in", "")
        parts = subject[len(start) :].split(".") if subject.startswith(start) else []
        return (parts[0], parts[1]) if len(parts) == 2 and all(parts) else None

    @property
    def all_ingress(self) -> str:
        """Wildcard of every team's ingress: the ingress's subscription."""
        return self._subject("aenv", "in", "*", "*")

    @property
    def feed_stream(self) -> str:
        """Every sandbox event with its secrets stripped, by team: the auditor's log."""
        return self._upper("AENV_FEED")

    @property
    def all_feed(self) -> str:
        return self._subject("aenv", "feed", ">")

    def feed(self, team_token: str, sandbox_id: str) -> str:
        """One sandbox's stripped history in the feed (`team_token`: `team_token()`)."""
        return self._subject("aenv", "feed", team_token, "sandbox", encode_id(sandbox_id))

    def team_feed(self, team: str) -> str:
        """Wildcard of one team's part of the feed (its stream's source filter)."""
        return self._subject("aenv", "feed", pipeline_team(team), ">")

    def team_stream(self, team: str) -> str:
        """The stream one team's pipelines read: its part of the feed, sourced by NATS."""
        return self._upper(f"AENV_TEAM_{pipeline_team(team)}")

    def inbox(self, team: str | None) -> str:
        """The reply-inbox prefix of a team's pipeline (None: the auditor's): the only
        subjects such a user may subscribe to, so that it sees no one else's replies."""
        own = ("aenv", pipeline_team(team)) if team is not None else ("aenv-auditor",)
        return ".".join(("_INBOX", *((self.prefix,) if self.prefix else ()), *own))

    @property
    def feed_consumer(self) -> str:
        """Durable consumer of the sandbox events that the feed republishes."""
        return self._lower("feed")

    # -- durable consumer names (no dots allowed) ------------------------------------------
    def node_consumer(self, node_id: str) -> str:
        """Durable pull consumer of one node's own commands."""
        return self._lower(f"node-{_token(node_id, 'node id')}")

    def snapshot_consumer(self, node_id: str) -> str:
        """Durable consumer of the sandbox events for one node's snapshot worker (its
        captures are on that node's disk: nobody else can upload them)."""
        return self._lower(f"snapshot-{_token(node_id, 'node id')}")

    def snapshot_template_consumer(self, node_id: str) -> str:
        """Durable consumer of the template events for one node's snapshot worker: the
        images imported on that node, whose captures it uploads."""
        return self._lower(f"snapshot-tpl-{_token(node_id, 'node id')}")

    def volume_consumer(self, node_id: str) -> str:
        """Durable consumer of the sandbox events for one node's volume releaser (the
        images its ended sandboxes wrote are on that node's disk)."""
        return self._lower(f"volumes-{_token(node_id, 'node id')}")

    @property
    def place_consumer(self) -> str:
        """Durable pull consumer shared by every node: whoever pulls first places."""
        return self._lower("place")

    def durable(self, name: str) -> str:
        """Any other durable consumer (timer, snapshot uploader…), namespaced."""
        return self._lower(_token(name, "consumer name"))
