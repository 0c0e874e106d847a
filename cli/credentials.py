"""rasctl's credentials: the channel it dials with, and the `certs` and `tokens` subcommands.

Channel rules:

* ``--tls-ca/--tls-cert/--tls-key`` (or ``$RASD_TLS_CA``, ``$RASD_TLS_CERT``, ``$RASD_TLS_KEY``):
  mutual TLS; the certificate's OU is the caller's role (viewer, operator, admin).
* ``--token`` (or ``$RASD_TOKEN``): sent as ``authorization: Bearer <token>`` on every call; the
  token's role then decides, not the certificate's (the controller still requires a client
  certificate for the TLS handshake: a role-less one is enough, e.g. one shared by a team whose
  members each hold a token).
* none of the TLS flags: plaintext, to a loopback controller only (one started with ``--insecure``).

``rasctl create certs`` makes a dev PKI (``rasd.common.devcerts``); ``rasctl create token`` makes a
token and prints the line for the controller's ``--tokens-file``. Neither needs a controller.
"""

from __future__ import annotations

import argparse
import pathlib
from typing import TextIO

import grpc

from rasd.common import net, tls


def run_offline(args: argparse.Namespace, out: TextIO) -> bool:
    """Run ``create certs`` and ``create token`` (``certs init``, ``tokens new``); False for another command."""
    from rasd.common import devcerts, tokens  # only here: cryptography costs every other command's start

    if args.command == "certs":
        nodes = [n for item in args.nodes for n in item.split(",") if n]
        pki = devcerts.init(args.dir, nodes, controller_names=args.controller_name)
        print(f"dev CA and certificates in {pki.root} (not for production)", file=out)
        print(
            f"  controller: --tls-ca {pki.ca.cert} --tls-cert {pki.controller.cert} --tls-key {pki.controller.key}",
            file=out,
        )
        for node_id, pair in pki.nodes.items():
            print(f"  node {node_id}: --tls-ca {pki.ca.cert} --tls-cert {pair.cert} --tls-key {pair.key}", file=out)
        for role, pair in pki.operators.items():
            print(
                f"  rasctl as {role}: RASD_TLS_CA={pki.ca.cert} RASD_TLS_CERT={pair.cert} RASD_TLS_KEY={pair.key}",
                file=out,
            )
        return True
    if args.command == "tokens":
        token = tokens.new_token()
        print(f"token (give it to {args.name}; it is not stored anywhere): {token}", file=out)
        print(f"line for the controller's --tokens-file:\n{args.name} {args.role} {tokens.hash_token(token)}", file=out)
        return True
    return False


def channel(args: argparse.Namespace) -> grpc.Channel:
    """The channel the flags ask for (module docstring).

    Raises:
        ValueError: plaintext to a non-loopback controller, or an incomplete or unreadable TLS set.
    """
    if args.tls_cert or args.tls_key:
        if not (args.tls_ca and args.tls_cert and args.tls_key):
            raise ValueError("--tls-ca, --tls-cert and --tls-key go together")
        files = tls.TlsFiles(pathlib.Path(args.tls_ca), pathlib.Path(args.tls_cert), pathlib.Path(args.tls_key))
        return tls.sync_channel(args.controller, files, server_name=args.tls_server_name)
    if args.tls_ca:
        raise ValueError("--tls-ca needs --tls-cert and --tls-key (the controller requires a client certificate)")
    host, _port = net.split_host_port(args.controller)
    if not net.is_loopback_host(host):
        raise ValueError(
            f"refusing plaintext gRPC to non-loopback controller {host!r}: set --tls-ca/--tls-cert/--tls-key"
        )
    return tls.sync_channel(args.controller, None)


class _BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Adds ``authorization: Bearer <token>`` to every call, the watches' streams included."""

    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    def intercept_unary_unary(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
        details = client_call_details._replace(metadata=(*(client_call_details.metadata or ()), self._header))
        return continuation(details, request)

    def intercept_unary_stream(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
        return self.intercept_unary_unary(continuation, client_call_details, request)


def authenticated(args: argparse.Namespace, base: grpc.Channel) -> grpc.Channel:
    """base, sending the bearer token on every call when one is given."""
    return grpc.intercept_channel(base, _BearerToken(args.token)) if args.token else base
