"""The ids a route's path may name, checked before they reach the bus or the database.

An id is also a NATS subject token (`aenv.evt.sandbox.<id>`), so one with a `.`, `*`, `>`
or a space would make the bus refuse the subject (a 500). Such an id names nothing we could
have stored, so the answer is the one E2B gives for any unknown id: 404 for sandboxes and
templates (`Sandbox.kill(id)` then returns False, as it does for a sandbox that is gone),
400 for a build id that is not a UUID (E2B parses build ids as UUIDs).
"""

from __future__ import annotations

import re

from api.errors import ApiError

__all__ = ["build_id", "is_sandbox_id", "is_template_ref", "short_path"]

#: `domain.sandbox.values.SandboxId`: infra's alphabet, at most a DNS label long.
_SANDBOX_ID = re.compile(r"^[a-z0-9]{1,63}$")
#: Template names (`domain.build.valid_template_name`) and snapshot names (`name:tag`),
#: less the `.` a subject token cannot hold.
_TEMPLATE_REF = re.compile(r"^[a-z0-9][a-z0-9_:-]{0,127}$")
#: a control-plane path naming a sandbox `{sandboxID}-{clientID}`, as early e2b 1.x SDKs
#: (1.3.3) do in every route: `/sandboxes/{id}-{client}…`, `/v2/sandboxes/{id}-{client}…`
_CLIENT_SUFFIXED = re.compile(r"^(/(?:v\d+/)?sandboxes/[a-z0-9]{1,63})-[a-z0-9]{1,63}(?=/|$)")
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def is_sandbox_id(raw: str) -> bool:
    return bool(_SANDBOX_ID.match(raw))


def is_template_ref(raw: str) -> bool:
    """Whether `raw` could name a template or snapshot in the event log."""
    return bool(_TEMPLATE_REF.match(raw))


def short_path(path: str) -> str:
    """`path` with a client id cut from the sandbox id it names, as E2B's API cuts every
    route's id to the part before its first `-` (infra `utils.ShortID`): e2b 1.3.3 builds
    its sandbox id as `{sandboxID}-{clientID}` from the create answer and sends that back
    (kill, timeout, get). A sandbox id holds no `-`, so no path that names one changes."""
    return _CLIENT_SUFFIXED.sub(r"\1", path, count=1)


def build_id(raw: str) -> str:
    """`raw` if it is a build id (a lowercase UUID, as `POST /v3/templates` hands out)."""
    if not _UUID.match(raw):
        raise ApiError(400, f"invalid build id {raw!r}: build ids are UUIDs")
    return raw
