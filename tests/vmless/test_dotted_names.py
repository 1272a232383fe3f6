"""Template ids with a `.` (a template named `my.tpl`, an image reference) are stored and
read back on the real bus: their subject token escapes the `.` (`bus/subjects.py`), so
their events can be written at all, and each is read back under its own id."""

from __future__ import annotations

import asyncio
import uuid

from bus import Bus
from bus.decisions import execute
from bus.envelope import MessageContext
from domain import template as tp
from tests.vmless.conftest import VmlessStack


def test_a_dotted_template_id_is_written_and_read_back(vmless: VmlessStack) -> None:
    name = f"my.tpl-{uuid.uuid4().hex[:6]}"
    ref = f"docker.io/library/dotted-{uuid.uuid4().hex[:6]}:3.12"

    async def register() -> list[list[object]]:
        bus = await Bus.connect(vmless.bus_settings, setup=False)
        try:
            for template_id in (name, ref):
                cmd = tp.RegisterTemplate(template_id=template_id, command_id=uuid.uuid4())
                await execute(bus.templates, cmd, MessageContext(actor="test"))
            return [[r.event for r in await bus.templates.read(t)] for t in (name, ref)]
        finally:
            await bus.close()

    events = asyncio.run(register())
    assert [type(e) for es in events for e in es] == [tp.TemplateRegistered] * 2
