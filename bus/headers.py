"""Every NATS header name aenv reads or writes.

Kept few on purpose: every header is stored with each event and parsed by every reader
(the type and schema version live in the JSON envelope, not in headers).
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "EVENT_SEQ",
    "EXPECTED_LAST_SUBJECT_SEQUENCE",
    "EXPECTED_STREAM",
    "MSG_ID",
    "TRACEPARENT",
    "TRACESTATE",
]

#: JetStream dedup: a second message with the same id within the window is not stored
#: (the ack says `duplicate`). We set it to the event id / command id.
MSG_ID: Final = "Nats-Msg-Id"
#: Optimistic concurrency: stored only if the subject's last sequence is this value (0 = none).
EXPECTED_LAST_SUBJECT_SEQUENCE: Final = "Nats-Expected-Last-Subject-Sequence"
#: Refuse the publish unless it lands in this stream (guards against overlapping filters).
EXPECTED_STREAM: Final = "Nats-Expected-Stream"

#: On a feed message (`bus.teamfeed`): the event's sequence in the event log, so that an
#: auditor's finding names the stored event it came from.
EVENT_SEQ: Final = "Aenv-Event-Seq"

#: W3C trace context (https://www.w3.org/TR/trace-context/), lower-case as the spec writes it.
TRACEPARENT: Final = "traceparent"
TRACESTATE: Final = "tracestate"
