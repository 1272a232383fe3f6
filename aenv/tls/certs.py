"""The certificate the API serves HTTPS with, checked before anything listens.

E2B's SDKs reach the control plane at `https://api.{domain}` and a sandbox's ports at
`https://{port}-{sandboxId}.{domain}`: one certificate must cover both, which takes a
wildcard (`*.{domain}`). A certificate for another name, an expired one or a key of another
certificate would otherwise surface as every client's handshake failing, far from the
cause; here it stops the start with a message that names the file and what is wrong.
"""

from __future__ import annotations

import _ssl  # the stdlib's own certificate decoder (the `ssl` module's C half)
import ssl
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Certificate", "TlsError", "check_certificate", "public_name", "served_names"]


class TlsError(Exception):
    """The certificate or key cannot serve the domain; the message says which and why."""


@dataclass(frozen=True)
class Certificate:
    """A certificate file and its key that passed `check_certificate`."""

    cert_file: Path
    key_file: Path
    #: DNS names it is for (its subjectAltName)
    names: tuple[str, ...]
    #: seconds since the epoch when it stops being valid
    not_after: float


def public_name(domain: str) -> str:
    """The host name of a domain as clients are given it (`aenv.localhost:8443` →
    `aenv.localhost`): certificates name hosts, never ports."""
    return domain.strip().lower().rsplit(":", 1)[0].rstrip(".")


def served_names(domain: str) -> tuple[str, str]:
    """The two kinds of host a certificate for `domain` must cover: the API's, and a
    sandbox port's (any `{port}-{sandboxId}` label: one stands for all)."""
    name = public_name(domain)
    return f"api.{name}", f"49983-sandbox.{name}"


def check_certificate(cert_file: Path, key_file: Path, domain: str) -> Certificate:
    """The certificate in `cert_file` (PEM, the leaf first, then any intermediates) and the
    key in `key_file`, if together they can serve `api.{domain}` and every
    `{port}-{sandboxId}.{domain}` now; else `TlsError`."""
    for what, path in (("certificate", cert_file), ("key", key_file)):
        if not path.is_file():
            raise TlsError(f"TLS {what} {path}: no such file")
    try:
        # the decoder `ssl` itself uses (no public one; typeshed lists it for 3.12+ only)
        decoded = _ssl._test_decode_cert(str(cert_file))  # type: ignore[attr-defined]
    except ssl.SSLError as e:
        raise TlsError(f"TLS certificate {cert_file} is not a PEM certificate: {e}") from e
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_file, key_file)
    except ssl.SSLError as e:
        if "KEY_VALUES_MISMATCH" in str(e):
            raise TlsError(
                f"TLS key {key_file} does not belong to the certificate {cert_file}"
            ) from e
        raise TlsError(f"TLS key {key_file} or certificate {cert_file} unusable: {e}") from e
    names = tuple(v for k, v in decoded.get("subjectAltName", ()) if k == "DNS")
    missing = [h for h in served_names(domain) if not any(_covers(n, h) for n in names)]
    if missing:
        name = public_name(domain)
        raise TlsError(
            f"TLS certificate {cert_file} is for {', '.join(names) or 'no DNS name'}, not for "
            f"{' and '.join(missing)}: the domain {domain} needs *.{name} (the API at api.{name},"
            f" sandboxes at {{port}}-{{sandboxId}}.{name})"
        )
    not_after = ssl.cert_time_to_seconds(decoded["notAfter"])
    not_before = ssl.cert_time_to_seconds(decoded["notBefore"])
    now = time.time()
    if not_after <= now:
        raise TlsError(f"TLS certificate {cert_file} expired on {decoded['notAfter']}")
    if not_before > now:
        raise TlsError(f"TLS certificate {cert_file} is not valid before {decoded['notBefore']}")
    return Certificate(cert_file, key_file, names, not_after)


def _covers(pattern: str, host: str) -> bool:
    """Whether a certificate's DNS name covers `host` (RFC 6125: a `*` stands for exactly
    the whole leftmost label, as browsers and the SDKs' TLS stacks match it)."""
    pattern, host = pattern.lower().rstrip("."), host.lower().rstrip(".")
    if not pattern.startswith("*."):
        return pattern == host
    first, _, rest = host.partition(".")
    return bool(first) and rest == pattern[2:]
