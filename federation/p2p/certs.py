"""The federation's certificates (the ``cryptography`` library): a CA made for one federation and one
certificate per center, whose common name ``center-<i>`` is the identity a peer checks on every
message (docs/p2p.md, "Trust").
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from federation.p2p.transport import TlsFiles, common_name

__all__ = ["make_federation_certs", "make_ca", "issue"]


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "abps federation"),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(path: Path, data: bytes, private: bool = False) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    if private:
        os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def make_ca(days: int = 30) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A new self-signed CA (P-256 key) valid ``days`` days."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name("abps federation CA")).issuer_name(_name("abps federation CA"))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(key, hashes.SHA256()))
    return key, cert


def issue(ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, index: int, hosts: list[str],
          days: int = 30) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) of center ``index``: common name and DNS name ``center-<index>``,
    plus ``hosts`` (names or IP addresses) as subject alternative names; client and server use."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cn = common_name(index)
    alt: list[x509.GeneralName] = [x509.DNSName(cn)]
    for h in hosts:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            alt.append(x509.DNSName(h))
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH,
                                                  x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), pem


def make_federation_certs(folder: str | Path, hosts: dict[int, str]) -> dict[int, TlsFiles]:
    """Write ``ca.pem`` and ``center-<i>.pem`` / ``center-<i>.key`` for every center into ``folder``
    (the CA's key is never written: no one can issue another certificate of this federation).

    Args:
        hosts: ``{index: host}`` the center's address names (added to its certificate).

    Returns:
        ``{index: TlsFiles}``.
    """
    d = Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = make_ca()
    _write(d / "ca.pem", ca_cert.public_bytes(serialization.Encoding.PEM))
    out = {}
    for i, host in sorted(hosts.items()):
        cert, key = issue(ca_key, ca_cert, i, sorted({host, "localhost", "127.0.0.1"}))
        _write(d / f"{common_name(i)}.pem", cert)
        _write(d / f"{common_name(i)}.key", key, private=True)
        out[i] = TlsFiles(d / "ca.pem", d / f"{common_name(i)}.pem", d / f"{common_name(i)}.key")
    return out
