"""A certificate authority of this machine's own, for `aenv up`: HTTPS on a local domain
with no one else's CA and no network.

The SDKs address sandboxes only as `https://{port}-{sandboxId}.{domain}` (unless the
deprecated `E2B_SANDBOX_URL` is set), so a stack that serves them by name needs a wildcard
certificate clients trust. The CA is made once per data dir and kept (a client told to
trust it keeps working across restarts); the wildcard certificate it signs is made again
when the domain changes or its end nears. Made with the `openssl` command (the project
has no crypto library of its own); keys are 0600 in a 0700 directory.

Clients are handed `ca.pem` (for `NODE_EXTRA_CA_CERTS`, which adds to Node's own list) and
`ca-bundle.pem`, the system's CAs plus ours (for `SSL_CERT_FILE`, which replaces the list
of Python's ssl, httpx and the SDK's Rust transport: other HTTPS sites keep working).
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from aenv.tls.certs import Certificate, TlsError, check_certificate, public_name

__all__ = ["LocalCa", "local_certificate"]

#: Renewed this long before it ends, at a start: a stack restarted monthly never lapses.
RENEW_BEFORE_S = 30 * 86400
#: The wildcard certificate's life: the most Apple's and Chrome's clients accept.
LEAF_DAYS = 397
CA_DAYS = 3650
#: Where the system keeps its CAs on Debian and its kin (others: the ssl module's default).
SYSTEM_BUNDLES = (Path("/etc/ssl/certs/ca-certificates.crt"), Path("/etc/pki/tls/cert.pem"))


@dataclass(frozen=True)
class LocalCa:
    """What a client of the local domain needs: the CA alone and the bundle with it."""

    ca_file: Path
    bundle_file: Path
    certificate: Certificate


def local_certificate(directory: Path, domain: str) -> LocalCa:
    """The local CA under `directory` (made if missing) and a wildcard certificate it
    signed for `domain` (made again unless the one there still serves it for a while)."""
    if shutil.which("openssl") is None:
        raise TlsError(
            "the openssl command is missing: it makes the local CA (apt install openssl)"
        )
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    directory.chmod(0o700)
    ca, ca_key = directory / "ca.pem", directory / "ca.key"
    cert, key = directory / "tls.pem", directory / "tls.key"
    if not (ca.is_file() and ca_key.is_file()):
        _make_ca(ca, ca_key)
        cert.unlink(missing_ok=True)  # signed by a CA that is gone
    try:
        current = check_certificate(cert, key, domain)
        fresh = current.not_after - time.time() > RENEW_BEFORE_S
    except TlsError:
        fresh = False
    if not fresh:
        _make_leaf(ca, ca_key, cert, key, public_name(domain))
        current = check_certificate(cert, key, domain)
    bundle = directory / "ca-bundle.pem"
    bundle.write_text(_system_cas() + ca.read_text())
    return LocalCa(ca, bundle, current)


def _make_ca(ca: Path, ca_key: Path) -> None:
    _openssl(
        "req", "-x509", *_new_key(ca_key), "-out", str(ca), "-days", str(CA_DAYS),
        "-subj", f"/CN=aenv local CA {_stamp()}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    ca_key.chmod(0o600)


def _make_leaf(ca: Path, ca_key: Path, cert: Path, key: Path, name: str) -> None:
    """A certificate for `*.{name}` and `{name}`, signed by the CA (a server certificate in
    every field rustls, Go and OpenSSL check: v3, SAN, serverAuth, not a CA)."""
    with tempfile.TemporaryDirectory(dir=cert.parent) as tmp:
        csr, ext = Path(tmp) / "tls.csr", Path(tmp) / "ext.cnf"
        ext.write_text(
            f"subjectAltName=DNS:*.{name},DNS:{name}\n"
            "basicConstraints=critical,CA:FALSE\n"
            "keyUsage=critical,digitalSignature\n"
            "extendedKeyUsage=serverAuth\n"
        )
        new_key = Path(tmp) / "tls.key"
        _openssl("req", "-new", *_new_key(new_key), "-out", str(csr), "-subj", f"/CN={name}")
        _openssl(
            "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
            "-set_serial", str(time.time_ns()), "-days", str(LEAF_DAYS),
            "-extfile", str(ext), "-out", str(cert),
        )  # fmt: skip
        new_key.chmod(0o600)
        new_key.replace(key)  # the old key stays until its certificate is replaced


def _new_key(path: Path) -> list[str]:
    """openssl arguments for a new unencrypted P-256 key written to `path` (made 0600
    before openssl writes it: it creates the file with the process's umask)."""
    path.touch(mode=0o600)
    path.chmod(0o600)
    return ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(path)]


def _openssl(*args: str) -> None:
    done = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise TlsError(f"openssl {args[0]} failed making the local CA: {done.stderr.strip()}")


def _stamp() -> str:
    """Tells CAs of different data dirs apart in a trust store listing."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())


def _system_cas() -> str:
    """The system's CA bundle, to which ours is added (empty if there is none)."""
    default = ssl.get_default_verify_paths().cafile
    for path in (*SYSTEM_BUNDLES, *([Path(default)] if default else [])):
        try:
            text = path.read_text()
        except OSError:
            continue
        return text if text.endswith("\n") else text + "\n"
    return ""
