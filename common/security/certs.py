"""Throwaway certificates for development and tests: a CA, and certificates
it signs for nodes (with their host names and addresses) and for clients.
Not for production: keys are unencrypted unless a password is given."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

_VALID_DAYS = 365


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attributes.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attributes)


class CertificateAuthority:
    def __init__(self, common_name: str = "raftka-dev-ca") -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        self.name = _name(common_name)
        self.cert = (x509.CertificateBuilder().subject_name(self.name).issuer_name(self.name)
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - datetime.timedelta(minutes=5))
                     .not_valid_after(now + datetime.timedelta(days=_VALID_DAYS))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .sign(self.key, hashes.SHA256()))

    @property
    def cert_pem(self) -> str:
        return self.cert.public_bytes(serialization.Encoding.PEM).decode()

    def issue(self, common_name: str, hosts: tuple[str, ...] = (), organization: str | None = None,
              password: str | None = None) -> tuple[str, str]:
        """(certificate chain PEM, private key PEM) for `common_name`, valid for `hosts`."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        builder = (x509.CertificateBuilder().subject_name(_name(common_name, organization)).issuer_name(self.name)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=_VALID_DAYS)))
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        encryption = (serialization.BestAvailableEncryption(password.encode()) if password
                      else serialization.NoEncryption())
        key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption).decode()
        return cert.public_bytes(serialization.Encoding.PEM).decode() + self.cert_pem, key_pem

    def write_keystore(self, path: Path, common_name: str, hosts: tuple[str, ...] = (),
                       organization: str | None = None, password: str | None = None) -> Path:
        """A PEM keystore (private key, then the chain) as Kafka's `ssl.keystore.type=PEM` reads it."""
        chain, key = self.issue(common_name, hosts, organization, password)
        path.write_text(key + chain)
        path.chmod(0o600)
        return path

    def write_ca(self, path: Path) -> Path:
        path.write_text(self.cert_pem)
        return path
