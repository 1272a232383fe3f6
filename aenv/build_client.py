"""The client side of a template build, over E2B's template routes (the same calls the
SDK's `Template.build()` makes): request the build, upload each COPY step's files to the
link the API hands out (hashed and archived with the SDK's own helpers, so the server sees
exactly what an SDK build sends), start it, then follow the status and its log.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from aenv.dockerfile import Dockerfile

__all__ = ["BuildClient", "BuildError", "BuildResult", "NoBuilds"]

Progress = Callable[[str], None]


class BuildError(Exception):
    """The build ended in `error` (message = the server's reason), or a step was refused."""

    def __init__(self, message: str, step: str | None = None) -> None:
        super().__init__(message)
        self.step = step


class NoBuilds(Exception):
    """The template was never built here (`base`, a snapshot): there is no build log."""


@dataclass(frozen=True)
class BuildResult:
    template_id: str
    build_id: str
    seconds: float


class BuildClient:
    def __init__(self, api_url: str, api_key: str, *, timeout: float = 60.0) -> None:
        self.http = httpx.Client(
            base_url=api_url.rstrip("/"), headers={"X-API-Key": api_key}, timeout=timeout
        )

    def close(self) -> None:
        self.http.close()

    def _json(self, r: httpx.Response) -> Any:
        if r.status_code >= 400:
            try:
                message = r.json().get("message") or r.text
            except ValueError:
                message = r.text
            raise httpx.HTTPStatusError(
                f"{r.status_code}: {message}", request=r.request, response=r
            )
        return r.json() if r.content else None

    # ---- the build ----------------------------------------------------------------------
    def build(
        self,
        df: Dockerfile,
        name: str,
        context: Path,
        *,
        progress: Progress,
        from_image: str | None = None,
        from_image_registry: dict[str, str] | None = None,
        cpu: int | None = None,
        memory_mb: int | None = None,
        disk_mb: int | None = None,
        start_cmd: str | None = None,
        ready_cmd: str | None = None,
        poll_s: float = 0.5,
    ) -> BuildResult:
        t0 = time.monotonic()
        body: dict[str, Any] = {"name": name}
        for key, value in (("cpuCount", cpu), ("memoryMB", memory_mb), ("minFreeDiskMb", disk_mb)):
            if value is not None:
                body[key] = value
        req = self._json(self.http.post("/v3/templates", json=body))
        tid, bid = req["templateID"], req["buildID"]
        progress(f"build {bid} of template {tid}")
        steps = []
        for step in df.steps:
            wire: dict[str, Any] = {"type": step.type, "args": list(step.args), "force": False}
            if step.copy is not None:
                wire["filesHash"] = self._upload(
                    tid, step.copy.src, step.copy.dest, context, progress
                )
            steps.append(wire)
        start: dict[str, Any] = {"steps": steps, "force": False}
        if from_image is not None:
            start["fromImage"] = from_image
            if from_image_registry:
                start["fromImageRegistry"] = from_image_registry
        else:
            start["fromTemplate"] = df.base
        if start_cmd or df.start_cmd:
            start["startCmd"] = start_cmd or df.start_cmd
        if ready_cmd:
            start["readyCmd"] = ready_cmd
        self._json(self.http.post(f"/v2/templates/{tid}/builds/{bid}", json=start))
        self._follow(tid, bid, progress, poll_s)
        return BuildResult(tid, bid, time.monotonic() - t0)

    def _upload(self, tid: str, src: str, dest: str, context: Path, progress: Progress) -> str:
        from e2b.template.consts import GZIP, RESOLVE_SYMLINKS
        from e2b.template.utils import calculate_files_hash, read_dockerignore, tar_file_stream

        ignore = read_dockerignore(str(context))
        try:
            files_hash = calculate_files_hash(
                src, dest, str(context), ignore, RESOLVE_SYMLINKS, None
            )
        except ValueError as e:
            raise BuildError(f"COPY {src}: {e}") from e
        link = self._json(self.http.get(f"/templates/{tid}/files/{files_hash}"))
        if link.get("present"):
            progress(f"upload {src}: already there")
            return str(files_hash)
        archive = tar_file_stream(src, str(context), ignore, RESOLVE_SYMLINKS, GZIP)
        try:
            size = archive.seek(0, 2)
            archive.seek(0)
            progress(f"upload {src} ({size / 1024:.1f} KiB)")
            r = self.http.put(
                link["url"], content=archive, timeout=3600, headers={"Content-Length": str(size)}
            )
            self._json(r)
        finally:
            archive.close()
        return str(files_hash)

    def _follow(self, tid: str, bid: str, progress: Progress, poll_s: float) -> None:
        offset = 0
        while True:
            st = self._json(
                self.http.get(
                    f"/templates/{tid}/builds/{bid}/status", params={"logsOffset": offset}
                )
            )
            for e in st["logEntries"]:
                progress(f"  {e['message']}")
            offset += len(st["logEntries"])
            if st["status"] in ("ready", "error") and not st["logEntries"]:
                if st["status"] == "error":
                    reason = st.get("reason") or {}
                    raise BuildError(reason.get("message", "build failed"), reason.get("step"))
                return
            if not st["logEntries"]:
                time.sleep(poll_s)

    # ---- templates ----------------------------------------------------------------------
    def list(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self._json(self.http.get("/v2/templates"))
        return rows

    def logs(
        self, template: str, build_id: str | None = None
    ) -> tuple[tuple[dict[str, Any], ...], dict[str, Any]]:
        """Every log entry of a build (the latest by default) and its final status page."""
        if build_id is None:
            info = self._json(self.http.get(f"/templates/{template}"))
            builds = info.get("builds") or []
            if not builds:
                raise NoBuilds(
                    f"template {template} was not built from a Dockerfile or an "
                    "image (base, a snapshot), so it has no build log; `aenv "
                    "template ls` counts each template's builds"
                )
            build_id = str(builds[0]["buildID"])
        entries: tuple[dict[str, Any], ...] = ()
        while True:
            st = self._json(
                self.http.get(
                    f"/templates/{template}/builds/{build_id}/status",
                    params={"logsOffset": len(entries)},
                )
            )
            if not st["logEntries"]:
                return entries, st
            entries += tuple(st["logEntries"])

    def delete(self, template: str) -> None:
        self._json(self.http.delete(f"/templates/{template}"))
