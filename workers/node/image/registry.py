"""Images by reference from OCI/Docker registries, into the node's layer cache.

`parse_reference` names an image the way Docker does (`busybox` is
`docker.io/library/busybox:latest`). `pull` copies it with skopeo — a maintained registry
client speaking every auth scheme and manifest type registries use — into an OCI layout
whose blobs live in one directory shared by every pull on this node
(`<cache>/blobs/sha256/…`): a layer two images share is downloaded once, and skopeo skips
what is already there. The layout is then converted like any local one
(`build_from_oci(layout, …, blobs=…)`).

Credentials never reach a command line (`ps` would show them) or the event log: they are
written to a private auth file for the one skopeo run. Registries on loopback are spoken
to over plain HTTP, as Docker allows; any other needs TLS unless the operator lists it in
`AENV_INSECURE_REGISTRIES` (comma-separated `host[:port]`). `AENV_REGISTRY_MIRRORS`
(`docker.io=host[:port],…`) pulls a registry's images from a mirror instead.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.images import ImageRef, InvalidImageReference, mirrored, parse_mirrors
from shared.images import parse_reference as _parse

from . import cache as _cache
from .errors import ImageError
from .leftovers import Made, blob_file

__all__ = [
    "ImageRef",
    "Pulled",
    "RegistryAuth",
    "Resolved",
    "insecure_registries",
    "parse_reference",
    "pull",
    "registry_mirrors",
    "resolve",
]

INSECURE_ENV = "AENV_INSECURE_REGISTRIES"
MIRRORS_ENV = "AENV_REGISTRY_MIRRORS"

Progress = Callable[[str], None]


@dataclass(frozen=True)
class RegistryAuth:
    """E2B's general-registry credentials (`fromImageRegistry: {type: "registry"}`)."""

    username: str
    password: str


@dataclass(frozen=True)
class Pulled:
    """An image copied into this node's cache."""

    layout: Path
    blobs: Path
    ref: ImageRef
    layers_cached: int  # already in the layer cache before this pull
    layers_fetched: int
    #: the registry's digest of the manifest pulled (`Resolved.manifest`)
    manifest: str


def parse_reference(text: str) -> ImageRef:
    """`shared.images.parse_reference`, failing as an `ImageError`."""
    try:
        return _parse(text)
    except InvalidImageReference as e:
        raise ImageError(str(e)) from e


def insecure_registries() -> frozenset[str]:
    return frozenset(h.strip() for h in os.environ.get(INSECURE_ENV, "").split(",") if h.strip())


def registry_mirrors() -> dict[str, str]:
    try:
        return parse_mirrors(os.environ.get(MIRRORS_ENV, ""))
    except InvalidImageReference as e:
        raise ImageError(f"{MIRRORS_ENV}: {e}") from e


def _skopeo(argv: list[str], what: str, timeout: float) -> str:
    """Run skopeo; its output, or an `ImageError` saying why it failed."""
    return _skopeo_bytes(argv, what, timeout).decode()


def _skopeo_bytes(argv: list[str], what: str, timeout: float) -> bytes:
    try:
        proc = subprocess.run(["skopeo", *argv], capture_output=True, timeout=timeout, check=False)
    except FileNotFoundError as e:
        raise ImageError("skopeo is not installed (apt-get install skopeo)") from e
    except subprocess.TimeoutExpired as e:
        raise ImageError(f"{what}: no answer within {timeout:.0f}s") from e
    if proc.returncode != 0:
        raise ImageError(f"{what}: {_reason(proc.stderr.decode(errors='replace'))}")
    return proc.stdout


def _reason(stderr: str) -> str:
    """skopeo's last error line, in words a user acts on."""
    text = stderr.strip().splitlines()[-1] if stderr.strip() else "skopeo failed"
    if 'msg="' in text:  # a logrus line: its message only
        text = text.split('msg="', 1)[1].rstrip('"').replace('\\"', '"')
    low = text.lower()
    if "unauthorized" in low or "authentication required" in low or "denied" in low:
        return f"the registry refused the credentials (or needs some): {text}"
    if "manifest unknown" in low or "not found" in low:
        return f"no such image in the registry: {text}"
    if "http response to https client" in low or "certificate" in low or "tls" in low:
        return (
            f"{text} (a registry without TLS must be listed in {INSECURE_ENV} unless "
            "it is on loopback)"
        )
    return text


@dataclass(frozen=True)
class Resolved:
    """A reference as the registry answers it now: the digest of its linux/amd64 manifest
    (what a build of it is named by, `build.oci_recipe`) and its layers, read without
    pulling any."""

    ref: ImageRef
    manifest: str  # sha256:<hex> of the manifest's bytes
    layers: tuple[str, ...]
    #: its config blob's digest ("" when not known): a failed pull's ledger names it
    config: str = ""
    #: the layers' sizes as the manifest states them (compressed): what a pull writes
    sizes: tuple[int, ...] = ()


def resolve(
    ref: ImageRef, *, auth: RegistryAuth | None = None, progress: Progress = print
) -> Resolved:
    """Read `ref`'s manifest (an index: its linux/amd64 entry's) from the registry: the
    recipe of its import is known before a layer is pulled."""
    with _options(ref, auth, progress) as (source, inspect, _):
        return _resolve(ref, source, inspect, progress)


