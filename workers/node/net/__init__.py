"""Per-sandbox network slots: a netns holding the guest's tap, reached from the host by a veth.

Every guest has the same IP and MAC (so snapshots stay valid); what makes two restores of
one snapshot reachable at once is that each lives in its own namespace, behind its own
host-side /30.
"""

from workers.node.net.addressing import GUEST, GuestAddressing, SlotAddress, slot_address
from workers.node.net.errors import NetworkError
from workers.node.net.firewall import EgressPolicy, render_rules
from workers.node.net.pool import SlotPool
from workers.node.net.slot import NetworkSlot, create_slot, destroy_slot, list_leftovers

__all__ = [
    "GUEST",
    "EgressPolicy",
    "GuestAddressing",
    "NetworkError",
    "NetworkSlot",
    "SlotAddress",
    "SlotPool",
    "create_slot",
    "destroy_slot",
    "list_leftovers",
    "render_rules",
    "slot_address",
]
