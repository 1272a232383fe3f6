"""Every NATS header name aenv reads or writes."""

from __future__ import annotations

from typing import Final

__all__ = [
    "EXPECTED_LAST_SUBJECT_SEQUENCE",
    "EXPECTED_STREAM",
    "MSG_ID",
    "SCHEMA_VERSION",
    "STATUS",
    "TRACEPARENT",
    "TRACESTATE",
    "TYPE",
]

#: JetStream dedup: a second message with the same id within the window is not stored
#: (the ack says `duplicate`). We set it to the event id / command id.
MSG_ID: Final = "Nats-Msg-Id"
#: Optimistic concurrency: stored only if the subject's last sequence is this value (0 = none).
EXPECTED_LAST_SUBJECT_SEQUENCE: Final = "Nats-Expected-Last-Subject-Sequence"
#: Refuse the publish unless it lands in this stream (guards against overlapping filters).
EXPECTED_STREAM: Final = "Nats-Expected-Stream"
#: Status of a direct-get / pull response (404 no message, 408 request timeout…).
STATUS: Final = "Status"

#: W3C trace context (https://www.w3.org/TR/trace-context/), lower-case as the spec writes it.
TRACEPARENT: Final = "traceparent"
TRACESTATE: Final = "tracestate"

#: Message type and schema version, duplicated from the JSON envelope so that tools (and
#: `nats sub`) can filter without parsing the body.
TYPE: Final = "Aenv-Type"
SCHEMA_VERSION: Final = "Aenv-Schema-Version"
