"""TTL expiry: pause (default) or kill running sandboxes whose time is up."""

from workers.timer.timer import Timer

__all__ = ["Timer"]
