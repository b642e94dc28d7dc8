"""TLS for the Kafka-protocol server: contexts from Kafka's `ssl.*` keys,
and a TLS connection the server drives like its plain socket (I/O shell).

Theory of operation
-------------------
The server reads with `recv_into` and writes with `sendmsg`/`send` on a
non-blocking socket, waiting through trio only when the kernel says so.
`TlsSocket` offers those calls over an `ssl.SSLObject` between two memory
BIOs: ciphertext moves between the kernel and the BIOs, plaintext between
the BIOs and the server's buffers. So a TLS connection runs the same
reader, pipeline and writer as a plaintext one. What differs:

- No sendfile: the kernel cannot encrypt. Record bytes are read from the
  segment files (`os.pread`, the server's `file_transfer="pread"`) and
  encrypted from memory: one copy more than a plaintext Fetch.
- `recv_into` decrypts records until the caller's buffer is full or the
  kernel has nothing more, so a short read still means "drained" (the
  reader then waits for readability; plaintext left inside the SSL object
  would never wake it).
- A `sendmsg` encrypts everything it is given. When the kernel does not
  take all the ciphertext, it reports the last plaintext byte as unsent;
  the caller, which always retries with the unsent rest, then waits for
  writability and sends that byte again, and this call only flushes the
  held ciphertext and counts the byte as sent. So "all sent" keeps meaning
  "all on the wire".

Keys (Kafka's names; `listener.name.<listener>.` before a key overrides it
for one listener): `ssl.keystore.type` PEM or PKCS12 (JKS: convert with
keytool), `ssl.keystore.location`, `ssl.keystore.password`,
`ssl.key.password`, `ssl.keystore.certificate.chain` and `ssl.keystore.key`
(PEM text in the config), `ssl.truststore.type`, `ssl.truststore.location`,
`ssl.truststore.password`, `ssl.truststore.certificates`,
`ssl.client.auth` (required, requested, none), `ssl.enabled.protocols`
(TLSv1.2, TLSv1.3), `ssl.principal.mapping.rules`.
"""

from __future__ import annotations

import os
import re
import socket
import ssl
import tempfile
from collections.abc import Callable, Mapping

import trio

from common.errors import ConfigError

CLIENT_AUTH = ("required", "requested", "none")
_PROTOCOLS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
#: Bytes of ciphertext asked of the kernel per read.
_RECV_BYTES = 256 * 1024
#: X.500 attribute names as Java's X500Principal.getName() writes them (RFC 2253).
_DN_NAMES = {"commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU", "countryName": "C",
             "localityName": "L", "stateOrProvinceName": "ST", "streetAddress": "STREET",
             "domainComponent": "DC", "userId": "UID"}


def listener_lookup(props: Mapping[str, str], listener: str) -> Callable[[str], str | None]:
    """A key's value for `listener`: `listener.name.<listener>.<key>` first, then `<key>`."""
    prefix = f"listener.name.{listener.lower()}."

    def get(key: str) -> str | None:
        value = props.get(prefix + key)
        return value if value is not None else props.get(key)

    return get


def server_context(props: Mapping[str, str], listener: str) -> ssl.SSLContext:
    """The server-side SSLContext of `listener`, from Kafka's `ssl.*` keys.
    A ConfigError names the key that is missing or wrong."""
    get = listener_lookup(props, listener)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    client_auth = (get("ssl.client.auth") or "none").strip().lower()
    if client_auth not in CLIENT_AUTH:
        raise ConfigError(f"ssl.client.auth={client_auth!r}: use one of {', '.join(CLIENT_AUTH)}")
    _set_protocols(context, get)
    _load_keystore(context, get, listener)
    context.verify_mode = {"required": ssl.CERT_REQUIRED, "requested": ssl.CERT_OPTIONAL,
                           "none": ssl.CERT_NONE}[client_auth]
    if _load_truststore(context, get) is False and client_auth != "none":
        raise ConfigError(f"ssl.client.auth={client_auth} on listener {listener} needs ssl.truststore.location "
                          "(or ssl.truststore.certificates): the CA that signs the clients' certificates")
    return context


