from typing import Any

from workers.node.observe import GuestObserver, disk_full

GIB = 1 << 30


def test_a_disk_is_full_within_one_percent_of_its_size_and_has_room_again_past_five() -> None:
    total = 100 * GIB
    assert not disk_full(False, 98 * GIB, total)
    assert disk_full(False, 99 * GIB, total)
    assert disk_full(False, total, total)
    # hysteresis: hovering at the edge stays one episode
    assert disk_full(True, 98 * GIB, total)
    assert disk_full(True, 95 * GIB + 1, total)
    assert not disk_full(True, 94 * GIB, total)


def test_a_small_disk_is_full_with_what_ext4_keeps_back_still_free() -> None:
    mib, total = 1 << 20, 1280 << 20
    assert disk_full(False, total - 16 * mib, total)  # 1.25% free: ext4's reserve
    assert not disk_full(False, total - 40 * mib, total)
    assert disk_full(True, total - 64 * mib, total)
    assert not disk_full(True, total - 65 * mib, total)


def test_an_unmeasured_disk_changes_nothing() -> None:
    assert disk_full(True, 0, 0) and not disk_full(False, 0, 0)


class Guests:
    """The part of a host the observer reads: one guest's samples, set by the test."""

    def __init__(self) -> None:
        self.used = 0

    def running_ids(self) -> list[str]:
        return ["s1"]

    async def guest_metrics(self, sandbox_id: str) -> dict[str, Any]:
        return {"ts": 1, "disk_used": self.used, "disk_total": 100 * GIB}

    def console_log(self, sandbox_id: str) -> None:
        return None


async def test_the_observer_tells_each_episode_once() -> None:
    guests = Guests()
    told: list[tuple[str, int, int]] = []

    async def tell(sid: str, used: int, total: int) -> None:
        told.append((sid, used, total))

    obs = GuestObserver(guests)  # type: ignore[arg-type]
    obs.on_disk_full = tell
    for used in (50, 99, 100, 97, 99, 90, 99.5):
        guests.used = int(used * GIB)
        await obs.look()
    assert told == [("s1", 99 * GIB, 100 * GIB), ("s1", int(99.5 * GIB), 100 * GIB)]
    obs.forget("s1")  # killed: a sandbox of that id later starts with no episode
    await obs.look()
    assert len(told) == 3


async def test_a_failed_telling_is_tried_again_at_the_next_sample() -> None:
    guests = Guests()
    calls = 0

    async def tell(sid: str, used: int, total: int) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("NATS is away")

    obs = GuestObserver(guests)  # type: ignore[arg-type]
    obs.on_disk_full = tell
    guests.used = 100 * GIB
    await obs.look()
    await obs.look()
    await obs.look()
    assert calls == 2
