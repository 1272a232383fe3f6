"""The stack's passwords: minted once, kept, owner-only; the text and SQL they go into."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from aenv.stack.auth import hardened_hba, is_hardened, role_sql
from aenv.stack.secrets_file import load_or_mint


def test_passwords_are_minted_once_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "credentials.json"
    first = load_or_mint(path, ("postgres", "aenv"))
    assert first["postgres"] != first["aenv"] and len(first["aenv"]) == 48
    assert load_or_mint(path, ("postgres", "aenv")) == first
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_missing_or_unusable_password_is_minted_and_a_loose_file_closed(tmp_path: Path) -> None:
    path = tmp_path / "credentials.json"
    path.write_text(json.dumps({"postgres": "ab12", "aenv": "x'; DROP ROLE postgres; --"}))
    path.chmod(0o644)
    got = load_or_mint(path, ("postgres", "aenv"))
    assert got["postgres"] == "ab12"
    assert got["aenv"] != "x'; DROP ROLE postgres; --" and all(
        c in "0123456789abcdef" for c in got["aenv"]
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == got


def test_only_the_final_pg_hba_counts_as_hardened() -> None:
    assert is_hardened(hardened_hba())
    assert not is_hardened("host all all 127.0.0.1/32 trust\n")
    assert "trust" not in hardened_hba()


def test_the_app_role_gets_no_more_rights_and_only_hex_passwords() -> None:
    sql = role_sql(False, "abc123")
    assert sql.startswith("CREATE ROLE aenv ")
    for right in ("NOSUPERUSER", "NOCREATEDB", "NOCREATEROLE", "NOBYPASSRLS"):
        assert right in sql
    assert role_sql(True, "abc123").startswith("ALTER ROLE aenv ")
    with pytest.raises(ValueError):
        role_sql(True, "abc'")
