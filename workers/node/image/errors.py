"""The one error root of the guest image builder."""

from __future__ import annotations


class ImageError(Exception):
    """A guest image could not be built or read; the message says which input is at fault.

    Callers (the CLI, the node worker) show the message as is, so it names the file, layer
    digest or command that failed rather than wrapping a bare OS error.
    """


class DiskFull(ImageError):
    """The node's disk filled up (ENOSPC) while an image was pulled, unpacked or written.
    Not the image's fault: another node with room can do it (the node worker answers it
    as `unavailable`). The message starts "node disk full:" and names the step."""
