"""Create's planning with no services (`api.creates`): an E2B request body and the template
row it names become the `CreateSandbox` the route sends, and the 201 body of a create and
of its idempotent retry (the sandbox as the log folds it) are the same JSON."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from api import wire
from api.auth import Caller
from api.context import ApiSettings
from api.creates import create_ids, create_timeout, plan_create, sandbox_body
from api.errors import ApiError
from domain import sandbox as sb
from envd.version import ENVD_VERSION

CALLER = Caller(key_id="key1", team_id="team1")
SID = sb.new_sandbox_id()
CID = uuid.UUID(int=7)
TPL: dict[str, Any] = {
    "template_id": "tpl123",
    "alias": "base",
    "cpu_count": 4,
    "memory_mb": 1024,
    "disk_size_mb": 4096,
    "envd_version": "0.2.0",
}


def _body(**fields: Any) -> wire.NewSandbox:
    return wire.NewSandbox.model_validate({"templateID": "base", **fields})


def _plan(
    body: wire.NewSandbox,
    *,
    v1: bool = False,
    tpl: dict[str, Any] = TPL,
    settings: ApiSettings | None = None,
) -> sb.CreateSandbox:
    return plan_create(
        body,
        tpl,
        CALLER,
        settings or ApiSettings(default_on_timeout="pause"),
        v1=v1,
        sandbox_id=SID,
        command_id=CID,
    )


def test_the_command_carries_the_template_row_and_the_caller() -> None:
    cmd = _plan(_body(metadata={"a": "b"}, envVars={"X": "1"}))
    assert (cmd.sandbox_id, cmd.command_id) == (SID, CID)
    assert (cmd.template_id, cmd.alias) == ("tpl123", "base")
    assert (cmd.cpu_count, cmd.memory_mb, cmd.disk_size_mb) == (4, 1024, 4096)
    assert (cmd.team_id, cmd.api_key_id) == ("team1", "key1")
    assert (cmd.metadata, cmd.env_vars) == ({"a": "b"}, {"X": "1"})
    assert cmd.envd_version == "0.2.0"
    assert cmd.volume_mounts == () and cmd.warm_on == ()
    # a row of a template built before envd versions were recorded: this host's
    assert _plan(_body(), tpl={**TPL, "envd_version": None}).envd_version == ENVD_VERSION


def test_v1_and_v2_default_the_timeout_and_the_envd_token_differently() -> None:
    v2, v1 = _plan(_body()), _plan(_body(), v1=True)
    assert (v2.timeout_s, v1.timeout_s) == (300, 15)
    assert v2.envd_access_token and v1.envd_access_token is None
    assert _plan(_body(secure=True), v1=True).envd_access_token
    assert _plan(_body(timeout=60)).timeout_s == 60
    assert create_timeout(_body(), v1=True) == 15


@pytest.mark.parametrize("timeout", [0, 10**9])
def test_a_timeout_out_of_bounds_is_a_400(timeout: int) -> None:
    with pytest.raises(ApiError) as e:
        create_timeout(_body(timeout=timeout), v1=False)
    assert e.value.status == 400
    with pytest.raises(ApiError):
        _plan(_body(timeout=timeout))


def test_auto_pause_maps_to_the_timeout_action() -> None:
    assert _plan(_body()).lifecycle.on_timeout == "pause"  # the API's default
    kill_by_default = ApiSettings(default_on_timeout="kill")
    assert _plan(_body(), settings=kill_by_default).lifecycle.on_timeout == "kill"
    assert _plan(_body(autoPause=True), settings=kill_by_default).lifecycle.on_timeout == "pause"
    assert _plan(_body(autoPause=False)).lifecycle.on_timeout == "kill"
    plain = _plan(_body()).lifecycle
    assert plain.pause_memory and not plain.auto_resume
    assert not _plan(_body(autoPauseMemory=False)).lifecycle.pause_memory
    assert _plan(_body(autoResume={"enabled": True})).lifecycle.auto_resume


def test_auto_resume_with_a_cold_pause_is_refused() -> None:
    with pytest.raises(ApiError) as e:
        _plan(_body(autoResume={"enabled": True}, autoPauseMemory=False))
    assert e.value.status == 400


def test_the_network_policy_and_the_traffic_token() -> None:
    open_ = _plan(_body())
    assert open_.network.allow_internet_access and open_.network.allow_public_traffic
    assert open_.traffic_access_token is None
    closed = _plan(
        _body(
            allow_internet_access=False,
            network={
                "allowPublicTraffic": False,
                "allowOut": ["1.1.1.1"],
                "denyOut": ["0.0.0.0/0"],
            },
        )
    )
    assert not closed.network.allow_internet_access
    assert not closed.network.allow_public_traffic and closed.traffic_access_token
    assert (closed.network.allow_out, closed.network.deny_out) == (("1.1.1.1",), ("0.0.0.0/0",))


def test_ids_derive_from_the_idempotency_key_per_caller() -> None:
    assert create_ids(CALLER, "k") == create_ids(CALLER, "k")
    assert create_ids(CALLER, "k") != create_ids(Caller(key_id="key2", team_id="team1"), "k")
    assert create_ids(CALLER, None) != create_ids(CALLER, None)


def test_a_create_and_its_retry_answer_the_same_body() -> None:
    cmd = _plan(_body(network={"allowPublicTraffic": False}))
    requested = sb.fold(sb.decide(None, cmd))
    state = sb.fold(
        sb.decide(requested, sb.CompleteCreate(sandbox_id=SID, node_id="n1")), requested
    )
    assert isinstance(state, sb.Sandbox) and state.status is sb.SandboxStatus.RUNNING
    body = sandbox_body(cmd, "aenv.dev")
    assert sandbox_body(state, "aenv.dev") == body
    assert body == {
        "templateID": "tpl123",
        "sandboxID": SID,
        "clientID": body["clientID"],
        "envdVersion": "0.2.0",
        "alias": "base",
        "envdAccessToken": cmd.envd_access_token,
        "trafficAccessToken": cmd.traffic_access_token,
        "domain": "aenv.dev",
    }
    assert "domain" not in sandbox_body(cmd, None)  # E2B omits what is not set
