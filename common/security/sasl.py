"""SASL mechanisms on the server side: PLAIN (RFC 4616) and SCRAM-SHA-256/512
(RFC 5802, RFC 7677), as Kafka speaks them in SaslAuthenticate (KIP-152).

Pure: an exchange takes the client's token and gives the server's answer;
the wire server (`common.wire.authenticate`) carries the tokens. A failed
exchange raises `SaslAuthenticationError` with the message the client is
sent (no secret in it).

PLAIN users come from the JAAS text Kafka uses,
`listener.name.<listener>.plain.sasl.jaas.config` (or `sasl.jaas.config`):
`...PlainLoginModule required username="admin" password="..." user_admin="..." user_alice="...";`
-- each `user_<name>="<password>"` is a user. SCRAM credentials (salted,
never the password) live in the metadata log (KIP-554); the server is
given a lookup for them.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import os
import re
from collections.abc import Callable, Mapping

from common.errors import ConfigError, RaftkaError

PLAIN = "PLAIN"
SCRAM_SHA_256 = "SCRAM-SHA-256"
SCRAM_SHA_512 = "SCRAM-SHA-512"
#: Kafka's ScramMechanism ids, as UserScramCredentialRecord carries them.
SCRAM_MECHANISMS = {SCRAM_SHA_256: 1, SCRAM_SHA_512: 2}
SCRAM_HASHES = {SCRAM_SHA_256: "sha256", SCRAM_SHA_512: "sha512"}
MECHANISMS = (PLAIN, SCRAM_SHA_256, SCRAM_SHA_512)
#: Kafka's minimum and default iteration counts for SCRAM credentials.
SCRAM_MIN_ITERATIONS = 4096
SCRAM_MAX_ITERATIONS = 16384
DEFAULT_SCRAM_ITERATIONS = 4096
_JAAS_OPTION = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')


class SaslAuthenticationError(RaftkaError):
    """The client's credentials or exchange were refused; the text goes to the client."""


@dataclasses.dataclass(frozen=True)
class ScramCredential:
    """What the server keeps of a SCRAM password (RFC 5802 section 3)."""

    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    @classmethod
    def from_password(cls, mechanism: str, password: str, *, iterations: int = DEFAULT_SCRAM_ITERATIONS,
                      salt: bytes | None = None) -> ScramCredential:
        digest = SCRAM_HASHES[mechanism]
        salt = os.urandom(32) if salt is None else salt
        salted = hashlib.pbkdf2_hmac(digest, password.encode(), salt, iterations)
        return cls.from_salted_password(mechanism, salted, salt, iterations)

    @classmethod
    def from_salted_password(cls, mechanism: str, salted: bytes, salt: bytes, iterations: int) -> ScramCredential:
        """From SaltedPassword (what AlterUserScramCredentials carries, KIP-554)."""
        digest = SCRAM_HASHES[mechanism]
        client_key = hmac.digest(salted, b"Client Key", digest)
        return cls(salt, hashlib.new(digest, client_key).digest(), hmac.digest(salted, b"Server Key", digest),
                   iterations)


def parse_jaas_users(text: str) -> dict[str, str]:
    """`user_<name>="<password>"` options of a JAAS login module line."""
    return {key[len("user_"):]: value.replace('\\"', '"')
            for key, value in _JAAS_OPTION.findall(text) if key.startswith("user_")}


def parse_jaas_login(text: str) -> tuple[str, str] | None:
    """The `username` and `password` options (the node's own credentials), if both are there."""
    options = dict(_JAAS_OPTION.findall(text))
    if "username" in options and "password" in options:
        return options["username"], options["password"].replace('\\"', '"')
    return None


