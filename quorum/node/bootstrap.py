"""Bootstrap metadata written when a log dir is formatted (as Kafka's
`kafka-storage format --add-scram` writes bootstrap.checkpoint): SCRAM
credentials, so a new cluster whose listeners all need SASL can be reached.

`raftka storage format --add-scram 'SCRAM-SHA-256=[name=alice,password=alice-secret]'`
writes `bootstrap-scram.json` (salted credentials, never the password) into
the node's metadata log dir. The first active controller of a cluster that
never had a SCRAM credential appends them to the metadata log
(`ControllerService`); later failovers and restarts leave the log alone.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from common.errors import ConfigError
from common.security.sasl import (
    DEFAULT_SCRAM_ITERATIONS,
    SCRAM_MAX_ITERATIONS,
    SCRAM_MECHANISMS,
    SCRAM_MIN_ITERATIONS,
    ScramCredential,
)
from quorum.metadata.records import UserScramCredentialRecord

BOOTSTRAP_FILE = "bootstrap-scram.json"
_ADD_SCRAM = re.compile(r"^\s*(SCRAM-SHA-256|SCRAM-SHA-512)\s*=\s*\[(.*)\]\s*$")


def parse_add_scram(value: str) -> UserScramCredentialRecord:
    """One `--add-scram` value (kafka-storage's syntax) as a record."""
    m = _ADD_SCRAM.match(value)
    if not m:
        raise ConfigError(f"--add-scram {value!r}: expected MECHANISM=[name=USER,password=PASSWORD] with MECHANISM "
                          "SCRAM-SHA-256 or SCRAM-SHA-512 (optionally iterations=N)")
    mechanism = m.group(1)
    options = {}
    for item in m.group(2).split(","):
        key, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"--add-scram: {item!r} is not key=value")
        options[key.strip()] = raw.strip().strip('"')
    if not options.get("name") or "password" not in options:
        raise ConfigError("--add-scram needs name=USER and password=PASSWORD")
    iterations = int(options.get("iterations", DEFAULT_SCRAM_ITERATIONS))
    if not SCRAM_MIN_ITERATIONS <= iterations <= SCRAM_MAX_ITERATIONS:
        raise ConfigError(f"--add-scram iterations={iterations}: use {SCRAM_MIN_ITERATIONS}-{SCRAM_MAX_ITERATIONS}")
    c = ScramCredential.from_password(mechanism, options["password"], iterations=iterations)
    return UserScramCredentialRecord(name=options["name"], mechanism=SCRAM_MECHANISMS[mechanism], salt=c.salt,
                                     stored_key=c.stored_key, server_key=c.server_key, iterations=c.iterations)


def write_bootstrap(log_dir: str, records: list[UserScramCredentialRecord]) -> None:
    path = Path(log_dir) / BOOTSTRAP_FILE
    text = json.dumps([{"name": r.name, "mechanism": r.mechanism, "salt": r.salt.hex(),
                        "stored_key": r.stored_key.hex(), "server_key": r.server_key.hex(),
                        "iterations": r.iterations} for r in records], indent=1)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def read_bootstrap(log_dir: str) -> list[UserScramCredentialRecord]:
    path = Path(log_dir) / BOOTSTRAP_FILE
    if not path.exists():
        return []
    try:
        return [UserScramCredentialRecord(name=e["name"], mechanism=e["mechanism"], salt=bytes.fromhex(e["salt"]),
                                          stored_key=bytes.fromhex(e["stored_key"]),
                                          server_key=bytes.fromhex(e["server_key"]), iterations=e["iterations"])
                for e in json.loads(path.read_text())]
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path} is damaged ({exc}): format the dir again with --add-scram, or delete the file "
                          "and add the users with `raftka users add`") from None
