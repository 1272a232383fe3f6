"""How full aenv's JetStream streams are, read at each scrape (`docs/observability.md`).

The event log is the fleet's only source of truth and refuses appends when it is full
(`discard=new`, `bus.setup`): every create, pause and heartbeat-driven decision of the
fleet fails at once. These series give the warning before that: each stream's bytes and
messages, its limits, and the fill — the larger of bytes over the byte limit and
messages over the message limit. A stream without a byte limit is measured against its
account's JetStream storage limit when the account has one; with neither, `fill_ratio`
is absent and the servers' own store is what fills (NATS's exporter:
`jetstream_server_total_message_bytes` over `jetstream_server_max_storage`, the other
store rule of deploy/prometheus/aenv-alerts.yml).

Every API exports the same values (they all read the same streams): dashboards and rules
take `max by (stream)`, never a sum.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from nats.js import JetStreamContext
from prometheus_client import Gauge

from shared.metrics import Scrape

__all__ = ["StreamGauges", "fill_ratio"]


def fill_ratio(nbytes: int, msgs: int, max_bytes: int, max_msgs: int) -> float | None:
    """The fuller of bytes and messages against their limits (a limit <= 0 is none);
    None when neither has a limit."""
    shares = [used / limit for used, limit in ((nbytes, max_bytes), (msgs, max_msgs)) if limit > 0]
    return max(shares) if shares else None


class StreamGauges:
    """`aenv_jetstream_stream_{bytes,messages,max_bytes,max_messages,fill_ratio}{stream}`."""

    def __init__(self, scrape: Scrape, js: JetStreamContext, streams: Sequence[str]) -> None:
        self._js = js
        self._streams = tuple(streams)
        r, labels = scrape.registry, ["stream"]
        self.bytes = Gauge(
            "aenv_jetstream_stream_bytes", "Bytes a stream stores.", labels, registry=r
        )
        self.messages = Gauge(
            "aenv_jetstream_stream_messages", "Messages a stream stores.", labels, registry=r
        )
        self.max_bytes = Gauge(
            "aenv_jetstream_stream_max_bytes",
            "A stream's byte limit (else its account's storage limit; -1: none).",
            labels,
            registry=r,
        )
        self.max_messages = Gauge(
            "aenv_jetstream_stream_max_messages",
            "A stream's message limit (-1: none).",
            labels,
            registry=r,
        )
        self.fill = Gauge(
            "aenv_jetstream_stream_fill_ratio",
            "The fuller of bytes and messages against their limits (0-1; absent: no limit).",
            labels,
            registry=r,
        )
        scrape.on_scrape("streams", self.refresh)

    async def refresh(self) -> None:
        account = await self._js.account_info()
        account_bytes = account.limits.max_storage or -1
        for stream in self._streams:
            info = await self._js.stream_info(stream)
            used, msgs = info.state.bytes, info.state.messages
            max_bytes = info.config.max_bytes or -1
            if max_bytes <= 0:
                max_bytes = account_bytes
            max_msgs = info.config.max_msgs or -1
            self.bytes.labels(stream).set(used)
            self.messages.labels(stream).set(msgs)
            self.max_bytes.labels(stream).set(max_bytes if max_bytes > 0 else -1)
            self.max_messages.labels(stream).set(max_msgs if max_msgs > 0 else -1)
            ratio = fill_ratio(used, msgs, max_bytes, max_msgs)
            if ratio is not None:
                self.fill.labels(stream).set(ratio)
            else:  # a limit lifted: no fill to speak of (the store's is NATS's series)
                with contextlib.suppress(KeyError):
                    self.fill.remove(stream)
