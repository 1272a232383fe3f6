"""The consumer spec: explicit server settings and the ack deadlines derived from them."""

from __future__ import annotations

import pytest

from bus import BusError, ConsumerSpec


def test_config_is_explicit() -> None:
    spec = ConsumerSpec(
        durable="d",
        filter_subject="aenv.cmd.node.n.*",
        max_deliver=5,
        backoff=(1, 2, 4),
        max_ack_pending=7,
    )
    c = spec.consumer_config()
    assert (c.durable_name, c.filter_subject, c.max_deliver, c.backoff, c.max_ack_pending) == (
        "d",
        "aenv.cmd.node.n.*",
        5,
        [1, 2, 4],
        7,
    )
    assert c.ack_policy is not None and c.ack_policy.value == "explicit"


def test_delays_and_heartbeat() -> None:
    spec = ConsumerSpec(durable="d", filter_subject="x", backoff=(1, 5, 30), ack_wait_s=60)
    assert [spec.delay(n) for n in (1, 2, 3, 9)] == [1, 5, 30, 30]
    assert spec.heartbeat_s == pytest.approx(1 / 3)


def test_max_deliver_must_exceed_backoff_steps() -> None:
    with pytest.raises(BusError):
        ConsumerSpec(
            durable="d", filter_subject="x", max_deliver=2, backoff=(1, 2)
        ).consumer_config()
