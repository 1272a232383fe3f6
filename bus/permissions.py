"""NATS subject permissions of aenv's least-privilege users (docs/pipelines.md).

- the stack's own user (roles, operator commands): everything, as before;
- a team's **pipeline** user: publish its commands to its ingress only
  (`aenv.in.<team>.>`, answered by the API's ingress), and read its own stream
  `AENV_TEAM_<team>` (its sandboxes' events, secrets stripped) — stream info, consumers
  on that stream only, message gets from it, the flow-control replies of its consumers;
- the **auditor**: the same reads on `AENV_FEED` (every team's stripped events); it
  publishes nothing else.

JetStream is driven by requests to `$JS.API.<verb>.<stream>…`, so naming the stream in
every allowed API subject is what keeps a user off `AENV_EVT` (every envd token) and
`AENV_CMD`: a user free to create consumers on any stream could read them all. Nothing
here lets a user create, purge or delete a stream, or publish to the log or the command
queue. Replies come to an inbox prefix of the user's own (`Names.inbox`), the only
subjects it may subscribe to, so it sees no reply meant for someone else.
"""

from __future__ import annotations

from typing import Any

from bus.subjects import Names

__all__ = ["auditor_permissions", "pipeline_permissions", "stream_reader"]


def stream_reader(stream: str) -> list[str]:
    """What reading one stream takes: its info, consumers on it (made, looked up, deleted),
    message gets, and the flow-control answers of its push consumers."""
    api = "$JS.API"
    return [
        f"{api}.STREAM.INFO.{stream}",
        f"{api}.STREAM.MSG.GET.{stream}",
        f"{api}.DIRECT.GET.{stream}",
        f"{api}.DIRECT.GET.{stream}.>",
        f"{api}.CONSUMER.CREATE.{stream}",
        f"{api}.CONSUMER.CREATE.{stream}.>",
        f"{api}.CONSUMER.INFO.{stream}.*",
        f"{api}.CONSUMER.DELETE.{stream}.*",
        f"{api}.CONSUMER.MSG.NEXT.{stream}.*",
        f"$JS.FC.{stream}.>",
        f"$JS.ACK.{stream}.>",
    ]


def pipeline_permissions(names: Names, team: str) -> dict[str, Any]:
    """A team's pipeline user: its ingress, its own stream."""
    return {
        "publish": {"allow": [names.team_ingress(team), *stream_reader(names.team_stream(team))]},
        "subscribe": {"allow": [f"{names.inbox(team)}.>"]},
    }


def auditor_permissions(names: Names) -> dict[str, Any]:
    """The auditor: reads the feed, sends nothing."""
    return {
        "publish": {"allow": stream_reader(names.feed_stream)},
        "subscribe": {"allow": [f"{names.inbox(None)}.>"]},
    }
