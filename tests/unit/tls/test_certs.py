"""The certificate check `aenv up` and the API role run before they listen
(`aenv.tls.certs`), and the local CA `aenv up` makes (`aenv.tls.localca`): real
certificates made by the real `openssl` command, checked by Python's own ssl."""

from __future__ import annotations

import shutil
import ssl
import stat
import subprocess
import time
from pathlib import Path

import pytest

from aenv.tls import LOCAL_DOMAIN, TlsError, TlsSettings, check_certificate, local_certificate
from aenv.tls import stack_tls as make_stack_tls

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_local_ca_signs_a_wildcard_for_the_domain(tmp_path: Path) -> None:
    ca = local_certificate(tmp_path / "tls", "aenv.localhost:8443")
    cert = ca.certificate
    assert cert.names == ("*.aenv.localhost", "aenv.localhost")
    assert _mode(tmp_path / "tls") == 0o700
    assert _mode(tmp_path / "tls" / "ca.key") == 0o600 and _mode(cert.key_file) == 0o600
    # what a client does: trusts the CA, checks the name (the SDK's hosts, with the port)
    client = ssl.create_default_context(cafile=str(ca.ca_file))
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert.cert_file, cert.key_file)
    for host in ("api.aenv.localhost", "49983-abc123.aenv.localhost", "8000-x.aenv.localhost"):
        _handshake(client, server, host)
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(client, server, "8000-x.other.localhost")
    # the bundle for SSL_CERT_FILE: the system's CAs, then ours
    bundle = ca.bundle_file.read_text()
    assert bundle.endswith(ca.ca_file.read_text())
    assert bundle.count("BEGIN CERTIFICATE") >= 1


def test_the_ca_is_kept_and_the_certificate_follows_the_domain(tmp_path: Path) -> None:
    first = local_certificate(tmp_path, "aenv.localhost")
    ca_pem = first.ca_file.read_text()
    again = local_certificate(tmp_path, "aenv.localhost:9443")  # another port: same names
    assert again.certificate == first.certificate
    other = local_certificate(tmp_path, "box.localhost")
    assert other.certificate.names == ("*.box.localhost", "box.localhost")
    assert other.ca_file.read_text() == ca_pem  # clients told to trust it still do
    verify = subprocess.run(
        ["openssl", "verify", "-CAfile", str(other.ca_file), str(other.certificate.cert_file)],
        capture_output=True,
        text=True,
    )
    assert verify.returncode == 0, verify.stderr


def test_a_certificate_for_another_domain_is_refused(tmp_path: Path) -> None:
    cert = local_certificate(tmp_path, "other.localhost").certificate
    with pytest.raises(TlsError) as e:
        check_certificate(cert.cert_file, cert.key_file, "aenv.localhost:8443")
    msg = str(e.value)
    assert str(cert.cert_file) in msg and "*.other.localhost" in msg
    assert "api.aenv.localhost" in msg and "*.aenv.localhost" in msg


def test_a_certificate_for_the_bare_domain_only_is_refused(tmp_path: Path) -> None:
    """`aenv.localhost` alone covers neither `api.` nor a sandbox host: a wildcard is needed."""
    key, cert = tmp_path / "k.pem", tmp_path / "c.pem"
    _self_signed(key, cert, "DNS:aenv.localhost,DNS:api.aenv.localhost")
    with pytest.raises(TlsError, match=r"not for 49983-sandbox\.aenv\.localhost"):
        check_certificate(cert, key, "aenv.localhost")


def test_a_key_of_another_certificate_is_refused(tmp_path: Path) -> None:
    a = local_certificate(tmp_path / "a", "aenv.localhost").certificate
    b = local_certificate(tmp_path / "b", "aenv.localhost").certificate
    with pytest.raises(TlsError, match="does not belong to the certificate"):
        check_certificate(a.cert_file, b.key_file, "aenv.localhost")


