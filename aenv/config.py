"""Where the sandbox-facing CLI finds the aenv API and its key.

Each value is taken from the first source that has it, so a one-off override never needs
the others cleared: explicit flags > `AENV_API_URL`/`AENV_API_KEY` > `E2B_API_URL`/
`E2B_API_KEY` (what `aenv up` prints) > the credentials file written by `aenv auth` > the
`stack.json` of a stack running under `--data-dir`. aenv's proxy serves envd on the API's own
address, so the sandbox URL is the API URL unless `E2B_SANDBOX_URL` says otherwise.
"""

from __future__ import annotations

import configparser
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the SDK is imported only by the commands that talk to a server
    from e2b.connection_config import ApiParams

__all__ = [
    "DEFAULT_DATA_DIR",
    "ConfigError",
    "Connection",
    "credentials_path",
    "read_credentials",
    "resolve",
    "write_credentials",
]

DEFAULT_DATA_DIR = Path(os.environ.get("AENV_DATA_DIR", "/var/lib/aenv"))
_SECTION = "default"


class ConfigError(Exception):
    """No usable API URL or key: a usage problem (exit 2), not a server one."""


@dataclass(frozen=True)
class Connection:
    """What the e2b SDK needs to reach aenv; `sources` says where each value came from."""

    api_url: str
    api_key: str
    sandbox_url: str
    sources: tuple[str, str]

    def sdk_opts(self) -> ApiParams:
        """Keyword arguments for every SDK call (`ApiParams`), so the process environment
        never has to be mutated."""
        return {"api_url": self.api_url, "api_key": self.api_key, "sandbox_url": self.sandbox_url}


def credentials_path(env: Mapping[str, str] | None = None) -> Path:
    """`$XDG_CONFIG_HOME/aenv/credentials`, i.e. `~/.config/aenv/credentials` by default."""
    env = os.environ if env is None else env
    base = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME", "~")).expanduser() / ".config")
    return Path(base) / "aenv" / "credentials"


def read_credentials(path: Path) -> dict[str, str]:
    """The `[default]` section of the credentials file, or nothing if it is absent/unreadable."""
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path)
    except (OSError, configparser.Error):
        return {}
    return dict(parser[_SECTION]) if parser.has_section(_SECTION) else {}


def write_credentials(path: Path, api_url: str, api_key: str) -> None:
    """Write URL and key readable by the owner only: the file is created 0600 (never
    world-readable, not even for an instant) and its directory 0700."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    parser = configparser.ConfigParser(interpolation=None)
    parser[_SECTION] = {"api_url": api_url, "api_key": api_key}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an older file may have had looser bits
    with os.fdopen(fd, "w") as f:
        parser.write(f)


def _stack_json(data_dir: Path) -> dict[str, str]:
    try:
        info = json.loads((data_dir / "stack.json").read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(info, dict):
        return {}
    return {k: str(v) for k, v in info.items() if k.startswith("E2B_")}


def resolve(
    api_url: str | None = None,
    api_key: str | None = None,
    data_dir: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> Connection:
    """The connection to use, by the precedence in the module docstring.

    Raises `ConfigError` naming how to fix it when no source has a URL or a key.
    """
    env = os.environ if env is None else env
    creds = read_credentials(credentials_path(env))
    stack = _stack_json(data_dir or DEFAULT_DATA_DIR)
    layers: list[tuple[str, str | None, str | None, str | None]] = [
        ("flag", api_url, api_key, None),
        ("AENV_*", env.get("AENV_API_URL"), env.get("AENV_API_KEY"), None),
        ("E2B_*", env.get("E2B_API_URL"), env.get("E2B_API_KEY"), env.get("E2B_SANDBOX_URL")),
        (str(credentials_path(env)), creds.get("api_url"), creds.get("api_key"), None),
        (
            "stack.json",
            stack.get("E2B_API_URL"),
            stack.get("E2B_API_KEY"),
            stack.get("E2B_SANDBOX_URL"),
        ),
    ]
    url = next(((src, u, s) for src, u, _, s in layers if u), None)
    key = next(((src, k) for src, _, k, _ in layers if k), None)
    if url is None or key is None:
        missing = " and ".join(n for n, v in (("API URL", url), ("API key", key)) if v is None)
        raise ConfigError(
            f"no {missing} configured: run `aenv auth`, set AENV_API_URL/"
            "AENV_API_KEY, or start a local stack with `aenv up`"
        )
    url_src, url_val, sandbox_url = url
    url_val = url_val.rstrip("/")
    return Connection(url_val, key[1], (sandbox_url or url_val).rstrip("/"), (url_src, key[0]))
