"""What a create asks for, decided without I/O: the E2B request body, the template row it
names, the caller and the API's settings become the `CreateSandbox` command the route
sends (its size and template are what placement then looks for room and warm VMs by),
and the body a 201 answers with.

Kept apart from the route (`api.sandboxes.create_sandbox`) so that every rule of E2B's
create — v1's defaults, the option pairs it refuses, which tokens a sandbox gets — is
tested as a plain function, and so that the body of a create and of its idempotent retry
cannot drift apart: both come from `sandbox_body`.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Mapping
from typing import Any

from api import reads, wire
from api.auth import Caller
from api.context import ApiSettings
from api.errors import ApiError
from domain import sandbox as sb
from domain import tags as tg
from envd.version import ENVD_VERSION

__all__ = [
    "DEFAULT_TIMEOUT_V1",
    "DEFAULT_TIMEOUT_V2",
    "check_timeout",
    "create_ids",
    "create_timeout",
    "plan_create",
    "sandbox_body",
]

DEFAULT_TIMEOUT_V2 = 300
DEFAULT_TIMEOUT_V1 = 15


def check_timeout(timeout: int) -> None:
    policy = sb.DEFAULT_POLICY
    if not policy.min_timeout_s <= timeout <= policy.max_timeout_s:
        raise ApiError(
            400, f"timeout must be between {policy.min_timeout_s} and {policy.max_timeout_s} s"
        )


def create_timeout(data: wire.NewSandbox, *, v1: bool) -> int:
    """The TTL a create asks for (v1's SDKs default to 15 s, v2's to 300 s); 400 if out of
    the policy's bounds."""
    if data.timeout is not None:
        timeout = data.timeout
    else:
        timeout = DEFAULT_TIMEOUT_V1 if v1 else DEFAULT_TIMEOUT_V2
    check_timeout(timeout)
    return timeout


def create_ids(caller: Caller, idempotency_key: str | None) -> tuple[str, uuid.UUID]:
    """Sandbox and command ids; derived from the client's Idempotency-Key when it sent one,
    so a retried create lands on the same sandbox."""
    if not idempotency_key:
        return sb.new_sandbox_id(), uuid.uuid4()
    seed = f"{caller.key_id}|{idempotency_key}"
    sid = sb.derived_sandbox_id(seed)
    return sid, sb.derived_command_id("create", seed)


def plan_create(
    data: wire.NewSandbox,
    tpl: Mapping[str, Any],
    caller: Caller,
    settings: ApiSettings,
    *,
    v1: bool,
    sandbox_id: str,
    command_id: uuid.UUID,
) -> sb.CreateSandbox:
    """The create `data` asks for from `tpl` (a `reads.template_for` row), with no volume
    mounts yet: resolving them waits on and releases volumes, so the request's own
    mistakes (400) are found here first. Fresh access tokens each call."""
    if data.auto_pause is None:
        on_timeout = settings.default_on_timeout
    else:
        on_timeout = "pause" if data.auto_pause else "kill"
    auto_resume = bool(data.auto_resume and data.auto_resume.enabled)
    if auto_resume and data.auto_pause_memory is False:
        # traffic cannot wake a cold boot transparently: E2B refuses the pair too
        raise ApiError(400, "autoResume cannot be combined with autoPauseMemory false")
    secure = True if not v1 else bool(data.secure)
    net = data.network or wire.NetworkConfig()
    public = True if net.allow_public_traffic is None else net.allow_public_traffic
    return sb.CreateSandbox(
        sandbox_id=sandbox_id,
        command_id=command_id,
        template_id=tpl["template_id"],
        alias=tpl["alias"],
        team_id=caller.team_id,
        api_key_id=caller.key_id,
        cpu_count=tpl["cpu_count"],
        memory_mb=tpl["memory_mb"],
        disk_size_mb=tpl["disk_size_mb"],
        envd_version=tpl["envd_version"] or ENVD_VERSION,
        envd_access_token=secrets.token_urlsafe(24) if secure else None,
        traffic_access_token=None if public else secrets.token_urlsafe(24),
        timeout_s=create_timeout(data, v1=v1),
        metadata=data.metadata,
        env_vars=data.env_vars,
        lifecycle=sb.Lifecycle(
            on_timeout=on_timeout,
            auto_resume=auto_resume,
            pause_memory=data.auto_pause_memory is not False,
        ),
        network=sb.NetworkPolicy(
            allow_internet_access=(
                True if data.allow_internet_access is None else data.allow_internet_access
            ),
            allow_public_traffic=public,
            allow_out=tuple(net.allow_out),
            deny_out=tuple(net.deny_out),
        ),
    )


def sandbox_body(s: sb.Sandbox | sb.CreateSandbox, domain: str | None) -> dict[str, Any]:
    """The body of create, connect and resume (E2B's `Sandbox`): of the sandbox as the log
    has it, or of the create just answered (its tokens are the ones it was sent with)."""
    return wire.dump(
        wire.Sandbox(
            template_id=tg.shown_template(s.template_id, s.alias),
            sandbox_id=s.sandbox_id,
            client_id=reads.CLIENT_ID,
            envd_version=s.envd_version,
            alias=s.alias,
            envd_access_token=s.envd_access_token,
            traffic_access_token=s.traffic_access_token,
            domain=domain,
        )
    )