@dataclasses.dataclass(frozen=True, eq=False)
class SaslServerConfig:
    """A SASL listener's mechanisms and its PLAIN users."""

    mechanisms: tuple[str, ...]
    plain_users: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: `connections.max.reauth.ms` per mechanism (KIP-368); 0: sessions do not expire.
    max_reauth_ms: Mapping[str, int] = dataclasses.field(default_factory=dict)

    def session_lifetime_ms(self, mechanism: str) -> int:
        """How long a session authenticated with `mechanism` lasts before the
        client must re-authenticate (0: for ever)."""
        return self.max_reauth_ms.get(mechanism, 0)

    @classmethod
    def from_properties(cls, props: Mapping[str, str], listener: str) -> SaslServerConfig:
        prefix = f"listener.name.{listener.lower()}."
        raw = props.get(prefix + "sasl.enabled.mechanisms") or props.get("sasl.enabled.mechanisms") \
            or ",".join(MECHANISMS)
        mechanisms = tuple(m.strip().upper() for m in raw.split(",") if m.strip())
        unknown = [m for m in mechanisms if m not in MECHANISMS]
        if unknown or not mechanisms:
            raise ConfigError(f"sasl.enabled.mechanisms={raw!r}: raftka offers {', '.join(MECHANISMS)} "
                              f"(not {', '.join(unknown) or 'nothing'})")
        jaas = (props.get(prefix + "plain.sasl.jaas.config") or props.get(prefix + "sasl.jaas.config")
                or props.get("sasl.jaas.config") or "")
        users = parse_jaas_users(jaas)
        if PLAIN in mechanisms and not users:
            raise ConfigError(f"listener {listener} enables SASL PLAIN but no user is configured: set "
                              f"listener.name.{listener.lower()}.plain.sasl.jaas.config to "
                              "'org.apache.kafka.common.security.plain.PlainLoginModule required "
                              'user_alice="alice-secret";\' (one user_<name>="<password>" per user)')
        return cls(mechanisms, users, {m: _max_reauth_ms(props, prefix, m) for m in mechanisms})


def _max_reauth_ms(props: Mapping[str, str], prefix: str, mechanism: str) -> int:
    """Kafka's `connections.max.reauth.ms`, most specific first:
    `listener.name.<listener>.<mechanism>.`, `listener.name.<listener>.`, the broker's."""
    for key in (f"{prefix}{mechanism.lower()}.connections.max.reauth.ms", f"{prefix}connections.max.reauth.ms",
                "connections.max.reauth.ms"):
        raw = props.get(key)
        if raw is None or not raw.strip():
            continue
        try:
            value = int(raw)
        except ValueError:
            raise ConfigError(f"{key}={raw!r} is not a number of milliseconds; set it to 0 (sessions never "
                              "expire) or a positive number of milliseconds") from None
        if value < 0:
            raise ConfigError(f"{key}={value}: must be 0 (sessions never expire) or positive")
        return value
    return 0


ScramLookup = Callable[[str, str], "ScramCredential | None"]


class PlainExchange:
    """PLAIN: one token, `authzid NUL authcid NUL password`."""

    mechanism = PLAIN

    def __init__(self, users: Mapping[str, str]) -> None:
        self.users = users
        self.user: str | None = None
        self.complete = False

    def step(self, token: bytes) -> bytes:
        parts = token.split(b"\0")
        if len(parts) != 3:
            raise SaslAuthenticationError("Invalid SASL/PLAIN request: expected 3 tokens")
        authzid, authcid, password = (p.decode("utf-8", "replace") for p in parts)
        if not authcid:
            raise SaslAuthenticationError("Authentication failed: username not specified")
        if authzid and authzid != authcid:
            raise SaslAuthenticationError("Authentication failed: Client requested an authorization id that is "
                                          "different from username")
        expected = self.users.get(authcid)
        # compare_digest even for an unknown user: no timing hint of which users exist.
        if not hmac.compare_digest((expected or "\0").encode(), password.encode()) or expected is None:
            raise SaslAuthenticationError("Authentication failed: Invalid username or password")
        self.user = authcid
        self.complete = True
        return b""


