"""The rollout benchmark's pure helpers: failures grouped, rates, saturation, overhead."""

from __future__ import annotations

from bench.rollout_bench import (
    envd_url,
    failure_digest,
    first_line,
    overhead,
    rate,
    saturation,
)


def test_first_line_is_the_type_and_the_first_line_only() -> None:
    assert first_line(RuntimeError("no room\nstack trace...")) == "RuntimeError: no room"
    assert first_line(TimeoutError()) == "TimeoutError: "
    assert len(first_line(ValueError("x" * 500))) == 200


def test_failures_are_grouped_by_step_and_error_commonest_first() -> None:
    digest = failure_digest(
        [("create", "E: 503"), ("command", "E: cut"), ("create", "E: 503"), ("kill", "E: x")]
    )
    assert digest[0] == {"step": "create", "error": "E: 503", "count": 2}
    assert [d["step"] for d in digest[1:]] == ["command", "kill"]
    assert failure_digest([]) == []


def test_rate_of_no_time_is_none() -> None:
    assert rate(1000, 4.0) == 250.0
    assert rate(10, 0.0) is None


def test_saturation_is_the_share_of_all_cores() -> None:
    assert saturation(1.8, 1.0, 2) == {"host_busy_share": 0.9, "saturated": True}
    assert saturation(0.5, 1.0, 2) == {"host_busy_share": 0.25, "saturated": False}
    assert saturation(1.0, 0.0, 2)["saturated"] is False


def test_overhead_only_for_steps_that_ran_raw() -> None:
    samples = {
        "command": [0.012, 0.013],
        "raw_command": [0.002, 0.003],
        "write": [0.02],
        "create": [0.5],
    }
    assert overhead(samples) == {"command": 10.0}


def test_first_line_masks_what_differs_between_sandboxes() -> None:
    a = first_line(OSError("connect to http://10.213.0.102/x refused for fotf4pkro7m4uvdlgq72"))
    b = first_line(
        OSError("connect to http://10.213.0.14:49983/x refused for anghpnfel64tszxgvn4c")
    )
    assert a == b == "OSError: connect to http://*/x refused for *"


def test_envd_url_adds_envds_port_to_a_bare_address() -> None:
    assert envd_url("10.213.0.6") == "http://10.213.0.6:49983"
    assert envd_url("127.0.0.1:5000") == "http://127.0.0.1:5000"
