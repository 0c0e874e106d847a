"""Mutual TLS for every rasd gRPC connection: credentials from files, reload, and peer identity.

Who is who, read from the peer's client certificate (verified by gRPC against the configured CA):

* **node identity** (agents): the first SAN DNS name of the certificate, else its subject CN. An
  agent may speak only for that node.
* **operator role** (rasctl and other AdminService callers): the subject's OU
  (organizationalUnitName) names the role, one of ``viewer``, ``operator``, ``admin``. A
  certificate with OU ``node`` is an agent and holds no operator role.
* **principal name** (audit log): ``cert:<CN>`` for a certificate, ``token:<name>`` for a bearer
  token (see ``rasd.controller.rpc.authn``).

Certificates reload without a restart:

* the controller serves through ``grpc.dynamic_ssl_server_credentials``; on every new handshake
  gRPC asks ``ReloadingServerCredentials`` for a new configuration, which re-reads the files when
  their mtime, size or inode changed (a cert-manager renewal, a rewritten file, a swapped
  symlink). A bad new pair is logged and the last good one keeps serving.
* the agent and rasctl read their files each time they open a channel, so an agent picks up a new
  certificate on its next reconnect.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import grpc

if TYPE_CHECKING:
    from cryptography import x509


def _log() -> Any:
    """The module's logger.

    structlog and cryptography are imported where they are used: rasctl dials through this module,
    and importing them at its start cost it a third of its start-up time.
    """
    import structlog

    return structlog.get_logger("rasd.tls")


MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""Largest gRPC message either side accepts (the controller's limit; clients use the same)."""


@dataclasses.dataclass(frozen=True)
class TlsFiles:
    """A certificate, its key, and the CA that the other side's certificate must chain to."""

    ca: pathlib.Path
    """PEM bundle of trusted CA certificates."""
    cert: pathlib.Path
    """PEM certificate (chain) presented to the other side."""
    key: pathlib.Path
    """PEM private key of `cert`."""

    @classmethod
    def from_mapping(cls, data: Mapping[str, object], *, prefix: str = "tls.") -> TlsFiles:
        """Build from a config table with keys ca, cert, key; the error names the missing key."""
        missing = [k for k in ("ca", "cert", "key") if not data.get(k)]
        if missing:
            raise ValueError(f"{prefix}{missing[0]}: required (a PEM file path)")
        unknown = set(data) - {"ca", "cert", "key", "server_name"}
        if unknown:
            raise ValueError(f"{prefix}{sorted(unknown)[0]}: unknown key (known: ca, cert, key, server_name)")
        return cls(pathlib.Path(str(data["ca"])), pathlib.Path(str(data["cert"])), pathlib.Path(str(data["key"])))

    def read(self) -> tuple[bytes, bytes, bytes]:
        """(ca, cert, key) bytes, checked to be PEM and the key to match the certificate.

        Raises:
            OSError: a file cannot be read.
            ValueError: a file is not what it should be; the message names the file.
        """
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization

        ca, cert, key = self.ca.read_bytes(), self.cert.read_bytes(), self.key.read_bytes()
        try:
            x509.load_pem_x509_certificates(ca)
        except ValueError as exc:
            raise ValueError(f"{self.ca}: not a PEM CA bundle ({exc})") from None
        try:
            leaf = x509.load_pem_x509_certificates(cert)[0]
        except ValueError as exc:
            raise ValueError(f"{self.cert}: not a PEM certificate ({exc})") from None
        try:
            private = serialization.load_pem_private_key(key, password=None)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{self.key}: not an unencrypted PEM private key ({exc})") from None
        if private.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        ) != leaf.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        ):
            raise ValueError(f"{self.key}: does not belong to the certificate {self.cert}")
        return ca, cert, key

    def stamp(self) -> tuple[tuple[int, int, int], ...]:
        """What changes when any of the files is rewritten or replaced."""
        out = []
        for path in (self.ca, self.cert, self.key):
            st = os.stat(path)
            out.append((st.st_mtime_ns, st.st_size, st.st_ino))
        return tuple(out)


class ReloadingServerCredentials:
    """Server credentials that require a client certificate and follow the files on disk."""

    def __init__(self, files: TlsFiles) -> None:
        """Load the files once (raising on a bad pair: a controller must not start without TLS)."""
        self.files = files
        self.reloads = 0
        self._lock = threading.Lock()
        self._stamp = files.stamp()
        initial = self._configuration()
        self.credentials = grpc.dynamic_ssl_server_credentials(initial, self._fetch, require_client_authentication=True)

    def _configuration(self) -> grpc.ServerCertificateConfiguration:
        ca, cert, key = self.files.read()
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        # Called by gRPC on a core thread at each handshake: cheap when nothing changed (three stats).
        with self._lock:
            try:
                stamp = self.files.stamp()
                if stamp == self._stamp:
                    return None
                configuration = self._configuration()
            except (OSError, ValueError) as exc:
                # A half-written renewal: keep serving the last good pair and try again next handshake.
                _log().warning("tls_reload_failed", error=str(exc))
                return None
            self._stamp = stamp
            self.reloads += 1
        _log().info("tls_reloaded", cert=str(self.files.cert), reloads=self.reloads)
        return configuration


