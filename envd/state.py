"""envd's mutable runtime configuration, set at start and by `POST /init`."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from envd.preload import Preload
from envd.tails import EndedTable
from envd.users import User, lookup_or_current

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass
class State:
    """What /init may change: the access token, sandbox env vars, defaults for requests."""

    default_user_name: str = "user"
    default_workdir: str | None = None
    access_token: str | None = None
    env_vars: dict[str, str] = field(default_factory=dict)
    #: `/init` waits for it, so a template captured after its warm-up `/init` has them all.
    preload: Preload = field(default_factory=Preload)
    #: ended processes `commands.connect(pid)` still answers (`/init` may set its bounds)
    ended: EndedTable = field(default_factory=EndedTable)
    _default_user: User | None = None

    @property
    def default_user(self) -> User:
        if self._default_user is None or self._default_user.name != self.default_user_name:
            self._default_user = lookup_or_current(self.default_user_name)
        return self._default_user

    def set_default_user(self, name: str) -> None:
        self.default_user_name = name
        self._default_user = None

    def process_env(self, user: User, extra: dict[str, str]) -> dict[str, str]:
        """Environment of a new process: PATH/HOME/USER/LOGNAME, sandbox vars, request vars."""
        env = {
            "PATH": os.environ.get("PATH", DEFAULT_PATH),
            "HOME": user.home,
            "USER": user.name,
            "LOGNAME": user.name,
        }
        env.update(self.env_vars)
        env.update(extra)
        return env
