"""The streams' limits and their fill against a real JetStream (issue 30): streams an older
version made take the limits at the next start; a log at its limit refuses the append
(never drops history) and the scrape reads it full."""

from __future__ import annotations

import secrets

import nats
import pytest
from nats.js.api import DiscardPolicy, RetentionPolicy, StreamConfig
from nats.js.errors import APIError
from prometheus_client.parser import text_string_to_metric_families

from bus import BusSettings, delete_all
from bus.setup import ensure_streams
from bus.subjects import Names
from shared.metrics import Scrape
from shared.stream_metrics import StreamGauges

NATS_URL = "nats://127.0.0.1:4222"


def _samples(text: bytes, name: str) -> dict[str, float]:
    return {
        s.labels["stream"]: s.value
        for f in text_string_to_metric_families(text.decode())
        for s in f.samples
        if s.name == name
    }


async def test_old_streams_take_the_limits_and_a_full_log_refuses_appends() -> None:
    settings = BusSettings(
        nats_url=NATS_URL, bus_prefix=f"t{secrets.token_hex(4)}", event_max_msgs=5
    )
    names = Names(settings.bus_prefix)
    nc = await nats.connect(NATS_URL)
    js = nc.jetstream()
    try:
        await js.add_stream(  # as the version before limits made it
            StreamConfig(
                name=names.command_stream,
                subjects=[names.all_commands],
                retention=RetentionPolicy.WORK_QUEUE,
            )
        )
        await ensure_streams(js, settings)
        cmd = (await js.stream_info(names.command_stream)).config
        assert (cmd.discard, cmd.max_msgs) == (DiscardPolicy.NEW, settings.command_max_msgs)
        evt = (await js.stream_info(names.event_stream)).config
        assert (evt.discard, evt.max_msgs, evt.max_bytes) == (DiscardPolicy.NEW, 5, -1)

        scrape = Scrape()
        StreamGauges(scrape, js, [names.event_stream, names.command_stream])
        subject = f"{settings.bus_prefix}.aenv.evt.sandbox.x"
        for i in range(4):
            await js.publish(subject, b"{}", headers={"Nats-Msg-Id": f"m{i}"})
        text = await scrape.render()
        assert _samples(text, "aenv_jetstream_stream_messages")[names.event_stream] == 4
        assert _samples(text, "aenv_jetstream_stream_fill_ratio")[names.event_stream] == 0.8
        assert _samples(text, "aenv_jetstream_stream_max_bytes")[names.event_stream] == -1
        # the command queue: a message limit only (1 000 000 by default), never empty series
        assert _samples(text, "aenv_jetstream_stream_max_messages")[names.command_stream] == (
            settings.command_max_msgs
        )

        await js.publish(subject, b"{}", headers={"Nats-Msg-Id": "m4"})
        with pytest.raises(APIError, match="maximum messages exceeded"):
            await js.publish(subject, b"{}", headers={"Nats-Msg-Id": "m5"})
        info = await js.stream_info(names.event_stream)
        assert (info.state.first_seq, info.state.last_seq) == (1, 5)  # nothing dropped
        text = await scrape.render()
        assert _samples(text, "aenv_jetstream_stream_fill_ratio")[names.event_stream] == 1.0

        lifted = BusSettings(nats_url=NATS_URL, bus_prefix=settings.bus_prefix)
        await ensure_streams(js, lifted)  # the limit lifted: no fill to speak of
        text = await scrape.render()
        assert names.event_stream not in _samples(text, "aenv_jetstream_stream_fill_ratio")
    finally:
        await delete_all(js, settings)
        await nc.close()
