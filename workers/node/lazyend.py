"""What the node does when its block service is down past QEMU's reconnect window
(`blockoutage.py` decides when): every VM whose base is a lazy stub goes. A sandbox's VM
is ended through the death watch (an event, cause `block-service`); a warm VM, which no
sandbox owns yet, is dropped from the pool, so no create is handed a guest whose reads
fail."""

from __future__ import annotations

from workers.node.blockoutage import CAUSE, WHY, stands_on_lazy
from workers.node.deathwatch import DeathWatch
from workers.node.warm import WarmPool

__all__ = ["end_lazy_vms"]


async def end_lazy_vms(deaths: DeathWatch, warm: WarmPool | None) -> list[str]:
    """End the sandboxes and drop the warm VMs standing on lazy stubs; their ids."""
    gone = await deaths.end_where(lambda s: stands_on_lazy(s.vm.base_image), CAUSE, WHY)
    if warm is not None:
        gone += await warm.drop_where(lambda vm: stands_on_lazy(vm.base_image))
    return gone
