"""A throwaway certificate authority for development, tests and the demo (`rasctl certs init`).

It writes, under one folder:

==============================  =============================================================
file                            what it is
==============================  =============================================================
``ca.crt``, ``ca.key``          the dev CA (agents, the controller and rasctl trust ``ca.crt``)
``controller.crt/.key``         the controller's server certificate: SAN DNS ``localhost`` and
                                IP ``127.0.0.1`` and ``::1`` (plus any ``--controller-name``)
``nodes/NODE.crt/.key``         one client certificate per node: CN and SAN DNS = the node id,
                                OU ``node`` (see ``rasd.common.tls`` for how identity is read)
``operators/ROLE.crt/.key``     one client certificate per operator role (viewer, operator,
                                admin): CN ``dev-ROLE``, OU = the role
==============================  =============================================================

Keys are ECDSA P-256 (fast to make, so a 2,000-node simulated fleet gets its certificates in seconds)
and private keys are written mode 0600. Nothing here is fit for production: the CA key sits next to
the certificates. A real cluster uses cert-manager or its own PKI (README, "Certificates").
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import os
import pathlib
from collections.abc import Iterable, Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

ROLES = ("viewer", "operator", "admin")
NODE_OU = "node"
"""The organizational unit of agent certificates: a node, never an operator."""
VALIDITY_DAYS = 30


@dataclasses.dataclass(frozen=True)
class Pair:
    """A certificate and its key on disk."""

    cert: pathlib.Path
    key: pathlib.Path


@dataclasses.dataclass(frozen=True)
class DevPki:
    """Where `init` put everything."""

    root: pathlib.Path
    ca: Pair
    controller: Pair
    nodes: dict[str, Pair]
    operators: dict[str, Pair]

    def node(self, node_id: str) -> Pair:
        """The client certificate of one node (KeyError when init did not make it)."""
        return self.nodes[node_id]


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str, unit: str | None = None) -> x509.Name:
    parts = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "rasd-dev")]
    if unit:
        parts.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, unit))
    parts.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(parts)


def _write(pair: Pair, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
    pair.cert.parent.mkdir(parents=True, exist_ok=True)
    key_bytes = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    # Write the key through a 0600 file descriptor so it is never world-readable, not even briefly.
    fd = os.open(pair.key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(key_bytes)
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


class _Ca:
    def __init__(self, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
        self.cert = cert
        self.key = key

    @classmethod
    def create(cls, now: datetime.datetime) -> _Ca:
        key = _key()
        name = _name("rasd dev CA")
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=VALIDITY_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        return cls(cert, key)

    @classmethod
    def load(cls, pair: Pair) -> _Ca:
        cert = x509.load_pem_x509_certificate(pair.cert.read_bytes())
        key = serialization.load_pem_private_key(pair.key.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{pair.key}: not an EC key made by `rasctl certs init`")
        return cls(cert, key)

    def issue(
        self,
        subject: x509.Name,
        *,
        sans: Sequence[x509.GeneralName],
        usage: x509.ObjectIdentifier,
        now: datetime.datetime,
        days: int = VALIDITY_DAYS,
    ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = _key()
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.cert.public_key()),  # type: ignore[arg-type]
                critical=False,
            )
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
        return builder.sign(self.key, hashes.SHA256()), key


def _layout(root: pathlib.Path, nodes: Iterable[str]) -> DevPki:
    return DevPki(
        root=root,
        ca=Pair(root / "ca.crt", root / "ca.key"),
        controller=Pair(root / "controller.crt", root / "controller.key"),
        nodes={n: Pair(root / "nodes" / f"{n}.crt", root / "nodes" / f"{n}.key") for n in nodes},
        operators={r: Pair(root / "operators" / f"{r}.crt", root / "operators" / f"{r}.key") for r in ROLES},
    )


def _check_node_id(node_id: str) -> None:
    # Node ids become file names and DNS SANs: letters, digits, '.', '-', '_' only.
    if not node_id or len(node_id) > 253 or not all(c.isalnum() or c in ".-_" for c in node_id):
        raise ValueError(f"node id {node_id!r} cannot name a certificate (letters, digits, '.', '-', '_')")
    if node_id.startswith("."):
        raise ValueError(f"node id {node_id!r} cannot start with '.'")


def init(
    root: pathlib.Path,
    nodes: Sequence[str],
    *,
    controller_names: Sequence[str] = (),
    now: datetime.datetime | None = None,
    controller_days: int = VALIDITY_DAYS,
) -> DevPki:
    """Make (or extend) a dev PKI under root; returns where everything is.

    An existing ``ca.crt``/``ca.key`` is reused, so more nodes can be added to a fleet later; the
    controller, node and operator certificates are (re)issued.

    Args:
        root: the folder (created when missing).
        nodes: node ids that get a client certificate.
        controller_names: extra DNS names or IP addresses for the controller certificate.
        now: issue time (tests pass it to make expiring certificates).
        controller_days: validity of the controller certificate.

    Raises:
        ValueError: a node id cannot be a certificate name, or an existing CA is unusable.
    """
    for node_id in nodes:
        _check_node_id(node_id)
    now = now or datetime.datetime.now(datetime.UTC)
    pki = _layout(root, nodes)
    root.mkdir(parents=True, exist_ok=True)
    if pki.ca.cert.exists() and pki.ca.key.exists():
        ca = _Ca.load(pki.ca)
    else:
        ca = _Ca.create(now)
        _write(pki.ca, ca.cert, ca.key)
    issue_controller(pki, ca, controller_names, now=now, days=controller_days)
    for node_id, pair in pki.nodes.items():
        cert, key = ca.issue(
            _name(node_id, NODE_OU), sans=[x509.DNSName(node_id)], usage=ExtendedKeyUsageOID.CLIENT_AUTH, now=now
        )
        _write(pair, cert, key)
    for role, pair in pki.operators.items():
        cert, key = ca.issue(_name(f"dev-{role}", role), sans=[], usage=ExtendedKeyUsageOID.CLIENT_AUTH, now=now)
        _write(pair, cert, key)
    return pki


def issue_controller(
    pki: DevPki,
    ca: _Ca | None = None,
    extra_names: Sequence[str] = (),
    *,
    now: datetime.datetime | None = None,
    days: int = VALIDITY_DAYS,
) -> Pair:
    """(Re)issue the controller's server certificate in place (what a cert-manager renewal does)."""
    ca = ca or _Ca.load(pki.ca)
    now = now or datetime.datetime.now(datetime.UTC)
    sans: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("::1")),
    ]
    for name in extra_names:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            sans.append(x509.DNSName(name))
    cert, key = ca.issue(_name("rasd-controller"), sans=sans, usage=ExtendedKeyUsageOID.SERVER_AUTH, now=now, days=days)
    _write(pki.controller, cert, key)
    return pki.controller


def existing(root: pathlib.Path) -> DevPki:
    """The dev PKI already under root, with every node certificate found there.

    Raises:
        FileNotFoundError: root holds no ``ca.crt`` (run `rasctl certs init` first).
    """
    if not (root / "ca.crt").exists():
        raise FileNotFoundError(f"{root / 'ca.crt'} does not exist; run `rasctl certs init --dir {root}` first")
    nodes = sorted(p.stem for p in (root / "nodes").glob("*.crt"))
    return _layout(root, nodes)
