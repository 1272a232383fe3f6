"""HTTPS for the sandbox domain: the certificate check (`certs`), the local CA `aenv up`
makes (`localca`), and the settings that choose between them (`settings`)."""

from aenv.tls.certs import Certificate, TlsError, check_certificate, public_name
from aenv.tls.localca import LocalCa, local_certificate
from aenv.tls.settings import LOCAL_DOMAIN, StackTls, TlsSettings, stack_tls

__all__ = [
    "LOCAL_DOMAIN",
    "Certificate",
    "LocalCa",
    "StackTls",
    "TlsError",
    "TlsSettings",
    "check_certificate",
    "local_certificate",
    "public_name",
    "stack_tls",
]
