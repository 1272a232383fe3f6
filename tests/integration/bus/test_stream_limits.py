"""The streams' limits and their fill against a real JetStream (issue 30): streams an older
version made take the limits at the next start; a log at its limit refuses the append
(never drops history) and the scrape reads it full. A role start never changes limits aenv
set: a role whose settings differ refuses to start naming both values (`LimitsMismatch`),
and only the operator's `set_limits` (`aenv log limits set`) changes them."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import nats
import pytest
from nats.js.api import DiscardPolicy, RetentionPolicy, StreamConfig
from nats.js.errors import APIError
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from aenv.cli import app
from aenv.serve import EXIT_CONFIG
from bus import Bus, BusSettings, LimitsMismatch, delete_all
from bus.setup import ensure_streams, limits_set, set_limits
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
        assert limits_set(cmd)  # taken once: from now on a role start that differs refuses
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

        # the limit lifted, by the operator (a role start would refuse)
        await set_limits(js, settings, {"AENV_EVENT_MAX_MSGS": 0})
        text = await scrape.render()
        assert names.event_stream not in _samples(text, "aenv_jetstream_stream_fill_ratio")
    finally:
        await delete_all(js, settings)
        await nc.close()


async def test_a_role_with_other_limits_refuses_and_only_the_operator_changes_them() -> None:
    """One env file with other AENV_EVENT_MAX_BYTES, AENV_EVENT_MAX_MSGS or
    AENV_COMMAND_MAX_MSGS must not change the fleet's streams: the role refuses, naming
    both values, and the streams stay as they were; `set_limits` changes them, after which
    roles with the new values start."""
    fleet = BusSettings(
        nats_url=NATS_URL, bus_prefix=f"t{secrets.token_hex(4)}", event_max_msgs=1000
    )
    names = Names(fleet.bus_prefix)
    bus = await Bus.connect(fleet, name="aenv-fleet", retry=False)
    try:
        evt = (await bus.js.stream_info(names.event_stream)).config
        assert evt.max_msgs == 1000 and limits_set(evt)
        for other in (
            {"event_max_msgs": 0},  # a node's env file without the setting
            {"event_max_bytes": 1 << 30},
            {"command_max_msgs": 10},
        ):
            stray = fleet.model_copy(update=other)
            with pytest.raises(LimitsMismatch) as refused:
                await Bus.connect(stray, name="aenv-stray", retry=False)
            assert "this role asks for" in str(refused.value)
        with pytest.raises(LimitsMismatch) as refused:
            await Bus.connect(fleet.model_copy(update={"event_max_msgs": 0}), retry=False)
        assert (
            f"stream {names.event_stream} has limits AENV_EVENT_MAX_BYTES=0 "
            "AENV_EVENT_MAX_MSGS=1000, this role asks for AENV_EVENT_MAX_BYTES=0 "
            "AENV_EVENT_MAX_MSGS=0 (0: none): set AENV_EVENT_MAX_BYTES=0 AENV_EVENT_MAX_MSGS=1000"
        ) in str(refused.value)
        assert "aenv log limits set --event-max-bytes 0 --event-max-msgs 0" in str(refused.value)
        evt = (await bus.js.stream_info(names.event_stream)).config
        cmd = (await bus.js.stream_info(names.command_stream)).config
        assert (evt.max_msgs, evt.max_bytes, cmd.max_msgs) == (1000, -1, 1_000_000)

        after = await set_limits(bus.js, fleet, {"AENV_EVENT_MAX_MSGS": 0})
        assert after[names.event_stream] == {"AENV_EVENT_MAX_BYTES": 0, "AENV_EVENT_MAX_MSGS": 0}
        assert after[names.command_stream] == {"AENV_COMMAND_MAX_MSGS": 1_000_000}
        lifted = fleet.model_copy(update={"event_max_msgs": 0})
        role = await Bus.connect(lifted, name="aenv-lifted", retry=False)  # agrees: starts
        await role.close()
        with pytest.raises(LimitsMismatch):  # and the old value is now the stray one
            await Bus.connect(fleet, name="aenv-old", retry=False)
        assert (await bus.js.stream_info(names.event_stream)).config.max_msgs == -1
    finally:
        await delete_all(bus.js, fleet)
        await bus.close()


def _aenv(args: list[str], prefix: str) -> tuple[int, str]:
    """`aenv …` as an operator types it (in a thread: the command runs its own loop)."""
    result = CliRunner().invoke(
        app, [*args, "--nats-url", NATS_URL], env={"AENV_BUS_PREFIX": prefix}
    )
    return result.exit_code, result.output


async def test_a_role_process_exits_78_and_the_operator_command_changes_the_limits(
    tmp_path: Path,
) -> None:
    """As deployed: a node role whose env file has other limits exits `EXIT_CONFIG` (78,
    which systemd's RestartPreventExitStatus does not restart) with one line naming both
    values, before it runs anything; `aenv log limits set` changes them, `show` says so."""
    fleet = BusSettings(
        nats_url=NATS_URL, bus_prefix=f"t{secrets.token_hex(4)}", command_max_msgs=500
    )
    names = Names(fleet.bus_prefix)
    bus = await Bus.connect(fleet, name="aenv-fleet", retry=False)
    try:
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("AENV_")},
            "AENV_NATS_URL": NATS_URL,
            "AENV_BUS_PREFIX": fleet.bus_prefix,
            "AENV_DATA_DIR": str(tmp_path / "data"),
            "AENV_WARM_POOL_MIB": "0",  # (were it to start after all: no VM of its own)
        }
        role = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "aenv.serve", "node"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert role.returncode == EXIT_CONFIG, role.stdout[-2000:] + role.stderr[-2000:]
        said = role.stdout + role.stderr
        assert "refusing to start: stream" in said
        assert "AENV_COMMAND_MAX_MSGS=500, this role asks for AENV_COMMAND_MAX_MSGS=1000000" in said
        assert (await bus.js.stream_info(names.command_stream)).config.max_msgs == 500

        code, out = await asyncio.to_thread(
            _aenv, ["log", "limits", "set", "--command-max-msgs", "1000000"], fleet.bus_prefix
        )
        assert code == 0, out
        assert json.loads(out)[names.command_stream] == {"AENV_COMMAND_MAX_MSGS": 1_000_000}
        code, out = await asyncio.to_thread(_aenv, ["log", "limits", "show"], fleet.bus_prefix)
        assert code == 0, out
        assert json.loads(out) == {
            names.event_stream: {"AENV_EVENT_MAX_BYTES": 0, "AENV_EVENT_MAX_MSGS": 0},
            names.command_stream: {"AENV_COMMAND_MAX_MSGS": 1_000_000},
        }
        agreeing = await Bus.connect(  # the node's env file agrees now
            BusSettings(nats_url=NATS_URL, bus_prefix=fleet.bus_prefix), retry=False
        )
        await agreeing.close()
    finally:
        await delete_all(bus.js, fleet)
        await bus.close()
