"""When the block service is down for good (issue 29): the VMs on lazy images are ended
once its outage outlasts QEMU's reconnect window, not before, and once per outage."""

from __future__ import annotations

from pathlib import Path

from shared.lazybase import RECONNECT_DELAY_S, nbd_backing
from workers.node.blockoutage import Outage, stands_on_lazy


def test_an_outage_is_due_once_past_the_window_not_before() -> None:
    o = Outage(30.0)
    assert not o.due(100.0)  # up: nothing to judge
    o.down(100.0)
    o.down(110.0)  # a second death in a row (a restart failed): the clock runs on
    assert not o.due(129.9)
    assert o.lasted(129.9) > 29
    assert o.due(130.0)
    assert not o.due(131.0)  # ended already: once per outage
    o.up()
    assert o.since is None and not o.due(500.0)
    o.down(500.0)  # a new outage is judged afresh
    assert not o.due(520.0) and o.due(530.5)


def test_the_window_is_qemu_s_reconnect_delay() -> None:
    """The supervisor's window and the stubs' `reconnect-delay` are one number."""
    assert f'"reconnect-delay":{RECONNECT_DELAY_S}' in nbd_backing(Path("/s"), "ab")
    assert Outage(RECONNECT_DELAY_S).window_s == 30


def test_only_vms_on_a_lazy_stub_stand_on_the_service() -> None:
    assert stands_on_lazy(Path("/var/cache/aenv/images/ab12/root.lazy.qcow2"))
    assert not stands_on_lazy(Path("/var/cache/aenv/images/ab12/root.ext4"))