def test_missing_or_unreadable_files_are_named(tmp_path: Path) -> None:
    cert = local_certificate(tmp_path, "aenv.localhost").certificate
    with pytest.raises(TlsError, match=f"key {tmp_path / 'nope'}: no such file"):
        check_certificate(cert.cert_file, tmp_path / "nope", "aenv.localhost")
    with pytest.raises(TlsError, match="not a PEM certificate"):
        check_certificate(cert.key_file, cert.key_file, "aenv.localhost")


def test_a_certificate_out_of_its_dates_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(OpenSSL 3.0 makes no certificate dated in the past: the clock moves instead.)"""
    key, cert = tmp_path / "k.pem", tmp_path / "c.pem"
    _self_signed(key, cert, "DNS:*.aenv.localhost", days="30")
    now = time.time()
    monkeypatch.setattr(time, "time", lambda: now + 31 * 86400)
    with pytest.raises(TlsError, match="expired on"):
        check_certificate(cert, key, "aenv.localhost")
    monkeypatch.setattr(time, "time", lambda: now - 86400)
    with pytest.raises(TlsError, match="not valid before"):
        check_certificate(cert, key, "aenv.localhost")


def test_the_stack_uses_the_operators_certificate_or_its_own(tmp_path: Path) -> None:
    own = make_stack_tls(TlsSettings(tls_port=9443), tmp_path)
    assert own is not None and own.domain == f"{LOCAL_DOMAIN}:9443"
    assert own.client_env()["SSL_CERT_FILE"] == str(own.bundle_file)
    assert own.role_env()["AENV_SANDBOX_DOMAIN"] == "aenv.localhost:9443"
    assert make_stack_tls(TlsSettings(tls_port=0), tmp_path) is None
    on_443 = make_stack_tls(
        TlsSettings(tls_port=443, sandbox_domain="x.localhost"), tmp_path / "other"
    )
    assert on_443 is not None and on_443.domain == "x.localhost"
    given = make_stack_tls(
        TlsSettings(
            tls_cert_file=own.cert_file, tls_key_file=own.key_file, sandbox_domain="aenv.localhost"
        ),
        tmp_path / "unused",
    )
    assert given is not None and given.ca_file is None
    assert given.client_env() == {"E2B_DOMAIN": "aenv.localhost"}  # its issuer is trusted
    assert not (tmp_path / "unused").exists()  # no local CA made
    with pytest.raises(TlsError, match="go together"):
        make_stack_tls(TlsSettings(tls_cert_file=own.cert_file), tmp_path)
    with pytest.raises(TlsError, match="needs AENV_SANDBOX_DOMAIN"):
        make_stack_tls(
            TlsSettings(tls_cert_file=own.cert_file, tls_key_file=own.key_file), tmp_path
        )
    with pytest.raises(TlsError, match=r"not for api\.example\.com"):
        make_stack_tls(
            TlsSettings(
                tls_cert_file=own.cert_file, tls_key_file=own.key_file, sandbox_domain="example.com"
            ),
            tmp_path,
        )


def _handshake(client: ssl.SSLContext, server: ssl.SSLContext, host: str) -> None:
    """A TLS handshake between the two contexts in memory, the client asking for `host`."""
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    c = client.wrap_bio(c_in, c_out, server_hostname=host)
    s = server.wrap_bio(s_in, s_out, server_side=True)
    done = {"c": False, "s": False}
    for _ in range(10):
        for name, end, out, peer_in in (("c", c, c_out, s_in), ("s", s, s_out, c_in)):
            if not done[name]:
                try:
                    end.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
            peer_in.write(out.read())
        if all(done.values()):
            return
    raise AssertionError("handshake did not finish")


def _self_signed(key: Path, cert: Path, san: str, days: str = "30") -> None:
    """A self-signed certificate for `san` (not from the local CA: any issuer will do)."""
    args = ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"]
    args += ["-nodes", "-keyout", str(key), "-out", str(cert), "-subj", "/CN=t"]
    args += ["-addext", f"subjectAltName={san}", "-days", days]
    done = subprocess.run(args, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
