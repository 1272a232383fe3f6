"""`aenv status` names what is down: a role that is not ready, the API's failed checks."""

from __future__ import annotations

from aenv.ops.health import stack_problems

READY = {"status": "ok", "checks": {"nats": "ok"}}


def test_a_ready_stack_has_no_problems() -> None:
    info = {"role_status": {"api": {"state": "ready"}, "node": {"state": "ready"}}}
    assert stack_problems(info, READY) == []


def test_a_restarting_role_and_a_failed_check_are_named() -> None:
    info = {
        "role_status": {
            "api": {"state": "restarting", "restarts": 4, "last_exit": 3},
            "node": {"state": "ready"},
        }
    }
    ready = {"code": 503, "message": "not ready: s3: ConnectError"}
    assert stack_problems(info, ready) == [
        "role api is restarting (4 restarts, last exit 3)",
        "not ready: s3: ConnectError",
    ]


def test_a_warning_of_a_ready_api_is_a_problem_too() -> None:
    ready = {**READY, "warnings": {"uploads": "2 captures waiting for upload, oldest 9 s"}}
    assert stack_problems({}, ready) == ["uploads: 2 captures waiting for upload, oldest 9 s"]
