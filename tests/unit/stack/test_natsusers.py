"""nats.conf with least-privilege users: what each may publish and subscribe to."""

from __future__ import annotations

import json
import re
from pathlib import Path

from aenv.stack.natsusers import add_user, load_users, render_config, write_config
from bus.permissions import auditor_permissions, pipeline_permissions
from bus.subjects import Names


def test_a_pipeline_user_gets_its_team_only() -> None:
    names = Names("p")
    perms = pipeline_permissions(names, "a")
    pub = perms["publish"]["allow"]
    assert "p.aenv.in.a.>" in pub
    # every JetStream API subject it may use names its own stream
    js = [s for s in pub if s.startswith("$JS.")]
    assert js and all("P_AENV_TEAM_a" in s for s in js)
    assert not any(names.event_stream in s or names.command_stream in s for s in pub)
    assert not any(s.startswith("p.aenv.cmd") or s.startswith("p.aenv.evt") for s in pub)
    assert perms["subscribe"]["allow"] == ["_INBOX.p.aenv.a.>"]


def test_the_auditor_reads_the_feed_only() -> None:
    perms = auditor_permissions(Names(""))
    pub = perms["publish"]["allow"]
    assert all(s.startswith("$JS.") and "AENV_FEED" in s for s in pub)
    assert perms["subscribe"]["allow"] == ["_INBOX.aenv-auditor.>"]


def test_users_are_kept_and_rendered(tmp_path: Path) -> None:
    a = add_user(tmp_path, "a")
    auditor = add_user(tmp_path, None)
    assert [u.role for u in load_users(tmp_path)] == ["pipeline", "auditor"]
    assert (tmp_path / "users.json").stat().st_mode & 0o777 == 0o600
    conf = write_config(tmp_path, "aenv", "pw", "p").read_text()
    assert (tmp_path / "nats.conf").stat().st_mode & 0o777 == 0o600
    assert a.user in conf and a.password in conf and auditor.user in conf
    # the stack's own user has no permissions block: every right
    first = re.search(r"\{user: \"aenv\", password: \"pw\"\}", conf)
    assert first is not None
    # a rewrite without a prefix keeps the one saved at start
    assert write_config(tmp_path, "aenv", "pw").read_text() == conf
    body = conf[conf.index("[") : conf.rindex("]") + 1]
    assert '"p.aenv.in.a.>"' in body and json.dumps("$JS.API.STREAM.INFO.P_AENV_FEED") in body


def test_an_empty_stack_has_only_its_user() -> None:
    conf = render_config("aenv", "pw", "", [])
    assert conf.count("user:") == 1 and "permissions" not in conf
