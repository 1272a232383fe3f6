"""`aenv events` lines (`projections.history`) never print a sandbox's tokens."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from uuid import uuid4

from bus.envelope import MessageContext, decode_event, encode_event
from bus.records import RecordedEvent
from domain import sandbox as sb
from projections.history import format_line, history_line


def test_a_requests_tokens_stay_out_of_the_history() -> None:
    create = sb.CreateSandbox(
        sandbox_id="sbx1",
        template_id="base",
        at=datetime(2026, 1, 1, tzinfo=UTC),
        envd_access_token="envd-secret",
        traffic_access_token="traffic-secret",
        network=sb.NetworkPolicy(allow_public_traffic=False),
    )
    [event] = sb.decide(None, create)
    env, raw = encode_event(
        event, event_id=uuid4(), aggregate_id="sbx1", aggregate_version=1, context=MessageContext()
    )
    env, decoded = decode_event(raw)
    line = history_line(RecordedEvent(seq=1, subject="s", envelope=env, event=decoded))
    printed = format_line(line) + json.dumps(line.as_json())
    assert "traffic-secret" not in printed and "envd-secret" not in printed
    assert line.details["network"]["allow_public_traffic"] is False  # the policy shows
