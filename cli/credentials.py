"""rasctl's credentials: the channel it dials with, and the `certs` and `tokens` subcommands.

Channel rules:

* ``--tls-ca/--tls-cert/--tls-key`` (or ``$RASD_TLS_CA``, ``$RASD_TLS_CERT``, ``$RASD_TLS_KEY``):
  mutual TLS; the certificate's OU is the caller's role (viewer, operator, admin).
* ``--token`` (or ``$RASD_TOKEN``): sent as ``authorization: Bearer <token>`` on every call; the
  token's role then decides, not the certificate's (the controller still requires a client
  certificate for the TLS handshake: a role-less one is enough, e.g. one shared by a team whose
  members each hold a token).
* none of the TLS flags: plaintext, to a loopback controller only (one started with ``--insecure``).

``rasctl certs init`` makes a dev PKI (``rasd.common.devcerts``); ``rasctl tokens new`` makes a
token and prints the line for the controller's ``--tokens-file``. Neither needs a controller.
"""

from __future__ import annotations

import argparse
import os
import pathlib
from typing import Any, TextIO

import grpc

from rasd.common import devcerts, net, tls, tokens


def add_global_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags that choose how rasctl authenticates."""
    env = os.environ.get
    parser.add_argument("--tls-ca", default=env("RASD_TLS_CA"), help="CA bundle of the controller ($RASD_TLS_CA)")
    parser.add_argument("--tls-cert", default=env("RASD_TLS_CERT"), help="your client certificate ($RASD_TLS_CERT)")
    parser.add_argument("--tls-key", default=env("RASD_TLS_KEY"), help="its private key ($RASD_TLS_KEY)")
    parser.add_argument(
        "--tls-server-name",
        default=env("RASD_TLS_SERVER_NAME", ""),
        help="the name to check the controller's certificate against when --controller is another address, "
        "e.g. rasd.rasd.svc through a port-forward ($RASD_TLS_SERVER_NAME)",
    )
    parser.add_argument("--token", default=env("RASD_TOKEN"), help="bearer token ($RASD_TOKEN)")


def add_commands(commands: Any) -> None:
    """`certs init` and `tokens new`."""
    certs = commands.add_parser("certs", help="development certificates (no controller needed)")
    certs_commands = certs.add_subparsers(dest="certs_command", required=True, metavar="CERTS_COMMAND")
    init = certs_commands.add_parser(
        "init", help="make a throwaway CA, a loopback controller cert, node certs and one operator cert per role"
    )
    init.add_argument("--dir", type=pathlib.Path, default=pathlib.Path("dev-certs"), help="output folder")
    init.add_argument("--nodes", nargs="*", default=[], metavar="NODE", help="node ids that get a client cert")
    init.add_argument("--controller-name", action="append", default=[], help="extra DNS name or IP of the controller")
    tokens = commands.add_parser("tokens", help="bearer tokens (no controller needed)")
    tokens_commands = tokens.add_subparsers(dest="tokens_command", required=True, metavar="TOKENS_COMMAND")
    new = tokens_commands.add_parser("new", help="make a token; print it and the line for --tokens-file")
    new.add_argument("--name", required=True, help="who holds it (the audit log's actor: token:NAME)")
    new.add_argument("--role", required=True, choices=("viewer", "operator", "admin"))


def run_offline(args: argparse.Namespace, out: TextIO) -> bool:
    """Run `certs` and `tokens` subcommands; False when args is another command."""
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


class _BearerToken(grpc.UnaryUnaryClientInterceptor):
    """Adds ``authorization: Bearer <token>`` to every call."""

    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    def intercept_unary_unary(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
        details = client_call_details._replace(metadata=(*(client_call_details.metadata or ()), self._header))
        return continuation(details, request)


def authenticated(args: argparse.Namespace, base: grpc.Channel) -> grpc.Channel:
    """base, sending the bearer token on every call when one is given."""
    return grpc.intercept_channel(base, _BearerToken(args.token)) if args.token else base
