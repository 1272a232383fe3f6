"""`POST /init`: the control plane's hand-over after boot, restore or fork.

Besides the token, env vars and defaults, it repairs what a memory snapshot gets wrong: a
restored guest's wall clock is as old as the snapshot, and every fork of one snapshot would
continue with the same kernel RNG state. So: set CLOCK_REALTIME from the host's timestamp and
mix host-supplied entropy into the RNG, then force a CRNG reseed. Both only as root, and a
failure is a logged warning, never a failed /init.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import os
import struct
import time
from typing import Any

from envd import log
from envd.auth import TOKEN_HEADER, same_secret
from envd.httpserver import HttpError, Request
from envd.state import State

RNDADDENTROPY = 0x40085203
RNDRESEEDCRNG = 0x5207
CLOCK_MIN_DRIFT_S = 0.05  # closer than this, leave the clock alone (and never step it back a hair)
MAX_ENTROPY = 4096


def parse_timestamp(value: object) -> int | None:
    """Unix nanoseconds from an RFC 3339 string or an integer of unix nanoseconds."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError("timestamp must be RFC 3339 or unix nanoseconds")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        if value.isdigit():
            return int(value)
        text = value.strip()
        frac_ns = 0
        # Python 3.11 parses at most microseconds: split off the fraction ourselves.
        main, dot, rest = text.partition(".")
        tz = ""
        if dot:
            digits = ""
            for i, ch in enumerate(rest):
                if not ch.isdigit():
                    tz = rest[i:]
                    break
                digits += ch
            frac_ns = int((digits + "000000000")[:9]) if digits else 0
            text = main + tz
        import datetime as dt

        if text.endswith(("Z", "z")):
            text = text[:-1] + "+00:00"
        parsed = dt.datetime.fromisoformat(text)
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=dt.UTC)
        return int(parsed.timestamp()) * 1_000_000_000 + frac_ns
    raise ValueError("timestamp must be RFC 3339 or unix nanoseconds")


def set_clock(ns: int) -> str:
    """Step CLOCK_REALTIME to `ns`; returns what happened (for the log)."""
    drift = ns / 1e9 - time.time()
    if abs(drift) < CLOCK_MIN_DRIFT_S:
        return "in-sync"
    if os.geteuid() != 0:
        log.warn("cannot set the clock: not root", drift_s=round(drift, 3))
        return "not-permitted"
    try:
        time.clock_settime_ns(time.CLOCK_REALTIME, ns)
    except OSError as e:
        log.warn("clock_settime failed", error=str(e))
        return "failed"
    log.info("clock set from host", drift_s=round(drift, 3))
    return "set"


def reseed_rng(seed: bytes) -> str:
    """Credit `seed` to the kernel pool (RNDADDENTROPY) and reseed the CRNG from it."""
    if not seed:
        return "none"
    if os.geteuid() != 0:
        log.warn("cannot reseed the RNG: not root")
        return "not-permitted"
    import fcntl

    seed = seed[:MAX_ENTROPY]
    # struct rand_pool_info { int entropy_count (bits); int buf_size (bytes); __u32 buf[]; }
    info = struct.pack("ii", len(seed) * 8, len(seed)) + seed
    try:
        fd = os.open("/dev/urandom", os.O_WRONLY | os.O_CLOEXEC)
    except OSError as e:
        log.warn("cannot open /dev/urandom", error=str(e))
        return "failed"
    try:
        fcntl.ioctl(fd, RNDADDENTROPY, info)
        try:
            fcntl.ioctl(fd, RNDRESEEDCRNG)
        except OSError as e:  # kernels before 4.17 have no RNDRESEEDCRNG
            log.warn("RNDRESEEDCRNG failed", error=str(e))
            return "added"
    except OSError as e:
        log.warn("RNDADDENTROPY failed", error=str(e))
        return "failed"
    finally:
        os.close(fd)
    return "reseeded"


def set_hostname(name: str) -> None:
    import socket

    if not name or socket.gethostname() == name:
        return
    if os.geteuid() != 0:
        log.warn("cannot set hostname: not root")
        return
    try:
        socket.sethostname(name)
    except OSError as e:
        log.warn("sethostname failed", error=str(e))


