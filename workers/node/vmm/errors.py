"""Error root of the VMM package. Driver failures (QMP, process, files) are translated here."""


class VmmError(Exception):
    """A VM operation failed."""


class VmCrashed(VmmError):
    """The QEMU process exited unexpectedly; carries its exit code and stderr/console tails."""

    def __init__(self, vm_id: str, returncode: int | None, stderr_tail: str, console_tail: str):
        self.vm_id = vm_id
        self.returncode = returncode
        self.stderr_tail = stderr_tail
        self.console_tail = console_tail
        detail = stderr_tail.strip() or console_tail.strip() or "(no output)"
        super().__init__(f"VM {vm_id}: QEMU exited with code {returncode}: {detail[-800:]}")


class SnapshotIncompatible(VmmError):
    """A snapshot was made by another QEMU version or machine config; restoring would hang."""


class VmTimeout(VmmError):
    """A bounded wait on the VM (QMP up, migration, guest agent) ran out."""
