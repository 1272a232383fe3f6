"""Least-privilege pipelines (issue 32) on `aenv up`'s embedded NATS, no VMs: a team's
pipeline user creates and kills its sandboxes through the ingress and reads them from its
own stream; NATS itself refuses it another team's ingress, another team's events and the
raw log (the permissions violations are asserted); a create naming another team in its
body is refused and recorded; the auditor replays the log without envd tokens or env var
values."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import nats
import pytest
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import ConsumerConfig, StreamInfo

import aenv_pipeline
from aenv_pipeline import CommandRefused, Names, Outcome
from aenv_pipeline.wire import command_envelope
from tests.support import eventually
from tests.vmless.conftest import METRICS_TOKEN, VmlessStack, vmless_stack
from tests.vmless.test_example_pipeline import ROOT, check, run_example

VIOLATION = "permissions violation"


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VmlessStack]:
    """A stack with its own NATS (the one whose users `aenv keys pipeline create` adds)."""
    limits = json.dumps({"teamc": {"max_sandboxes": 1}})
    with vmless_stack(
        tmp_path_factory.mktemp("aenv-perm"), AENV_NATS_URL="", AENV_TEAM_LIMITS=limits
    ) as stack:
        yield stack


def _login(stack: VmlessStack, *args: str) -> dict[str, Any]:
    r = stack.aenv("keys", "pipeline", "create", *args, "--data-dir", str(stack.data_dir))
    assert r.returncode == 0, r.stderr
    out: dict[str, Any] = json.loads(r.stdout)
    assert out["reloaded"] is True and out["password"]
    return out


def _service_url(stack: VmlessStack) -> str:
    return str(json.loads((stack.data_dir / "stack.json").read_text())["nats_url"])


async def svc_js(stack: VmlessStack) -> StreamInfo:
    """The event log's state, as the stack's own user sees it."""
    nc = await nats.connect(_service_url(stack))
    try:
        return await nc.jetstream().stream_info(Names(stack.bus_settings.bus_prefix).event_stream)
    finally:
        await nc.close()


class Errors(list[str]):
    async def cb(self, e: Exception) -> None:
        self.append(str(e).lower())

    async def violation(self, what: str) -> str:
        async def seen() -> str | None:
            return next((e for e in self if VIOLATION in e and what in e), None)

        return await eventually(seen, timeout=5)


async def _pipeline(login: dict[str, Any], errors: Errors) -> aenv_pipeline.Pipeline:
    return await aenv_pipeline.connect(
        login["servers"],
        team=login["team"],
        prefix=login["prefix"],
        scoped=True,
        user=login["user"],
        password=login["password"],
        error_cb=errors.cb,
        max_reconnect_attempts=0,
    )


async def test_a_team_pipeline_runs_its_own_and_nats_refuses_it_the_rest(
    embedded: VmlessStack,
) -> None:
    a_login = _login(embedded, "--team", "default")
    b_login = _login(embedded, "--team", "teamb")
    a_errors, b_errors = Errors(), Errors()
    a = await _pipeline(a_login, a_errors)
    b = await _pipeline(b_login, b_errors)
    try:
        # its own team: a create through the ingress runs (memory node), read back from
        # its stream, and a kill of it too
        out = await a.create_sandbox("base", timeout_s=120, metadata={"run": "perm"}, wait=30)
        assert isinstance(out, Outcome) and out.event.type == "SandboxCreated"
        sid = out.sandbox_id
        with httpx.Client(
            base_url=embedded.api_url, headers={"X-API-KEY": embedded.api_key}, timeout=30
        ) as c:
            body = c.get(f"/sandboxes/{sid}").json()
        assert body["state"] == "running" and body["metadata"]["run"] == "perm"
        assert [e.type async for e in a.replay(sandbox=sid)][:2] == [
            "SandboxRequested",
            "SandboxCreated",
        ]
        assert a.names.team_stream("default") == a_login["stream"]

        # team B: its pipeline does not see A's sandbox; sent anyway, the ingress refuses
        with pytest.raises(LookupError):
            await b.kill(sid)
        env = command_envelope("KillSandbox", sid, {}, actor="pipeline:teamb")
        reply = await b.nc.request(
            b.names.ingress("teamb", "kill"), env.model_dump_json().encode(), timeout=10
        )
        assert json.loads(reply.data)["code"] == "not_found"

        # B publishing to A's ingress: NATS refuses it
        with pytest.raises((NatsTimeoutError, NoRespondersError)):
            await b.nc.request(
                b.names.ingress("default", "create"), env.model_dump_json().encode(), timeout=1
            )
        await b_errors.violation(f'publish to "{b.names.ingress("default", "create")}"')

        # a consumer of A's own stream delivering elsewhere (NATS lets its creator name any
        # subject): not to the JetStream API, not into B's ingress as a command
        before = (await svc_js(embedded)).state.messages
        for target in (
            f"$JS.API.STREAM.PURGE.{a.names.event_stream}",
            b.names.ingress("teamb", "create"),
        ):
            await a.js.add_consumer(
                a.names.team_stream("default"), ConsumerConfig(deliver_subject=target)
            )
        await asyncio.sleep(1)
        assert (await svc_js(embedded)).state.messages >= before
        assert [e async for e in b.replay()] == []

        # B reading A's events, from A's stream or the raw log: refused
        for stream in (a.names.team_stream("default"), b.names.event_stream, b.names.feed_stream):
            with pytest.raises(NatsTimeoutError):  # the request goes nowhere
                await b.nc.jetstream(timeout=1).stream_info(stream)
            await b_errors.violation(stream.lower())
        await b.nc.subscribe(b.names.sandbox_events_all)
        await b_errors.violation("subscription")
        # and B's own stream has nothing of A
        assert await b.history(sid) == []
        assert [e async for e in b.replay()] == []

        killed = await a.kill(sid)
        assert killed is not None and killed.event.type == "SandboxKilled"
    finally:
        await a.close()
        await b.close()


async def test_a_forged_team_is_refused_and_recorded(embedded: VmlessStack) -> None:
    login = _login(embedded, "--team", "default")
    a = await _pipeline(login, Errors())
    svc = await nats.connect(_service_url(embedded))
    try:
        sid = uuid.uuid4().hex[:20]
        env = command_envelope(
            "CreateSandbox", sid, {"template_id": "base", "team_id": "teamb"}, actor="x"
        )
        reply = await a.nc.request(
            a.names.ingress("default", "create"), env.model_dump_json().encode(), timeout=10
        )
        body = json.loads(reply.data)
        assert (body["ok"], body["code"]) == (False, "forbidden")

        async def recorded() -> dict[str, Any]:
            raw = await svc.jetstream().get_last_msg(
                a.names.event_stream, a.names.sandbox_events(sid)
            )
            return dict(json.loads(raw.data))

        rejected = await eventually(recorded)
        assert rejected["type"] == "CommandRejected"
        assert rejected["payload"]["code"] == "forbidden"
        assert rejected["actor"] == "pipeline:default"  # the ingress's word, not the body's
    finally:
        await a.close()
        await svc.close()


async def test_the_auditor_replays_without_secrets(embedded: VmlessStack) -> None:
    login = _login(embedded, "--auditor")
    errors = Errors()
    auditor = await aenv_pipeline.connect(
        login["servers"],
        team=None,
        prefix=login["prefix"],
        scoped=True,
        user=login["user"],
        password=login["password"],
        error_cb=errors.cb,
    )
    svc = await nats.connect(_service_url(embedded))
    try:
        with httpx.Client(
            base_url=embedded.api_url, headers={"X-API-KEY": embedded.api_key}, timeout=30
        ) as c:
            r = c.post(
                "/sandboxes",
                json={"templateID": "base", "secure": True, "envVars": {"API_TOKEN": "s3cret"}},
            )
            assert r.status_code == 201, r.text
            sid, token = r.json()["sandboxID"], r.json()["envdAccessToken"]
        assert token
        raw = await svc.jetstream().get_msg(
            auditor.names.event_stream, seq=1, subject=auditor.names.sandbox_events(sid), next=True
        )
        assert token.encode() in (raw.data or b"")  # the log has it; the auditor must not

        async def audited() -> list[Any]:
            events = [e async for e in auditor.replay(sandbox=sid)]
            return events if len(events) >= 2 else []

        events = await eventually(audited, timeout=15)
        assert [e.type for e in events][:2] == ["SandboxRequested", "SandboxCreated"]
        spec = events[0].payload["spec"]
        assert spec["envd_access_token"] is None
        assert spec["env_vars"] == {"API_TOKEN": "<redacted>"}
        assert spec["team_id"] == "default"
        for e in events:
            assert token not in e.envelope.model_dump_json()
            assert "s3cret" not in e.envelope.model_dump_json()

        # the feed's lag is a series of the API (0: every stored event copied)
        prefix = embedded.bus_settings.bus_prefix
        series = (
            f'aenv_jetstream_consumer_pending{{consumer="{prefix}_feed",'
            f'stream="{prefix.upper()}_AENV_EVT"}} 0.0'
        )

        def caught_up() -> bool:
            r = httpx.get(
                f"{embedded.api_url}/metrics",
                headers={"Authorization": f"Bearer {METRICS_TOKEN}"},
                timeout=10,
            )
            return series in r.text

        await eventually(lambda: asyncio.to_thread(caught_up))

        # read-only: no commands, no raw log
        with pytest.raises(PermissionError):
            await auditor.create_sandbox("base")
        await auditor.nc.publish(auditor.names.place_command("create"), b"{}")
        await errors.violation("publish")
        with pytest.raises(NatsTimeoutError):
            await auditor.nc.jetstream(timeout=1).stream_info(auditor.names.event_stream)
        await errors.violation(auditor.names.event_stream.lower())
        await asyncio.sleep(0)
    finally:
        await auditor.close()
        await svc.close()


async def test_the_ingress_applies_admission_and_the_lease_check(embedded: VmlessStack) -> None:
    p = await _pipeline(_login(embedded, "--team", "teamc"), Errors())
    try:
        with pytest.raises(CommandRefused) as no_lease:
            await p.create_sandbox("base", metadata={"aenv.lease": "lease-nosuch"})
        assert no_lease.value.code == "invalid" and "no lease" in no_lease.value.message
        first = await p.create_sandbox("base", wait=30)  # teamc may run one
        with pytest.raises(CommandRefused) as over:
            await p.create_sandbox("base", wait=30)
        assert over.value.code == "rate_limited" and over.value.retry_after_s
        await p.kill(first.sandbox_id)
    finally:
        with contextlib.suppress(Exception):
            await p.close()


async def test_a_revoked_pipeline_user_is_cut_off(embedded: VmlessStack) -> None:
    login = _login(embedded, "--team", "teamd")
    closed = asyncio.Event()

    async def on_closed() -> None:
        closed.set()

    p = await aenv_pipeline.connect(
        login["servers"],
        team="teamd",
        prefix=login["prefix"],
        scoped=True,
        user=login["user"],
        password=login["password"],
        disconnected_cb=on_closed,
        allow_reconnect=False,
    )
    try:
        assert [e async for e in p.replay()] == []  # it works
        r = embedded.aenv(
            "keys", "pipeline", "revoke", login["user"], "--data-dir", str(embedded.data_dir)
        )
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == {"revoked": login["user"], "reloaded": True}
        await asyncio.wait_for(closed.wait(), 10)  # the reload closed its connection
        with pytest.raises(Exception, match=r"(?i)authorization"):
            await nats.connect(
                login["servers"],
                user=login["user"],
                password=login["password"],
                max_reconnect_attempts=0,
                allow_reconnect=False,
            )
        again = embedded.aenv(
            "keys", "pipeline", "revoke", login["user"], "--data-dir", str(embedded.data_dir)
        )
        assert again.returncode == 1 and "no pipeline user" in again.stderr
    finally:
        with contextlib.suppress(Exception):
            await p.close()


def test_the_pipeline_example_runs_with_a_scoped_login(embedded: VmlessStack) -> None:
    login = _login(embedded, "--team", "default")
    out = run_example(
        embedded,
        sys.executable,
        2,
        PYTHONPATH=str(ROOT),
        AENV_NATS_URL=login["servers"],
        AENV_NATS_USER=login["user"],
        AENV_NATS_PASSWORD=login["password"],
    )
    check(out, 2)
