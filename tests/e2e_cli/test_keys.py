"""`aenv keys` against a real stack: a minted key works at once, `ls` shows it (never the key
itself), and once `aenv keys revoke` returns the API refuses it within the key cache's TTL."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from api.auth import CACHE_S
from tests.e2e_cli.conftest import CliStack, run_aenv
from tests.support import eventually_sync

pytestmark = pytest.mark.vm


def _list(stack: CliStack, *args: str) -> dict[str, dict[str, object]]:
    r = run_aenv("keys", "ls", "--data-dir", str(stack.data_dir), *args, env=stack.bare_env())
    assert r.returncode == 0, r.stderr.decode()
    return {row["key_id"]: row for row in json.loads(r.stdout)}


def test_create_list_revoke_then_the_api_refuses_the_key(cli_stack: CliStack) -> None:
    d = ("--data-dir", str(cli_stack.data_dir))
    env = cli_stack.bare_env()
    r = run_aenv("keys", "create", "--name", "ci-bot", "--team", "t-cli", *d, env=env)
    assert r.returncode == 0, r.stderr.decode()
    key = r.stdout.decode().strip()
    api = httpx.Client(base_url=cli_stack.api_url, headers={"X-API-KEY": key}, timeout=10)
    assert api.get("/sandboxes").status_code == 200  # usable as soon as `create` returned

    rows = _list(cli_stack, "--team", "t-cli")
    (key_id, row), *others = rows.items()
    assert not others and row["name"] == "ci-bot" and row["team"] == "t-cli"
    assert key.startswith(str(row["prefix"])) and len(str(row["prefix"])) < len(key) // 2
    assert row["revoked_at"] is None and row["created_at"]
    everyone = run_aenv("keys", "ls", *d, env=env)
    assert key not in everyone.stdout.decode() and key_id in _list(cli_stack)
    assert cli_stack.api_key not in everyone.stdout.decode()
    table = run_aenv("keys", "ls", "-o", "table", *d, env=cli_stack.bare_env(COLUMNS="200"))
    header, *lines = table.stdout.decode().splitlines()
    assert header.split() == [
        "KEY", "ID", "NAME", "TEAM", "PREFIX", "CREATED", "REVOKED", "LIMITS"
    ]  # fmt: skip
    assert any(ln.split()[0] == key_id and ln.split()[-2:] == ["-", "-"] for ln in lines)

    r = run_aenv("keys", "revoke", key_id, *d, env=env)
    assert r.returncode == 0, r.stderr.decode()
    revoked = time.monotonic()
    eventually_sync(lambda: api.get("/sandboxes").status_code == 401, timeout=CACHE_S + 1)
    took = time.monotonic() - revoked
    assert _list(cli_stack, "--team", "t-cli")[key_id]["revoked_at"] is not None
    assert (
        httpx.get(
            f"{cli_stack.api_url}/sandboxes", headers={"X-API-KEY": cli_stack.api_key}
        ).status_code
        == 200
    )
    print(f"revoked key refused {took:.2f}s after `aenv keys revoke` returned")

    again = run_aenv("keys", "revoke", key_id, *d, env=env)
    assert again.returncode == 0, again.stderr.decode()  # already revoked: no-op
    r = run_aenv("keys", "revoke", "no-such-key", *d, env=env)
    assert r.returncode == 1 and r.stderr.decode().startswith("aenv: ")
    assert r.stderr.count(b"\n") == 1 and b"Traceback" not in r.stderr
