"""rasctl: the operator CLI. Each command is one AdminService call rendered as a table, JSON, YAML or names.

The command line is `rasd.cli.parser`'s (verb-noun, kubectl's habits). The controller address comes
from --controller, $RASD_CONTROLLER, the contexts file (`rasd.cli.contexts`) or 127.0.0.1:7443;
how rasctl authenticates (mutual TLS, bearer token) is in ``rasd.cli.credentials``. Targets are
written NODE or NODE/GPU. Exit codes: 0 success, 1 the controller answered with an error, 2 usage
error, 3 unreachable.

gRPC, protobuf and the generated API are imported by the commands that call the controller, not at
start: ``rasctl --help``, ``completion`` and ``config`` never load them (bench/rasctl_startup.py).
"""

from __future__ import annotations

import argparse
import ipaddress
import re
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, TextIO

from rasd.cli import contexts, output
from rasd.cli.parser import build_parser

if TYPE_CHECKING:
    import grpc

__all__ = ["build_parser", "main", "run", "unreachable_hint"]

EXIT_RPC_ERROR = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
LEADER_ADDRESS_KEY = "rasd-leader-address"
"""Trailing metadata of a follower's FAILED_PRECONDITION: where the leader serves (controller/rpc/leader_gate.py)."""


def unreachable_hint(details: str, args: argparse.Namespace) -> str:
    """What an UNAVAILABLE (or timed-out) call most likely means, for the operator to act on.

    Every one of them said "is rasd-controller running?": a controller that refused the client
    certificate (gRPC reports only "Socket closed"), a controller certificate this client does not
    trust or that does not carry the name dialled (a failed TLS handshake), and a controller whose
    store was down sent operators looking for a process that was running.
    """
    controller = args.controller
    if "store unavailable" in details:
        return f"store unavailable: rasd-controller at {controller} runs, but cannot reach its store; retry later"
    if "Hostname Verification" in details or "No match found for server name" in details:
        name = getattr(args, "tls_server_name", None) or controller.rpartition(":")[0].strip("[]")
        return (
            f"certificate name mismatch: rasd-controller at {controller} presented a certificate not issued for "
            f"{name!r}; dial a name its certificate carries, or pass --tls-server-name"
        )
    verify = re.search(r"CERTIFICATE_VERIFY_FAILED(?::\s*([^:]+))?", details)
    if verify is not None or "handshake failed" in details.lower():
        reason = f" ({verify.group(1).strip()})" if verify is not None and verify.group(1) else ""
        return (
            f"certificate not trusted: the TLS handshake with rasd-controller at {controller} failed{reason}; check "
            f"that its certificate is signed by {getattr(args, 'tls_ca', None) or 'the CA given'} and not expired"
        )
    if "Socket closed" in details and getattr(args, "tls_cert", None):
        return (
            f"certificate refused: rasd-controller at {controller} closed the TLS connection; check that "
            f"{args.tls_cert} is signed by the controller's CA and not expired"
        )
    return f"is rasd-controller running at {controller}?"


def run(argv: Sequence[str] | None, out: TextIO, err: TextIO) -> int:
    """Run rasctl with argv, printing to out/err; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        offline = _run_offline(args, out)
        if offline is not None:
            return offline
        contexts.settle(args)
    except (OSError, ValueError) as exc:
        print(f"rasctl: {exc}", file=err)
        return EXIT_USAGE
    import grpc

    from rasd.cli import commands, credentials

    try:
        commands.check_arguments(args)
        channel = credentials.channel(args)
    except (OSError, ValueError) as exc:
        print(f"rasctl: {exc}", file=err)
        return EXIT_USAGE
    try:
        try:
            commands.run_command(args, credentials.authenticated(args, channel), out, err)
        except grpc.RpcError as refused:
            leader_args = _at_the_leader(args, refused)
            if leader_args is None:
                raise
            print(f"rasctl: {args.controller} does not lead; calling the leader at {leader_args.controller}", file=err)
            channel.close()
            args, channel = leader_args, credentials.channel(leader_args)
            commands.run_command(args, credentials.authenticated(args, channel), out, err)
    except ValueError as exc:  # the leader's address cannot be dialled as the first one was
        print(f"rasctl: {exc}", file=err)
        return EXIT_USAGE
    except KeyboardInterrupt:  # a --watch ends when the operator interrupts it
        return 0
    except grpc.RpcError as exc:
        code = exc.code()  # type: ignore[attr-defined]
        details = output.printable(exc.details() or "")  # type: ignore[attr-defined]
        print(f"rasctl: {args.command}: {code.name}: {details}", file=err)
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            print(f"rasctl: {unreachable_hint(details, args)}", file=err)
            return EXIT_UNREACHABLE
        return EXIT_RPC_ERROR
    finally:
        channel.close()
    return 0


def _run_offline(args: argparse.Namespace, out: TextIO) -> int | None:
    """The commands that need no controller (kmsg, certs, tokens, config, completion); None for the others."""
    if args.command == "kmsg":
        from rasd.cli import kmsg

        kmsg.classify_stream(sys.stdin, out)
        return 0
    if args.command == "completion":
        from rasd.cli import completion

        out.write(completion.script(args.shell, build_parser()))
        return 0
    if args.command == "config":
        contexts.run(args, out)
        return 0
    if args.command in ("certs", "tokens"):
        from rasd.cli import credentials

        credentials.run_offline(args, out)
        return 0
    return None


def _at_the_leader(args: argparse.Namespace, refused: grpc.RpcError) -> argparse.Namespace | None:
    """args aimed at the leader a follower's refusal names; None when the error is not such a refusal.

    The leader serves the same certificate as the replica first called (one Secret), so the TLS name
    checked stays the one the operator dialled (or --tls-server-name) although the address is the
    leader pod's own. One retry: a second refusal (the leader changed meanwhile) is the answer.
    """
    import grpc

    if refused.code() is not grpc.StatusCode.FAILED_PRECONDITION:  # type: ignore[attr-defined]
        return None
    trailers = dict(refused.trailing_metadata() or ())  # type: ignore[attr-defined]
    address = trailers.get(LEADER_ADDRESS_KEY, "")
    if not address or address == args.controller:
        return None
    server_name = args.tls_server_name
    if not server_name:
        host = args.controller.rpartition(":")[0].strip("[]")
        server_name = "" if _is_ip_address(host) else host  # an IP: the leader's own address is checked
    return argparse.Namespace(**{**vars(args), "controller": address, "tls_server_name": server_name})


def _is_ip_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def main() -> int:
    """Console-script entry point."""
    return run(sys.argv[1:], sys.stdout, sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
