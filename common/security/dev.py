"""Throwaway security for `raftka dev --secure` and `raftka cluster up --secure`:
a CA, a node certificate and an admin SCRAM password under one directory,
made once and reused, and the settings clients need."""

from __future__ import annotations

import dataclasses
import secrets
from pathlib import Path

from common.security.certs import CertificateAuthority

ADMIN_USER = "admin"


@dataclasses.dataclass(frozen=True)
class DevSecurity:
    directory: Path
    ca_path: Path
    keystore: Path
    password: str = dataclasses.field(repr=False)

    @classmethod
    def ensure(cls, directory: Path, hosts: tuple[str, ...]) -> DevSecurity:
        directory.mkdir(parents=True, exist_ok=True)
        ca_path, keystore, password_file = directory / "ca.pem", directory / "node.pem", directory / "admin.password"
        if not (ca_path.exists() and keystore.exists() and password_file.exists()):
            ca = CertificateAuthority("raftka-dev-ca")
            ca.write_ca(ca_path)
            ca.write_keystore(keystore, "localhost", tuple(dict.fromkeys(("localhost", "127.0.0.1", *hosts))))
            password_file.write_text(secrets.token_urlsafe(18))
            password_file.chmod(0o600)
        return cls(directory, ca_path, keystore, password_file.read_text().strip())

    def listener_properties(self, listener: str) -> dict[str, str]:
        """The keys of a SASL_SSL listener named `listener` accepting the admin
        (SCRAM for clients; PLAIN for the node's own links to it)."""
        plain_jaas = ('org.apache.kafka.common.security.plain.PlainLoginModule required '
                      f'username="{ADMIN_USER}" password="{self.password}" user_{ADMIN_USER}="{self.password}";')
        return {
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.keystore),
            "ssl.truststore.location": str(self.ca_path),
            "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512,PLAIN",
            f"listener.name.{listener.lower()}.plain.sasl.jaas.config": plain_jaas,
        }

    def scram_bootstrap(self) -> list[str]:
        """`--add-scram` values for the admin user."""
        return [f"{m}=[name={ADMIN_USER},password={self.password}]" for m in ("SCRAM-SHA-256", "SCRAM-SHA-512")]

    def client_settings(self, bootstrap: str, mechanism: str = "SCRAM-SHA-512") -> list[str]:
        """`key=value` lines in librdkafka's keys."""
        return [f"bootstrap.servers={bootstrap}", "security.protocol=SASL_SSL", f"sasl.mechanism={mechanism}",
                f"sasl.username={ADMIN_USER}", f"sasl.password={self.password}", f"ssl.ca.location={self.ca_path}"]

    def write_client_files(self, bootstrap: str, mechanism: str = "SCRAM-SHA-512") -> None:
        """client.properties for Java-style clients, client-librdkafka.properties for librdkafka."""
        module = "plain.PlainLoginModule" if mechanism == "PLAIN" else "scram.ScramLoginModule"
        jaas = (f'org.apache.kafka.common.security.{module} required '
                f'username="{ADMIN_USER}" password="{self.password}";')
        java = (f"bootstrap.servers={bootstrap}\nsecurity.protocol=SASL_SSL\nsasl.mechanism={mechanism}\n"
                f"sasl.jaas.config={jaas}\nssl.truststore.type=PEM\nssl.truststore.location={self.ca_path}\n")
        for name, text in (("client.properties", java),
                           ("client-librdkafka.properties", "".join(f"{line}\n" for line in self.client_settings(bootstrap, mechanism)))):
            path = self.directory / name
            path.write_text(text)
            path.chmod(0o600)