def ended_keep(body: dict[str, Any]) -> tuple[int | None, float | None]:
    """aenv's own /init fields: how many ended processes, and for how long, envd keeps for
    `commands.connect(pid)` (`envd.tails`; the node's AENV_ENVD_ENDED_KEEP[_S])."""
    keep, keep_s = body.get("aenvEndedKeep"), body.get("aenvEndedKeepS")
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 0):
        raise ValueError("aenvEndedKeep must be a count >= 0")
    if keep_s is not None and (
        isinstance(keep_s, bool) or not isinstance(keep_s, (int, float)) or not keep_s >= 0
    ):
        raise ValueError("aenvEndedKeepS must be seconds >= 0")
    return keep, None if keep_s is None else float(keep_s)


def _authorized(state: State, req: Request, body: dict[str, Any]) -> bool:
    """Once a token is set, /init must prove it knows it (header, or the same token again)."""
    current = state.access_token
    if current is None:
        return True
    header = req.headers.get(TOKEN_HEADER)
    if header is not None and same_secret(header, current):
        return True
    token = body.get("accessToken")
    return isinstance(token, str) and same_secret(token, current)


_MOUNT_LOCK: asyncio.Lock | None = None


def _mounting() -> asyncio.Lock:
    global _MOUNT_LOCK
    if _MOUNT_LOCK is None:
        _MOUNT_LOCK = asyncio.Lock()
    return _MOUNT_LOCK


async def handle_init(state: State, req: Request) -> None:
    raw = await req.read_all(1024 * 1024)
    try:
        body = json.loads(raw) if raw.strip() else {}
    except ValueError as e:
        raise HttpError(400, f"invalid JSON: {e}") from e
    if not isinstance(body, dict):
        raise HttpError(400, "body must be a JSON object")
    if not _authorized(state, req, body):
        raise HttpError(401, "unauthorized access, /init needs the current access token")
    try:
        ts = parse_timestamp(body.get("timestamp"))
        entropy_raw = body.get("entropy")
        entropy = base64.b64decode(entropy_raw) if isinstance(entropy_raw, str) else b""
        keep, keep_s = ended_keep(body)
    except (ValueError, binascii.Error) as e:
        raise HttpError(400, f"invalid init request: {e}") from e
    from envd import volumes  # preloaded (`envd.preload`): free by the time a sandbox runs

    try:
        mounts = volumes.parse_mounts(body.get("volumeMounts"))
    except ValueError as e:
        raise HttpError(400, f"invalid init request: {e}") from e
    env_vars = body.get("envVars")
    if env_vars is not None and not (
        isinstance(env_vars, dict) and all(isinstance(v, str) for v in env_vars.values())
    ):
        raise HttpError(400, "envVars must be a map of strings")
    clock = set_clock(ts) if ts is not None else "unchanged"
    rng = reseed_rng(entropy)
    if isinstance(body.get("hostname"), str):
        set_hostname(body["hostname"])
    if env_vars:
        state.env_vars.update(env_vars)
    token = body.get("accessToken")
    if isinstance(token, str) and token:
        state.access_token = token
    if isinstance(body.get("defaultUser"), str) and body["defaultUser"]:
        state.set_default_user(body["defaultUser"])
    if isinstance(body.get("defaultWorkdir"), str) and body["defaultWorkdir"]:
        state.default_workdir = body["defaultWorkdir"]
    state.ended.set_bounds(keep, keep_s)
    await state.preload.wait()
    if mounts:
        user = state.default_user
        try:
            # one at a time: the host retries an /init that took longer than its request
            # timeout (a mount under a loaded TCG host), and a second mount of a device
            # still being mounted fails (EBUSY); after the first, it is "mounted already"
            async with _mounting():
                await asyncio.to_thread(volumes.mount_all, mounts, user.uid, user.gid)
        except (volumes.VolumeError, OSError) as e:
            log.error("volume mount failed", error=str(e))
            raise HttpError(500, f"volumes could not be mounted: {e}") from e
    log.info(
        "init",
        clock=clock,
        rng=rng,
        env_vars=len(env_vars or {}),
        token=token is not None,
        volumes=len(mounts),
    )
    await req.respond(204, headers=[("Cache-Control", "no-store")])