def client_context(props: Mapping[str, str], listener: str = "") -> ssl.SSLContext:
    """A client-side SSLContext (the broker's own links): the truststore to
    verify the server, the keystore if one is configured (mutual TLS)."""
    get = listener_lookup(props, listener) if listener else props.get
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    _set_protocols(context, get)
    if not _load_truststore(context, get):
        context.load_default_certs()
    # Kafka's ssl.endpoint.identification.algorithm: https (check the host) unless set empty.
    context.check_hostname = (get("ssl.endpoint.identification.algorithm") or "https").strip() != ""
    if get("ssl.keystore.location") or get("ssl.keystore.certificate.chain"):
        _load_keystore(context, get, listener or "client")
    return context


def _set_protocols(context: ssl.SSLContext, get: Callable[[str], str | None]) -> None:
    raw = get("ssl.enabled.protocols") or "TLSv1.2,TLSv1.3"
    wanted = [p.strip() for p in raw.split(",") if p.strip()]
    unknown = [p for p in wanted if p not in _PROTOCOLS]
    if unknown or not wanted:
        raise ConfigError(f"ssl.enabled.protocols={raw!r}: raftka speaks {', '.join(_PROTOCOLS)}")
    versions = sorted(_PROTOCOLS[p] for p in wanted)
    context.minimum_version, context.maximum_version = versions[0], versions[-1]


def _load_keystore(context: ssl.SSLContext, get: Callable[[str], str | None], listener: str) -> None:
    kind = (get("ssl.keystore.type") or "PEM").strip().upper()
    location = get("ssl.keystore.location")
    chain, key = get("ssl.keystore.certificate.chain"), get("ssl.keystore.key")
    password = get("ssl.key.password") or get("ssl.keystore.password")
    if chain or key:
        if not (chain and key):
            raise ConfigError("ssl.keystore.certificate.chain and ssl.keystore.key go together: give both PEM texts")
        _load_pem_text(context, chain, key, password)
        return
    if not location:
        raise ConfigError(f"listener {listener} uses TLS but ssl.keystore.location is not set: give the PEM (or "
                          "PKCS12) file with this node's certificate and private key, or set "
                          "listener.name.<listener>.ssl.keystore.location")
    if not os.path.isfile(location):
        raise ConfigError(f"ssl.keystore.location={location}: no such file")
    if kind == "PEM":
        try:
            context.load_cert_chain(location, password=password)
        except ssl.SSLError as exc:
            raise ConfigError(f"ssl.keystore.location={location}: not a PEM certificate chain with its private key, "
                              f"or ssl.key.password is wrong ({exc.reason or exc})") from None
    elif kind == "PKCS12":
        _load_pkcs12(context, location, get("ssl.keystore.password"))
    elif kind == "JKS":
        raise ConfigError(f"ssl.keystore.type=JKS ({location}): raftka reads PEM and PKCS12; convert with "
                          "`keytool -importkeystore -srckeystore KS.jks -destkeystore KS.p12 -deststoretype PKCS12`")
    else:
        raise ConfigError(f"ssl.keystore.type={kind}: use PEM or PKCS12")


def _load_pem_text(context: ssl.SSLContext, chain: str, key: str, password: str | None) -> None:
    # load_cert_chain reads files only: a private temporary file, gone at once.
    with tempfile.TemporaryDirectory(prefix="raftka-ssl-") as tmp:
        path = os.path.join(tmp, "keystore.pem")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(_pem(key) + "\n" + _pem(chain) + "\n")
        try:
            context.load_cert_chain(path, password=password)
        except ssl.SSLError as exc:
            raise ConfigError("ssl.keystore.certificate.chain / ssl.keystore.key: not a PEM certificate chain and "
                              f"its private key, or ssl.key.password is wrong ({exc.reason or exc})") from None