def pull(
    ref: ImageRef,
    *,
    cache: Path | None = None,
    auth: RegistryAuth | None = None,
    progress: Progress = print,
    timeout: float = 1800.0,
    resolved: Resolved | None = None,
    made: Made | None = None,
) -> Pulled:
    """Copy `ref` (linux/amd64) into this node's layer cache; its OCI layout and blob dir.
    The copy is of the manifest `resolved` names (read here if not given), by digest: a
    tag moved meanwhile does not change what the recipe said. `made` (the import's
    ledger, `leftovers.py`) hears the blobs this pull wrote and the layout it created,
    whether it succeeds or not."""
    root = _cache.cache_root(cache)
    blobs = root / "blobs"
    blobs.mkdir(exist_ok=True)
    key = hashlib.sha256(str(ref).encode()).hexdigest()[:32]
    layout = root / "oci" / key
    layout.parent.mkdir(exist_ok=True)
    with (
        _options(ref, auth, progress) as (source, inspect, copy),
        _cache.locked(root, f"oci-{key}"),
    ):
        got = resolved or _resolve(ref, source, inspect, progress)
        before = _blob_names(blobs)
        cached = sum(1 for d in got.layers if blob_file(blobs, d).is_file())
        progress(f"pull {ref}: {len(got.layers)} layers, {cached} already in the layer cache")
        if made is not None:
            made.use(blobs=[*got.layers, got.config])
            if not layout.exists():
                made.wrote(layouts=[layout])
            made.expect(blobs={*got.layers, got.config} - before)
        try:
            _skopeo(
                [
                    *_PLATFORM,
                    "copy",
                    "--quiet",
                    *copy,
                    "--dest-shared-blob-dir",
                    str(blobs),
                    f"docker://{source.registry}/{source.repository}@{got.manifest}",
                    f"oci:{layout}:image",
                ],
                f"pull {ref}",
                timeout,
            )
        finally:
            if made is not None:
                ours = {*got.layers, got.config} | _layout_names(layout, blobs)
                made.wrote(blobs=(_blob_names(blobs) - before) & ours)
    fetched = len(got.layers) - cached
    progress(f"pull {ref}: {fetched} layers downloaded")
    return Pulled(layout, blobs, ref, cached, fetched, got.manifest)


@contextlib.contextmanager
def _options(
    ref: ImageRef, auth: RegistryAuth | None, progress: Progress
) -> Iterator[tuple[ImageRef, list[str], list[str]]]:
    """Where `ref` is read from (a mirror, maybe) and skopeo's options for `inspect` and
    `copy` (which name the same options apart); a login lives in a private auth file for
    as long as the context."""
    with tempfile.TemporaryDirectory(prefix="aenv-pull-") as tmp:
        inspect: list[str] = []
        copy: list[str] = []
        source = mirrored(ref, registry_mirrors())
        if source != ref:
            progress(f"pull {ref}: from the mirror {source.registry}")
        if source.loopback or source.registry in insecure_registries():
            inspect.append("--tls-verify=false")
            copy.append("--src-tls-verify=false")
        if auth is not None:
            authfile = Path(tmp) / "auth.json"
            token = base64.b64encode(f"{auth.username}:{auth.password}".encode()).decode()
            fd = os.open(authfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump({"auths": {source.registry: {"auth": token}}}, f)
            inspect += ["--authfile", str(authfile)]
            copy += ["--src-authfile", str(authfile)]
        else:
            inspect.append("--no-creds")
            copy.append("--src-no-creds")
        yield source, inspect, copy


def _resolve(ref: ImageRef, source: ImageRef, inspect: list[str], progress: Progress) -> Resolved:
    progress(f"pull {ref}: reading its manifest")
    raw = _manifest(ref, inspect, source.transport)
    manifest = _json(ref, raw)
    digest = "sha256:" + hashlib.sha256(raw).hexdigest()
    if manifest.get("manifests"):  # an index: the linux/amd64 entry's manifest
        digest = _amd64(manifest, ref)
        raw = _manifest(ref, inspect, f"docker://{source.registry}/{source.repository}@{digest}")
        manifest = _json(ref, raw)
    found = manifest.get("layers") or []
    layers = tuple(str(d["digest"]) for d in found)
    config = str((manifest.get("config") or {}).get("digest") or "")
    sizes = tuple(int(d.get("size") or 0) for d in found)
    return Resolved(ref, digest, layers, config, sizes)


def _blob_names(blobs: Path) -> set[str]:
    """The digests the shared blob directory holds (sha256 only: what skopeo writes)."""
    d = blobs / "sha256"
    return {f"sha256:{p.name}" for p in d.iterdir()} if d.is_dir() else set()


def _layout_names(layout: Path, blobs: Path) -> set[str]:
    """The manifests and configs a layout's index names (skopeo may have rewritten the
    registry's manifest, so its digest is known only from here); nothing if unreadable."""
    named: set[str] = set()
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError, AttributeError):
        for entry in json.loads((layout / "index.json").read_text()).get("manifests") or []:
            named.add(str(entry["digest"]))
            manifest = json.loads(blob_file(blobs, str(entry["digest"])).read_text())
            named.add(str(manifest["config"]["digest"]))
    return named


#: global options: the variant of a multi-platform image to take
_PLATFORM = ["--override-os", "linux", "--override-arch", "amd64"]


def _manifest(ref: ImageRef, options: list[str], transport: str) -> bytes:
    """The manifest's bytes as the registry serves them (its digest is theirs)."""
    return _skopeo_bytes([*_PLATFORM, "inspect", "--raw", *options, transport], f"pull {ref}", 120)


def _json(ref: ImageRef, raw: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise ImageError(f"pull {ref}: the registry's manifest is not JSON: {e}") from e
    if not isinstance(doc, dict):
        raise ImageError(f"pull {ref}: the registry's manifest is not a JSON object")
    return doc


def _amd64(index: dict[str, Any], ref: ImageRef) -> str:
    for entry in index.get("manifests") or []:
        platform = entry.get("platform") or {}
        if platform.get("os") == "linux" and platform.get("architecture") == "amd64":
            return str(entry["digest"])
    raise ImageError(f"pull {ref}: the image has no linux/amd64 variant")
