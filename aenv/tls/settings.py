"""HTTPS for the sandbox domain: the operator's settings and what a stack makes of them.

`aenv up` serves `https://api.{domain}` and `https://{port}-{sandboxId}.{domain}` on its
TLS port besides the plain API port (which keeps serving `E2B_API_URL`/`E2B_SANDBOX_URL`
clients as before): with the operator's certificate when one is given
(`AENV_TLS_CERT_FILE`/`AENV_TLS_KEY_FILE`, for `AENV_SANDBOX_DOMAIN`), else with a
wildcard certificate of a local CA for `aenv.localhost` (`localca`). An API role started
alone (a fleet) serves HTTPS only with a given certificate.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict

from aenv.tls.certs import TlsError, check_certificate
from aenv.tls.localca import local_certificate

__all__ = ["LOCAL_DOMAIN", "StackTls", "TlsSettings", "stack_tls"]

#: The local domain of `aenv up`: every `*.localhost` name is this machine (RFC 6761), which
#: glibc resolves through `libnss-myhostname` (scripts/setup.sh), no resolver of ours.
LOCAL_DOMAIN = "aenv.localhost"


class TlsSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AENV_", frozen=True, extra="ignore")

    #: Port of the HTTPS listener (on the API's address); 0: no HTTPS (`aenv up` only: a
    #: role alone serves HTTPS exactly when it is given a certificate).
    tls_port: int = 8443
    #: The operator's certificate (PEM, leaf first, covering `*.{domain}`) and its key.
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    #: The domain clients are given (`E2B_DOMAIN`; also the create answers' `domain`), with
    #: a port when it is not 443. `aenv up`: `aenv.localhost:{tls_port}` by default.
    sandbox_domain: str | None = None

    def given(self) -> tuple[Path, Path] | None:
        """The operator's certificate and key, or None; `TlsError` for half of them."""
        if self.tls_cert_file is None and self.tls_key_file is None:
            return None
        if self.tls_cert_file is None or self.tls_key_file is None:
            raise TlsError("AENV_TLS_CERT_FILE and AENV_TLS_KEY_FILE go together: set both")
        if not self.sandbox_domain:
            raise TlsError(
                "AENV_TLS_CERT_FILE needs AENV_SANDBOX_DOMAIN, the domain the certificate "
                "serves (as clients use it in E2B_DOMAIN)"
            )
        return self.tls_cert_file, self.tls_key_file


@dataclass(frozen=True)
class StackTls:
    """What the stack serves HTTPS with, and what its clients are told."""

    domain: str
    port: int
    cert_file: Path
    key_file: Path
    #: the local CA (for `NODE_EXTRA_CA_CERTS`) and the system's CAs with it (for
    #: `SSL_CERT_FILE`); None with the operator's certificate (clients trust its issuer)
    ca_file: Path | None = None
    bundle_file: Path | None = None

    def role_env(self) -> dict[str, str]:
        """What the API role is started with to serve it."""
        return {
            "AENV_TLS_PORT": str(self.port),
            "AENV_TLS_CERT_FILE": str(self.cert_file),
            "AENV_TLS_KEY_FILE": str(self.key_file),
            "AENV_SANDBOX_DOMAIN": self.domain,
        }

    def client_env(self) -> dict[str, str]:
        """What a client needs besides its API key (`aenv up` prints it)."""
        env = {"E2B_DOMAIN": self.domain}
        if self.bundle_file is not None and self.ca_file is not None:
            env |= {
                "SSL_CERT_FILE": str(self.bundle_file),
                "NODE_EXTRA_CA_CERTS": str(self.ca_file),
            }
        return env


def stack_tls(settings: TlsSettings, data_dir: Path) -> StackTls | None:
    """How `aenv up` serves HTTPS (None: it does not, `AENV_TLS_PORT=0`); `TlsError` when
    the operator's certificate cannot serve the domain, or the local CA cannot be made."""
    given = settings.given()
    if given is not None:
        assert settings.sandbox_domain is not None  # `given` checked it
        if settings.tls_port == 0:
            raise TlsError("AENV_TLS_PORT=0 turns HTTPS off, yet a certificate is given")
        cert = check_certificate(*given, settings.sandbox_domain)
        return StackTls(settings.sandbox_domain, settings.tls_port, cert.cert_file, cert.key_file)
    if settings.tls_port == 0:
        return None
    domain = settings.sandbox_domain or LOCAL_DOMAIN
    if ":" not in domain and settings.tls_port != 443:
        domain = f"{domain}:{settings.tls_port}"  # clients reach the port it listens on
    local = local_certificate(data_dir / "tls", domain)
    cert = local.certificate
    return StackTls(
        domain, settings.tls_port, cert.cert_file, cert.key_file, local.ca_file, local.bundle_file
    )
