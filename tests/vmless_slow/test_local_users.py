"""Another local user (`nobody`) on the machine of a stack with embedded NATS and
Postgres: it reads none of the stack's files and gets no login on its servers — the bus
and the read models hold every sandbox's envd token. The stack itself, operator commands
included, works as before with its non-superuser database login."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.vmless.conftest import vmless_stack

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switches to the user nobody")

EMBEDDED = {"AENV_NATS_URL": "", "AENV_DATABASE_URL": ""}

#: Run as `nobody` by the system's python (the venv's lives in root's home): stdlib only,
#: so it speaks the two login protocols itself. Each check prints what it got.
PROBE = r"""
import json, socket, struct, sys

paths, nats_port, pg_port, pg_socket = json.loads(sys.argv[1])
out = {}
for p in paths:
    try:
        open(p, "rb").read(1)
        out[p] = "read"
    except OSError as e:
        out[p] = type(e).__name__

def nats_login():
    with socket.create_connection(("127.0.0.1", nats_port), timeout=5) as s:
        f = s.makefile("rb")
        f.readline()  # INFO
        s.sendall(b'CONNECT {"verbose":false,"pedantic":false}\r\nPING\r\n')
        return "connected" if f.readline().startswith(b"PONG") else "refused"

def pg_login(family, address, user):
    # a startup message; the answer 'R' + 0 is AuthenticationOk: in without a password
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(address)
        body = struct.pack("!i", 196608) + b"user\0" + user.encode() + b"\0database\0aenv\0\0"
        s.sendall(struct.pack("!i", len(body) + 4) + body)
        head = s.recv(9)
        ok = head[:1] == b"R" and struct.unpack("!i", head[5:9])[0] == 0
        return "connected" if ok else "refused"

checks = {"nats": nats_login}
for user in ("postgres", "aenv"):
    checks[f"pg-tcp-{user}"] = lambda u=user: pg_login(socket.AF_INET, ("127.0.0.1", pg_port), u)
    checks[f"pg-socket-{user}"] = lambda u=user: pg_login(socket.AF_UNIX, pg_socket, u)
for name, check in checks.items():
    try:
        out[name] = check()
    except OSError as e:
        out[name] = type(e).__name__
print(json.dumps(out))
"""


def _as_nobody(args: list[object]) -> dict[str, str]:
    done = subprocess.run(
        ["/usr/bin/python3", "-I", "-c", PROBE, json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=60,
        user="nobody",
        group="nogroup",
        extra_groups=[],
        cwd="/",
    )
    assert done.returncode == 0, done.stderr
    got: dict[str, str] = json.loads(done.stdout)
    return got


def test_another_local_user_reads_no_secret_and_gets_no_login(tmp_path: Path) -> None:
    data = tmp_path / "d"
    for p in [tmp_path, *tmp_path.parents]:  # only the stack's own modes may keep it out
        os.chmod(p, os.stat(p).st_mode | 0o011)
    with vmless_stack(data, **EMBEDDED) as stack:
        info = json.loads((data / "stack.json").read_text())
        nats_port = urlsplit(info["nats_url"]).port
        pg_port = urlsplit(info["database_url"]).port
        secrets = [
            data / "stack.json",
            data / "api-key",
            data / "aenv.log",
            data / "services" / "nats" / "nats.conf",
            data / "services" / "nats" / "credentials.json",
            data / "services" / "nats" / "nats.log",
            data / "services" / "postgres" / "credentials.json",
            data / "services" / "postgres" / "postgres.log",
        ]
        assert all(p.exists() for p in secrets), [p for p in secrets if not p.exists()]
        got = _as_nobody(
            [
                [str(p) for p in secrets],
                nats_port,
                pg_port,
                str(data / "services" / "postgres" / f".s.PGSQL.{pg_port}"),
            ]
        )
        assert {k: v for k, v in got.items() if v in ("read", "connected")} == {}, got
        # and each file on its own, were its dir ever opened up
        loose = {str(p): oct(p.stat().st_mode) for p in secrets if p.stat().st_mode & 0o077}
        assert loose == {}
        # the stack's own login is enough for what operators run against it
        rebuilt = stack.aenv("projections", "rebuild", "--data-dir", str(data), timeout=120)
        assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
        assert "identical" in rebuilt.stdout
