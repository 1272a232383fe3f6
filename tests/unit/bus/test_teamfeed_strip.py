"""What the feed keeps of an event: everything but access tokens and env var values."""

from __future__ import annotations

import pytest

from bus.errors import InvalidName
from bus.subjects import OTHER_TEAM, Names, pipeline_team, team_token
from bus.teamfeed import REDACTED, strip_secrets


def test_tokens_and_env_values_are_stripped_at_any_depth() -> None:
    env = {
        "type": "SandboxRequested",
        "payload": {
            "spec": {
                "team_id": "a",
                "envd_access_token": "tok",
                "traffic_access_token": "ttok",
                "env_vars": {"KEY": "secret", "OTHER": "x"},
                "metadata": {"run": "r1"},
            },
            "list": [{"envd_access_token": "t2"}],
        },
    }
    out = strip_secrets(env)
    spec = out["payload"]["spec"]
    assert spec["envd_access_token"] is None and spec["traffic_access_token"] is None
    assert spec["env_vars"] == {"KEY": REDACTED, "OTHER": REDACTED}
    assert spec["metadata"] == {"run": "r1"} and spec["team_id"] == "a"
    assert out["payload"]["list"] == [{"envd_access_token": None}]
    assert env["payload"]["spec"]["envd_access_token"] == "tok"  # the input is untouched


def test_team_tokens() -> None:
    assert team_token("team-a_1") == "team-a_1"
    for odd in (None, "has space", "a.b", "x" * 65, ""):
        assert team_token(odd) == OTHER_TEAM
    with pytest.raises(InvalidName):
        pipeline_team("a.b")
    names = Names("t1")
    assert names.feed(team_token("a"), "s.1") == "t1.aenv.feed.a.sandbox.s%2E1"
    assert names.team_stream("a") == "T1_AENV_TEAM_a"
    assert names.ingress("a", "create") == "t1.aenv.in.a.create"
    assert names.parse_ingress("t1.aenv.in.a.create") == ("a", "create")
    for other in ("t1.aenv.feed.a.sandbox.s1", "t1.aenv.in.a", "t1.aenv.in.a.b.c", "aenv.in.a.b"):
        assert names.parse_ingress(other) is None
    assert names.inbox("a") == "_INBOX.t1.aenv.a"
    assert names.inbox(None) == "_INBOX.t1.aenv-auditor"
    # a team named like the auditor's inbox still gets an inbox of its own
    assert not names.inbox("aenv-auditor").startswith(names.inbox(None) + ".")