def channel_credentials(files: TlsFiles) -> grpc.ChannelCredentials:
    """Client credentials: our certificate, and the CA the server's certificate must chain to.

    The files are read now, so calling this per connection picks up renewed certificates.
    """
    ca, cert, key = files.read()
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


CLIENT_KEEPALIVE_TIME_MS = 20_000
CLIENT_KEEPALIVE_TIMEOUT_MS = 10_000
SERVER_MIN_PING_INTERVAL_MS = 10_000
"""The least time between client pings the controller accepts (grpc.http2.min_ping_interval_without_data_ms)."""


def channel_options(
    server_name: str = "",
    *,
    keepalive_time_ms: int = CLIENT_KEEPALIVE_TIME_MS,
    keepalive_timeout_ms: int = CLIENT_KEEPALIVE_TIMEOUT_MS,
) -> list[tuple[str, object]]:
    """Options every rasd client channel uses: message size bounds, keepalive pings, an optional TLS name override."""
    options: list[tuple[str, object]] = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        # An agent's stream to a controller that vanished without a FIN (node crash, silent partition)
        # would otherwise hang until TCP gives up, many minutes; pings find it within about 30 s and the
        # agent reconnects, to another replica if need be. Never more often than the server's
        # min_ping_interval_without_data (CLIENT_KEEPALIVE_TIME_MS >= it), or it answers with GOAWAY.
        # grpcio 1.85 bounds an unanswered ping by grpc.http2.ping_timeout_ms (default 60 s), not by
        # keepalive_timeout_ms alone: measured, a stopped controller went unnoticed for over 60 s until
        # both were set (tests/chaos/test_controller_silent.py).
        ("grpc.keepalive_time_ms", keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", keepalive_timeout_ms),
        ("grpc.http2.ping_timeout_ms", keepalive_timeout_ms),
    ]
    if server_name:
        options.append(("grpc.ssl_target_name_override", server_name))
    return options


def aio_channel(
    address: str,
    files: TlsFiles | None,
    *,
    server_name: str = "",
    keepalive_time_ms: int = CLIENT_KEEPALIVE_TIME_MS,
    keepalive_timeout_ms: int = CLIENT_KEEPALIVE_TIMEOUT_MS,
) -> grpc.aio.Channel:
    """An asyncio channel: mutual TLS with `files`, plaintext when None (callers enforce loopback)."""
    keepalive = {"keepalive_time_ms": keepalive_time_ms, "keepalive_timeout_ms": keepalive_timeout_ms}
    if files is None:
        return grpc.aio.insecure_channel(address, options=channel_options(**keepalive))
    return grpc.aio.secure_channel(
        address, channel_credentials(files), options=channel_options(server_name, **keepalive)
    )


def sync_channel(address: str, files: TlsFiles | None, *, server_name: str = "") -> grpc.Channel:
    """A blocking channel, same rules as `aio_channel`."""
    if files is None:
        return grpc.insecure_channel(address, options=channel_options())
    return grpc.secure_channel(address, channel_credentials(files), options=channel_options(server_name))


@dataclasses.dataclass(frozen=True)
class PeerCertificate:
    """What the controller learns from a verified client certificate."""

    common_name: str
    dns_names: tuple[str, ...]
    units: tuple[str, ...]
    """Subject organizationalUnitName values, in order."""

    @property
    def node_id(self) -> str:
        """The node this certificate speaks for: first SAN DNS name, else the CN."""
        return self.dns_names[0] if self.dns_names else self.common_name


def _attribute_values(name: x509.Name, oid: x509.ObjectIdentifier) -> tuple[str, ...]:
    return tuple(str(a.value) for a in name.get_attributes_for_oid(oid))


def parse_certificate(pem: bytes) -> PeerCertificate:
    """Read the identity fields of one PEM certificate."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    cert = x509.load_pem_x509_certificate(pem)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns_names = tuple(san.get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        dns_names = ()
    names = _attribute_values(cert.subject, NameOID.COMMON_NAME)
    return PeerCertificate(
        common_name=names[0] if names else "",
        dns_names=dns_names,
        units=_attribute_values(cert.subject, NameOID.ORGANIZATIONAL_UNIT_NAME),
    )


def peer_certificate(auth_context: Mapping[str, Sequence[bytes]]) -> PeerCertificate | None:
    """The verified client certificate of a call, or None on a plaintext or certificate-less call.

    gRPC fills ``x509_pem_cert`` only after verifying the chain against the server's CA, and the
    controller's credentials require a client certificate, so any value here is trusted.
    """
    if auth_context.get("transport_security_type", [b""])[0] != b"ssl":
        return None
    pem = auth_context.get("x509_pem_cert")
    if not pem:
        return None
    return parse_certificate(pem[0])