def _pem(text: str) -> str:
    """PEM text from a properties value, where newlines may have been written as `\\n`."""
    return text.replace("\\n", "\n").strip()


def _load_pkcs12(context: ssl.SSLContext, location: str, password: str | None) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.serialization import pkcs12

    try:
        with open(location, "rb") as f:
            key, cert, extra = pkcs12.load_key_and_certificates(f.read(), password.encode() if password else None)
    except ValueError as exc:
        raise ConfigError(f"ssl.keystore.location={location}: cannot open it as PKCS12 with ssl.keystore.password "
                          f"({exc})") from None
    if key is None or cert is None:
        raise ConfigError(f"ssl.keystore.location={location}: the PKCS12 file holds no private key and certificate")
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    chain_pem = "".join(c.public_bytes(serialization.Encoding.PEM).decode() for c in [cert, *(extra or [])])
    _load_pem_text(context, chain_pem, key_pem, None)


def _load_truststore(context: ssl.SSLContext, get: Callable[[str], str | None]) -> bool:
    """Load the CAs; False if none is configured."""
    inline = get("ssl.truststore.certificates")
    location = get("ssl.truststore.location")
    kind = (get("ssl.truststore.type") or "PEM").strip().upper()
    if inline:
        try:
            context.load_verify_locations(cadata=_pem(inline))
        except ssl.SSLError as exc:
            raise ConfigError(f"ssl.truststore.certificates: not PEM certificates ({exc.reason or exc})") from None
        return True
    if not location:
        return False
    if not os.path.isfile(location):
        raise ConfigError(f"ssl.truststore.location={location}: no such file")
    if kind == "PKCS12":
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.serialization import pkcs12

        password = get("ssl.truststore.password")
        with open(location, "rb") as f:
            bundle = pkcs12.load_pkcs12(f.read(), password.encode() if password else None)
        pems = "".join(c.certificate.public_bytes(serialization.Encoding.PEM).decode()
                       for c in bundle.additional_certs)
        context.load_verify_locations(cadata=pems)
        return True
    if kind != "PEM":
        raise ConfigError(f"ssl.truststore.type={kind}: use PEM or PKCS12 (convert JKS with keytool)")
    try:
        context.load_verify_locations(cafile=location)
    except ssl.SSLError as exc:
        raise ConfigError(f"ssl.truststore.location={location}: not PEM certificates ({exc.reason or exc})") from None
    return True


class PrincipalMapper:
    """`ssl.principal.mapping.rules` (KIP-371): a certificate's subject DN
    to a user name. DEFAULT keeps the DN (`CN=app,O=org`);
    `RULE:pattern/replacement/[LU]` rewrites a matching DN."""

    _RULE = re.compile(r"RULE:((?:\\.|[^/\\])*)/((?:\\.|[^/\\])*)/([LU]?)")

    def __init__(self, rules: str | None = None) -> None:
        self.rules: list[tuple[re.Pattern[str], str, str] | None] = []
        text = (rules or "DEFAULT").strip()
        pos = 0
        while pos < len(text):
            if text.startswith("DEFAULT", pos):
                self.rules.append(None)
                pos += len("DEFAULT")
            else:
                m = self._RULE.match(text, pos)
                if not m:
                    raise ConfigError(f"ssl.principal.mapping.rules: cannot read {text[pos:]!r}; use DEFAULT or "
                                      "RULE:pattern/replacement/ (optionally /L or /U), separated by commas")
                replacement = re.sub(r"\$(\d)", r"\\\1", m.group(2))
                self.rules.append((re.compile(m.group(1)), replacement, m.group(3)))
                pos = m.end()
            while pos < len(text) and text[pos] in ", \n":
                pos += 1

    def name(self, dn: str) -> str:
        for rule in self.rules:
            if rule is None:
                return dn
            pattern, replacement, case = rule
            if pattern.fullmatch(dn):
                out = pattern.sub(replacement, dn)
                return out.lower() if case == "L" else out.upper() if case == "U" else out
        return dn