class ScramExchange:
    """SCRAM-SHA-256/512, server side: client-first, server-first,
    client-final, server-final (RFC 5802 section 5)."""

    def __init__(self, mechanism: str, lookup: ScramLookup, nonce: bytes | None = None) -> None:
        self.mechanism = mechanism
        self.digest = SCRAM_HASHES[mechanism]
        self.lookup = lookup
        self.user: str | None = None
        self.complete = False
        self._server_nonce = base64.b64encode(nonce or os.urandom(24)).decode().rstrip("=")
        self._state = "client-first"
        self._credential: ScramCredential | None = None
        self._auth_prefix = ""
        self._nonce = ""
        self._gs2 = ""

    def _fail(self, why: str | None = None) -> SaslAuthenticationError:
        self._state = "failed"
        return SaslAuthenticationError(why or f"Authentication failed during authentication due to invalid "
                                       f"credentials with SASL mechanism {self.mechanism}")

    def step(self, token: bytes) -> bytes:
        try:
            text = token.decode("utf-8")
        except UnicodeDecodeError:
            raise self._fail("Invalid SCRAM message: not UTF-8") from None
        if self._state == "client-first":
            return self._client_first(text)
        if self._state == "client-final":
            return self._client_final(text)
        raise self._fail(f"Invalid SCRAM exchange: no message expected in state {self._state}")

    def _client_first(self, text: str) -> bytes:
        gs2_flag, sep, rest = text.partition(",")
        authzid, sep2, bare = rest.partition(",")
        if not sep or not sep2 or gs2_flag not in ("n", "y"):
            raise self._fail("Invalid SCRAM client first message (channel binding is not supported)")
        attrs = _attributes(bare)
        user, nonce = attrs.get("n"), attrs.get("r")
        if not user or not nonce:
            raise self._fail("Invalid SCRAM client first message: no user name or nonce")
        user = user.replace("=2C", ",").replace("=3D", "=")
        credential = self.lookup(self.mechanism, user)
        if credential is None:
            raise self._fail()
        self.user, self._credential = user, credential
        self._gs2 = f"{gs2_flag},{authzid},"
        self._nonce = nonce + self._server_nonce
        server_first = (f"r={self._nonce},s={base64.b64encode(credential.salt).decode()},"
                        f"i={credential.iterations}")
        self._auth_prefix = f"{bare},{server_first}"
        self._state = "client-final"
        return server_first.encode()

    def _client_final(self, text: str) -> bytes:
        without_proof, sep, proof_attr = text.rpartition(",p=")
        attrs = _attributes(without_proof)
        credential = self._credential
        assert credential is not None
        if not sep or attrs.get("r") != self._nonce:
            raise self._fail("Invalid SCRAM client final message: wrong nonce")
        if attrs.get("c") != base64.b64encode(self._gs2.encode()).decode():
            raise self._fail("Invalid SCRAM client final message: channel binding is not supported")
        try:
            proof = base64.b64decode(proof_attr, validate=True)
        except ValueError:
            raise self._fail() from None
        auth_message = f"{self._auth_prefix},{without_proof}".encode()
        signature = hmac.digest(credential.stored_key, auth_message, self.digest)
        if len(proof) != len(signature):
            raise self._fail()
        client_key = bytes(a ^ b for a, b in zip(proof, signature))
        if not hmac.compare_digest(hashlib.new(self.digest, client_key).digest(), credential.stored_key):
            raise self._fail()
        self.complete = True
        self._state = "done"
        verifier = hmac.digest(credential.server_key, auth_message, self.digest)
        return f"v={base64.b64encode(verifier).decode()}".encode()


def _attributes(text: str) -> dict[str, str]:
    out = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if sep and len(key) == 1:
            out.setdefault(key, value)
    return out


def new_exchange(mechanism: str, config: SaslServerConfig, lookup: ScramLookup | None) -> PlainExchange | ScramExchange:
    if mechanism == PLAIN:
        return PlainExchange(config.plain_users)
    return ScramExchange(mechanism, lookup or (lambda _m, _u: None))
