"""The contexts of one server: created, listed, restarted, removed; one default per language.

A request without `context_id` runs in its language's default context (python when it
names none), made on first use — except the default Python one, which the server starts
(and warms) before it answers anything, so a template captured after /health answers has
a kernel ready for the first `run_code`.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from codeint import wire
from codeint.base import Context, RunAs
from codeint.bashctx import BashContext
from codeint.pykernel import PythonContext


class UnknownContext(KeyError):
    """No context has that id."""


class BadRequest(ValueError):
    """The request names an unsupported language or a cwd that is not a directory."""


class Contexts:
    def __init__(self, *, cwd: str, runas: RunAs | None, rundir: Path, python: str) -> None:
        self.cwd, self.runas, self.rundir, self.python = cwd, runas, rundir, python
        self._all: dict[str, Context] = {}
        self._defaults: dict[str, str] = {}  # language → context id
        self._making: dict[str, asyncio.Lock] = {}

    def _new(self, language: str, cwd: str) -> Context:
        if language == "python":
            return PythonContext(cwd, self.runas, self.rundir, python=self.python)
        if language == "bash":
            return BashContext(cwd, self.runas, self.rundir)
        raise BadRequest(
            f"unsupported language {language!r} (supported: {', '.join(wire.LANGUAGES)})"
        )

    async def create(self, language: str | None, cwd: str | None) -> Context:
        lang = wire.normalize_language(language)
        where = cwd or self.cwd
        if not os.path.isdir(where):
            raise BadRequest(f"cwd {where!r} is not a directory")
        ctx = self._new(lang, where)
        await ctx.start()
        self._all[ctx.id] = ctx
        return ctx

    async def default(self, language: str | None) -> Context:
        lang = wire.normalize_language(language)
        if lang not in wire.LANGUAGES:
            self._new(lang, self.cwd)  # raises BadRequest
        async with self._making.setdefault(lang, asyncio.Lock()):
            cid = self._defaults.get(lang)
            if cid is not None and cid in self._all:
                return self._all[cid]
            ctx = await self.create(lang, None)
            self._defaults[lang] = ctx.id
            return ctx

    def get(self, context_id: str) -> Context:
        try:
            return self._all[context_id]
        except KeyError:
            raise UnknownContext(context_id) from None

    def list(self) -> list[Context]:
        return list(self._all.values())

    async def remove(self, context_id: str) -> None:
        ctx = self.get(context_id)
        del self._all[context_id]
        await ctx.stop()

    async def restart(self, context_id: str) -> None:
        ctx = self.get(context_id)
        async with ctx.lock:
            await ctx.restart()

    async def close(self) -> None:
        for ctx in list(self._all.values()):
            await ctx.stop()
        self._all.clear()
