"""Who is calling: principals from client certificates and bearer tokens, and the security settings.

A call's principal comes from, in this order:

1. a bearer token (``authorization: Bearer <token>`` metadata) found in the token file: the
   principal is ``token:<name>`` with the file's role. A token that is not in the file is refused
   (UNAUTHENTICATED), it never falls back to the certificate;
2. the verified client certificate (``rasd.common.tls``): OU ``node`` makes a node principal
   ``node:<node id>`` that may only open its own AgentService stream; an OU naming a role
   (``viewer``, ``operator``, ``admin``) makes ``cert:<CN>`` with that role; the highest such OU wins;
3. on a plaintext controller only (``--insecure``, loopback only): ``anonymous`` with the
   configured `insecure_role`.

Token file (one token per line, ``#`` comments)::

    # name      role      hash of the token
    alice       operator  sha256:5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8

Tokens and their at-rest hash are made by ``rasctl tokens new`` (``rasd.common.tokens``, which says
why one SHA-256 is enough).
"""

from __future__ import annotations

import dataclasses
import enum
import hmac
import pathlib
from collections.abc import Mapping, Sequence

import structlog

from rasd.common import tls, tokens
from rasd.controller.rpc import validate_input

log = structlog.get_logger("rasd.controller")

NODE_UNIT = "node"


class Role(enum.IntEnum):
    """Operator roles; each includes everything the lower ones may do."""

    VIEWER = 1
    """Read the fleet, events, incidents, repairs, validations, RMA, power, audit."""
    OPERATOR = 2
    """Quarantine, release after validation, validate, accuse SDC, pause and resume automation."""
    ADMIN = 3
    """Power budgets and policies, RMA approval, forced release."""

    @classmethod
    def parse(cls, text: str) -> Role:
        """A role from its name; ValueError names the known ones."""
        try:
            return cls[text.strip().upper()]
        except KeyError:
            raise ValueError(f"role {text!r} is not one of viewer, operator, admin") from None

    @property
    def label(self) -> str:
        """Lower-case name, as in certificates, token files and audit records."""
        return self.name.lower()


@dataclasses.dataclass(frozen=True)
class Principal:
    """An authenticated caller."""

    name: str
    """What the audit log records: ``cert:<CN>``, ``token:<name>``, ``node:<id>`` or ``anonymous``."""
    kind: str
    """cert | token | node | anonymous"""
    role: Role | None = None
    """Operator role; None for nodes and role-less certificates."""
    node_id: str = ""
    """For node principals: the node it speaks for."""


@dataclasses.dataclass(frozen=True)
class TokenEntry:
    """One line of the token file."""

    name: str
    role: Role
    sha256_hex: str


