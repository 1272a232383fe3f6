import signal

from workers.node.deathwatch import cause_of
from workers.node.diskwatch import event_time, next_step, no_space


def event(**data: object) -> dict[str, object]:
    return {"event": "BLOCK_IO_ERROR", "data": data, "timestamp": {"seconds": 1}}


def test_a_write_that_found_the_host_full_and_stopped_the_vm_is_heard() -> None:
    e = event(device="root", operation="write", action="stop", nospace=True, reason="No space")
    assert no_space(e) == "root"
    assert no_space(event(**{"node-name": "#block1", "action": "stop", "nospace": True})) == (
        "#block1"
    )


def test_other_io_errors_and_events_are_the_guests_own() -> None:
    # reported to the guest (rerror=report, werror=enospc): the VM runs on
    assert no_space(event(device="root", action="report", nospace=False, reason="EIO")) is None
    assert no_space(event(device="root", action="report", nospace=True)) is None
    assert no_space(event(device="root", action="stop")) is None
    assert no_space({"event": "STOP"}) is None
    assert no_space({"event": "BLOCK_IO_ERROR"}) is None


def test_an_event_s_time_is_qemu_s_stamp() -> None:
    e = {"event": "BLOCK_IO_ERROR", "timestamp": {"seconds": 1796554671, "microseconds": 500000}}
    assert event_time(e) == 1796554671.5
    assert event_time({"event": "STOP"}) == 0.0


def test_a_vm_running_again_ends_its_episode_whatever_the_time() -> None:
    assert next_step(stopped=False, since=0.0, now=0.5, grace_s=10) == "over"
    assert next_step(stopped=False, since=0.0, now=99.0, grace_s=10) == "over"


def test_a_vm_still_stopped_is_retried_until_its_grace_is_spent() -> None:
    assert next_step(stopped=True, since=100.0, now=101.0, grace_s=10) == "retry"
    assert next_step(stopped=True, since=100.0, now=109.9, grace_s=10) == "retry"
    assert next_step(stopped=True, since=100.0, now=110.0, grace_s=10) == "give-up"


def test_a_vm_killed_by_sigbus_died_of_a_full_host_disk() -> None:
    # its RAM is a file on the node's disk: a page it cannot grow into is a SIGBUS
    cause, why = cause_of(-signal.SIGBUS, oom=False)
    assert cause == "disk-full" and "disk is full" in why
    assert cause_of(-signal.SIGKILL, oom=True)[0] == "oom"
    assert cause_of(-signal.SIGSEGV, oom=False)[0] == "crash"
    assert cause_of(1, oom=False)[0] == "crash"
