"""envd's /init for a cold boot of a filesystem-only capture: the sandbox's own settings
over the capture's defaults, env vars merged key by key."""

from workers.node.runtime.guest import over_defaults


def test_the_sandbox_settings_win_and_env_vars_merge() -> None:
    defaults: dict[str, object] = {"envVars": {"A": "1", "B": "2"}, "hostname": "old"}
    init: dict[str, object] = {"envVars": {"B": "3"}, "hostname": "new", "accessToken": "t"}
    assert over_defaults(defaults, init) == {
        "envVars": {"A": "1", "B": "3"},
        "hostname": "new",
        "accessToken": "t",
    }


def test_no_init_keeps_the_defaults() -> None:
    defaults: dict[str, object] = {"envVars": {"A": "1"}}
    assert over_defaults(defaults, None) == defaults
