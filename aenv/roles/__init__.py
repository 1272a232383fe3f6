"""The processes of one aenv node: `node` (VMs) and `api` (HTTP, projections, timer).

`aenv serve` supervises one of each over the same NATS, Postgres and S3. They share nothing
in memory — everything they know of each other goes through the bus — so either can be
restarted (or crash) without the other noticing more than a pause in service.
"""

from aenv.roles.common import READY, RoleSettings, say

__all__ = ["READY", "RoleSettings", "say"]