def subject_dn(cert: Mapping) -> str:
    """RFC 2253 form of a `getpeercert()` subject: most specific first, as Java writes it."""
    parts = []
    for rdn in reversed(cert.get("subject", ())):
        parts.append("+".join(f"{_DN_NAMES.get(k, k)}={_escape(v)}" for k, v in rdn))
    return ",".join(parts)


def _escape(value: str) -> str:
    return re.sub(r'([,+"\\<>;=])', r"\\\1", value)


class TlsSocket:
    """A server-side TLS connection over a connected non-blocking socket,
    with the calls the wire server makes: `recv_into`, `send`, `sendmsg`,
    `fileno` (see the module's doc for their meaning over TLS)."""

    def __init__(self, sock: socket.socket, context: ssl.SSLContext) -> None:
        self._sock = sock
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._obj = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self._out = bytearray()
        self._owed = 0

    def fileno(self) -> int:
        return self._sock.fileno()

    @property
    def version(self) -> str | None:
        return self._obj.version()

    def peer_certificate(self) -> dict | None:
        return self._obj.getpeercert() or None

    async def handshake(self) -> None:
        """Complete the TLS handshake; ssl.SSLError on a bad one,
        ConnectionError if the peer leaves."""
        while True:
            try:
                self._obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                await self._flush_all()
                await self._receive_ciphertext()
        await self._flush_all()  # the last flight, and TLS 1.3 session tickets

    async def _receive_ciphertext(self) -> None:
        while True:
            try:
                data = self._sock.recv(_RECV_BYTES)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(self._sock)
                continue
            if not data:
                raise ConnectionError("the peer closed the connection during the TLS handshake")
            self._incoming.write(data)
            return

    async def _flush_all(self) -> None:
        self._out += self._outgoing.read()
        while self._out:
            self._flush()
            if self._out:
                await trio.lowlevel.wait_writable(self._sock)

    def _flush(self) -> None:
        out = self._out
        while out:
            try:
                sent = self._sock.send(out)
            except BlockingIOError:
                return
            del out[:sent]  # bytearray deletes its head in O(1)

    def recv_into(self, view: memoryview) -> int:
        """Plaintext into `view`: as much as is there; 0 at end of stream;
        BlockingIOError if none is there yet."""
        total = 0
        wanted = len(view)
        obj = self._obj
        while total < wanted:
            try:
                n = obj.read(wanted - total, view[total:])
            except ssl.SSLWantReadError:
                try:
                    data = self._sock.recv(_RECV_BYTES)
                except BlockingIOError:
                    if total:
                        break
                    raise
                if not data:
                    self._incoming.write_eof()
                    break
                self._incoming.write(data)
                continue
            except ssl.SSLZeroReturnError:  # close_notify
                break
            if not n:
                break
            total += n
        if self._outgoing.pending:  # e.g. a TLS 1.3 KeyUpdate answer
            self._out += self._outgoing.read()
            self._flush()
        return total

    def send(self, data) -> int:
        return self.sendmsg([data])

    def sendmsg(self, buffers, ancdata=(), flags: int = 0) -> int:
        """Encrypt and send `buffers`; the plaintext bytes accepted (one
        less than all while ciphertext waits for the kernel: module doc)."""
        if self._out:
            self._flush()
            if self._out:
                raise BlockingIOError
        skip, self._owed = self._owed, 0
        data = b"".join(buffers)
        length = len(data)
        assert skip <= length, "a retried send must start with the byte held back"
        view = memoryview(data)[skip:]
        while view:
            written = self._obj.write(view)
            view = view[written:]
        self._out += self._outgoing.read()
        self._flush()
        if self._out and length:
            self._owed = 1
            return length - 1
        return length
