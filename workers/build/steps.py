"""The Dockerfile steps of a build, run one by one in the build sandbox through its envd.

RUN, COPY, WORKDIR and USER act on the guest; ENV and ARG only change the `Context` that
later steps (and, for ENV, WORKDIR and USER, the template's defaults) see. A step's output
is logged line by line as it comes, so a long RUN shows progress; any failure is a
`StepFailed` naming the step.
"""

from __future__ import annotations

import asyncio
import posixpath
import shlex
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from domain import build as bd
from workers.build.copy import CopyError, repack
from workers.build.guest import BuildGuest, CommandFailed

__all__ = ["Context", "Log", "StepFailed", "Steps"]

Log = Callable[[str, str | None, str], Awaitable[None]]  # (message, step, level)


class StepFailed(Exception):
    """Ends a build: `reason` is what its record and log say, `step` the step it names."""

    def __init__(self, step: str, reason: str) -> None:
        super().__init__(reason)
        self.step = step
        self.reason = reason


@dataclass
class Context:
    """What the steps so far have set: applies to later steps and becomes the template's
    defaults (ENV, WORKDIR, USER); ARGs apply to RUN steps only, as in Docker."""

    env: dict[str, str] = field(default_factory=dict)
    args: dict[str, str] = field(default_factory=dict)
    user: str | None = None
    workdir: str | None = None

    @property
    def step_user(self) -> str:
        return self.user or "root"


class Steps:
    """Runs a build's steps in its sandbox (`guest`), updating `ctx` as they go."""

    def __init__(
        self,
        guest: BuildGuest,
        ctx: Context,
        emit: Log,
        build: bd.Build,
        *,
        total: int,
        files_dir: Path,
        step_timeout_s: float,
    ) -> None:
        self.guest, self.ctx, self.emit, self.build = guest, ctx, emit, build
        #: how many steps the build has (shown as `[n/total]`)
        self.total = total
        self.files_dir = files_dir
        self.step_timeout_s = step_timeout_s

    async def run(self, name: str, step: bd.BuildStep) -> None:
        """Run one step (`name`: its number), logging it first; `StepFailed` names it."""
        shown = " ".join(step.args) if step.type != "COPY" else " ".join(step.args[:2])
        await self.emit(f"[{name}/{self.total}] {step.type} {shown}".rstrip(), name, "info")
        match step.type:
            case "RUN":
                await self._run(name, step)
            case "COPY":
                await self._copy(name, step)
            case "ENV":
                if len(step.args) % 2:
                    raise StepFailed(name, "ENV needs key/value pairs")
                self.ctx.env.update(zip(step.args[::2], step.args[1::2], strict=True))
            case "ARG":
                for a in step.args:
                    key, eq, value = a.partition("=")
                    if eq or key not in self.ctx.args:
                        self.ctx.args[key] = value
            case "WORKDIR":
                if len(step.args) != 1 or not step.args[0]:
                    raise StepFailed(name, "WORKDIR needs one path")
                path = posixpath.normpath(posixpath.join(self.ctx.workdir or "/", step.args[0]))
                await self._exec(name, f"mkdir -p {shlex.quote(path)}", user="root", cwd="/")
                self.ctx.workdir = path
            case "USER":
                if len(step.args) != 1 or not step.args[0]:
                    raise StepFailed(name, "USER needs one user name")
                user = step.args[0].split(":", 1)[0]
                await self._exec(
                    name,
                    f"id -u {shlex.quote(user)} >/dev/null",
                    user="root",
                    cwd="/",
                    what=f"USER {user}: no such user",
                )
                self.ctx.user = user
            case other:
                raise StepFailed(
                    name,
                    f"unsupported instruction {other!r} (supported: RUN, "
                    "COPY, ENV, ARG, WORKDIR, USER)",
                )

    async def _exec(
        self,
        name: str,
        cmd: str,
        *,
        user: str,
        cwd: str | None,
        env: dict[str, str] | None = None,
        what: str | None = None,
    ) -> None:
        pending: list[tuple[str, str]] = []
        partial = {"stdout": "", "stderr": ""}  # output arrives in chunks, not lines

        def out(stream: str, text: str) -> None:
            *lines, partial[stream] = (partial[stream] + text).split("\n")
            pending.extend((stream, line) for line in lines)

        flusher = asyncio.create_task(self._flush_output(name, pending))
        try:
            await self.guest.run(
                cmd,
                user=user,
                cwd=cwd,
                envs=env or {},
                output=out,
                timeout=self.step_timeout_s,
            )
        except CommandFailed as e:
            raise StepFailed(name, what or f"step {name} ({cmd[:80]}) failed with {e}") from e
        except Exception as e:  # envd or proxy trouble: still this step's failure
            raise StepFailed(name, f"step {name} could not run: {e}") from e
        finally:
            flusher.cancel()
            pending.extend((k, v) for k, v in partial.items() if v)
            await self._drain(name, pending)

    async def _flush_output(self, name: str, pending: list[tuple[str, str]]) -> None:
        while True:
            await asyncio.sleep(0.5)
            await self._drain(name, pending)

    async def _drain(self, name: str, pending: list[tuple[str, str]]) -> None:
        lines, pending[:] = list(pending), []
        for stream, line in lines:
            await self.emit(line, name, "warn" if stream == "stderr" else "info")

    async def _run(self, name: str, step: bd.BuildStep) -> None:
        if not step.args or not step.args[0].strip():
            raise StepFailed(name, "RUN needs a command")
        user = step.args[1] if len(step.args) > 1 and step.args[1] else self.ctx.step_user
        env = {**self.ctx.args, **self.ctx.env}
        await self._exec(name, step.args[0], user=user, cwd=self.ctx.workdir or "/", env=env)

    async def _copy(self, name: str, step: bd.BuildStep) -> None:
        if len(step.args) < 2 or not step.files_hash:
            raise StepFailed(name, "COPY needs a source, a destination and uploaded files")
        src, dest = step.args[0], step.args[1]
        owner = step.args[2] if len(step.args) > 2 else ""
        mode = int(step.args[3], 8) if len(step.args) > 3 and step.args[3] else None
        archive = self.files_dir / self.build.template_id / step.files_hash
        if not archive.exists():
            raise StepFailed(
                name, f"COPY {src}: its files were not uploaded (hash {step.files_hash})"
            )
        try:
            data, count = await asyncio.to_thread(
                repack, archive, src, dest, self.ctx.workdir or "/", owner=owner, mode=mode
            )
        except CopyError as e:
            raise StepFailed(name, str(e)) from e
        tmp = f"/tmp/.aenv-copy-{self.build.build_id[:8]}-{name}.tar"
        await self.guest.write(tmp, data)
        # the image's tar where it has one; else the static busybox on envd's runtime disk
        # (distroless and busybox-only images have no tar, or only busybox's)
        bb = "/opt/aenv/bin/busybox"
        unpack = (
            f"if command -v tar >/dev/null 2>&1; then tar -xpf {tmp} -C /; "
            f"else {bb} tar -xf {tmp} -C /; fi && {bb} rm -f {tmp}"
        )
        await self._exec(name, unpack, user="root", cwd="/")
        await self.emit(f"copied {count} entries", name, "info")