class TokenStore:
    """Bearer tokens by hash, read from a file; re-read when the file changes (no restart).

    A file that is deleted or cannot be read grants no token from then on (logged once, as an
    error): an operator who removes the file, or a volume that went away, must not leave the
    tokens it held valid. A file that reads but does not parse (an edit half done) keeps the last
    good entries, and says so.
    """

    def __init__(self, path: pathlib.Path | None) -> None:
        """Load the file now (raising ValueError with the line number on a bad line)."""
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self._entries: dict[str, TokenEntry] = {}
        self._unreadable: str | None = None
        """Why the file could not be read at the last look (None: it could)."""
        if path is not None:
            self._reload(force=True)

    @staticmethod
    def parse(text: str, *, source: str = "tokens") -> dict[str, TokenEntry]:
        """Entries by hex digest; the error names the file and line."""
        entries: dict[str, TokenEntry] = {}
        for number, raw in enumerate(text.splitlines(), start=1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            if len(parts) != 3:
                raise ValueError(f"{source}:{number}: expected NAME ROLE sha256:HEX")
            name, role_text, digest = parts
            role = Role.parse(role_text)
            algorithm, _, hex_digest = digest.partition(":")
            if algorithm != "sha256" or len(hex_digest) != 64 or not all(c in "0123456789abcdef" for c in hex_digest):
                raise ValueError(f"{source}:{number}: hash must be sha256:<64 lower-case hex digits>")
            entries[hex_digest] = TokenEntry(name=name, role=role, sha256_hex=hex_digest)
        return entries

    def _reload(self, *, force: bool = False) -> None:
        assert self.path is not None
        st = self.path.stat()
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp == self._stamp and not force:
            return
        text = self.path.read_text()
        self._stamp = stamp  # a file that does not parse is looked at again once it changes, not at every call
        self._entries = self.parse(text, source=str(self.path))

    def _refresh(self) -> None:
        """Re-read the file if it changed: unreadable, no tokens; unparsable, the last good ones."""
        try:
            self._reload()
        except OSError as exc:
            self._entries, self._stamp = {}, None
            problem = f"{type(exc).__name__}: {exc.strerror or exc}"
            if problem != self._unreadable:
                log.error("tokens_file_unreadable", path=str(self.path), error=problem, tokens_valid=0)
            self._unreadable = problem
            return
        except ValueError as exc:
            log.error("tokens_file_invalid", path=str(self.path), error=str(exc), kept=len(self._entries))
            return
        if self._unreadable is not None:
            log.info("tokens_file_readable_again", path=str(self.path), tokens_valid=len(self._entries))
            self._unreadable = None

    def lookup(self, token: str) -> TokenEntry | None:
        """The entry for a presented token, or None."""
        if self.path is not None:
            self._refresh()
        digest = tokens.digest(token)
        for known, entry in self._entries.items():
            if hmac.compare_digest(known, digest):
                return entry
        return None


class AuthError(Exception):
    """The caller could not be authenticated (UNAUTHENTICATED)."""


@dataclasses.dataclass(frozen=True)
class SecuritySettings:
    """TLS, operator authentication and hostile-input limits of one controller replica."""

    tls: tls.TlsFiles | None = None
    """Server certificate, key and client CA; None serves plaintext (loopback only, `--insecure`)."""
    tokens_file: pathlib.Path | None = None
    """Bearer token file (see the module docstring); None: certificates only."""
    insecure_role: Role | None = Role.ADMIN
    """Role of unauthenticated callers on a plaintext controller (dev and tests); None denies them.
    Ignored when TLS is on: then every caller authenticates."""
    limits: validate_input.InputLimits = dataclasses.field(default_factory=validate_input.InputLimits)
    """Per-stream batch and rate limits."""


def bearer_token(metadata: Sequence[tuple[str, str | bytes]] | None) -> str | None:
    """The token of an ``authorization: Bearer ...`` header, or None when there is none.

    Raises:
        AuthError: an authorization header that is not a bearer token.
    """
    for key, value in metadata or ():
        if key.lower() != "authorization":
            continue
        text = value.decode() if isinstance(value, bytes) else value
        scheme, _, token = text.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise AuthError("authorization: expected 'Bearer <token>'")
        return token.strip()
    return None


def certificate_principal(auth_context: Mapping[str, Sequence[bytes]]) -> Principal | None:
    """The principal of the call's verified client certificate (module docstring, 2.), or None without one.

    Also what a refused call is audited as when its bearer token was not recognised: the
    connection's certificate was verified all the same, and names who presented the token.
    """
    peer = tls.peer_certificate(auth_context)
    if peer is None:
        return None
    if NODE_UNIT in peer.units:
        return Principal(name=f"node:{peer.node_id}", kind="node", node_id=peer.node_id)
    roles = [Role.parse(u) for u in peer.units if u.upper() in Role.__members__]
    return Principal(name=f"cert:{peer.common_name}", kind="cert", role=max(roles) if roles else None)


def resolve(
    auth_context: Mapping[str, Sequence[bytes]],
    metadata: Sequence[tuple[str, str | bytes]] | None,
    *,
    token_store: TokenStore,
    settings: SecuritySettings,
) -> Principal:
    """The principal of a call (module docstring, in order).

    Raises:
        AuthError: an unknown token, or no credentials where they are required.
    """
    token = bearer_token(metadata)
    if token is not None:
        entry = token_store.lookup(token)
        if entry is None:
            raise AuthError("bearer token not recognised")
        return Principal(name=f"token:{entry.name}", kind="token", role=entry.role)
    by_certificate = certificate_principal(auth_context)
    if by_certificate is not None:
        return by_certificate
    if settings.tls is None and settings.insecure_role is not None:
        return Principal(name="anonymous", kind="anonymous", role=settings.insecure_role)
    raise AuthError("no client certificate and no bearer token")
