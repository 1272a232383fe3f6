"""Where the CLI finds the API: precedence of flags, variables, credentials and stack.json."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from aenv.config import ConfigError, credentials_path, read_credentials, resolve, write_credentials


@pytest.fixture
def home(tmp_path: Path) -> dict[str, str]:
    return {"HOME": str(tmp_path / "home")}


def _stack(tmp_path: Path, url: str = "http://stack:1", key: str = "e2b_stack") -> Path:
    d = tmp_path / "data"
    d.mkdir()
    (d / "stack.json").write_text(
        json.dumps({"pid": 1, "E2B_API_URL": url, "E2B_SANDBOX_URL": url, "E2B_API_KEY": key})
    )
    return d


def test_nothing_configured_names_the_fixes(tmp_path: Path, home: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="aenv auth"):
        resolve(data_dir=tmp_path / "none", env=home)


def test_each_source_overrides_the_ones_below(tmp_path: Path, home: dict[str, str]) -> None:
    data = _stack(tmp_path)
    assert resolve(data_dir=data, env=home).api_url == "http://stack:1"
    write_credentials(credentials_path(home), "http://file:2", "e2b_file")
    c = resolve(data_dir=data, env=home)
    assert (c.api_url, c.api_key, c.sandbox_url) == ("http://file:2", "e2b_file", "http://file:2")
    env = {
        **home,
        "E2B_API_URL": "http://e2b:3",
        "E2B_API_KEY": "e2b_e2b",
        "E2B_SANDBOX_URL": "http://e2bsbx:3",
    }
    c = resolve(data_dir=data, env=env)
    assert (c.api_url, c.sandbox_url, c.api_key) == ("http://e2b:3", "http://e2bsbx:3", "e2b_e2b")
    env |= {"AENV_API_URL": "http://aenv:4/", "AENV_API_KEY": "e2b_aenv"}
    c = resolve(data_dir=data, env=env)
    # an AENV_* URL does not inherit an E2B_SANDBOX_URL meant for another server
    assert (c.api_url, c.sandbox_url, c.api_key) == ("http://aenv:4", "http://aenv:4", "e2b_aenv")
    c = resolve("http://flag:5", "e2b_flag", data_dir=data, env=env)
    assert (c.api_url, c.api_key, c.sources) == ("http://flag:5", "e2b_flag", ("flag", "flag"))


def test_url_and_key_resolve_independently(tmp_path: Path, home: dict[str, str]) -> None:
    data = _stack(tmp_path)
    c = resolve(api_url="http://flag:5", data_dir=data, env=home)
    assert (c.api_url, c.api_key, c.sources) == (
        "http://flag:5",
        "e2b_stack",
        ("flag", "stack.json"),
    )


def test_credentials_are_private(tmp_path: Path, home: dict[str, str]) -> None:
    path = credentials_path(home)
    path.parent.mkdir(parents=True)
    path.write_text("old")
    path.chmod(0o644)
    write_credentials(path, "http://x:1", "e2b_secret")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_credentials(path) == {"api_url": "http://x:1", "api_key": "e2b_secret"}


def test_xdg_config_home_is_honoured(tmp_path: Path) -> None:
    env = {"HOME": "/nowhere", "XDG_CONFIG_HOME": str(tmp_path)}
    assert credentials_path(env) == tmp_path / "aenv" / "credentials"
