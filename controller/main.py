"""rasd-controller entry point: arguments → logging → Controller → run until SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import sys
import tomllib
from collections.abc import Sequence
from typing import Any

import structlog

from rasd.common import VERSION, gc_policy, net
from rasd.common import logging as rasd_logging
from rasd.controller import server, workers
from rasd.controller.core.remediation import policy
from rasd.controller.executors import bmc, quarantine
from rasd.controller.power import loop as power_loop
from rasd.controller.replication import leader as leader_mod
from rasd.controller.rpc import security


def build_parser() -> argparse.ArgumentParser:
    """The controller's command line."""
    parser = argparse.ArgumentParser(
        prog="rasd-controller",
        description="rasd controller: ingests agent streams, keeps the fleet's state, serves rasctl.",
    )
    parser.add_argument("--listen", default="127.0.0.1:7443", help="gRPC listen address (default %(default)s)")
    parser.add_argument("--db", default="sqlite:///rasd.db", help="SQLAlchemy URL of the store (default %(default)s)")
    parser.add_argument(
        "--metrics-port", type=int, default=9464, help="Prometheus port; -1 disables (default %(default)s)"
    )
    parser.add_argument(
        "--metrics-addr",
        help="Prometheus bind address (default 127.0.0.1 with --insecure, else 0.0.0.0 for the cluster's scraper)",
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="serve plaintext gRPC; allowed only on a loopback address (default: mutual TLS)",
    )
    parser.add_argument(
        "--health-listen",
        help="extra plaintext address serving only grpc.health.v1, for kubelet probes (default: none)",
    )
    security.add_arguments(parser)
    parser.add_argument(
        "--config",
        type=pathlib.Path,
        help="controller.toml with [remediation], [quarantine], [bmc] and [power] tables (see controller/packaging/)",
    )
    parser.add_argument("--no-remediation", action="store_true", help="record health events only; never act on them")
    parser.add_argument(
        "--commit-writer",
        choices=("process", "thread"),
        default="process",
        help="where the repair ladder's commits run: a writer process (default; deciding and committing use "
        "two cores) or the store thread (an in-memory SQLite store needs thread)",
    )
    parser.add_argument(
        "--ingest-workers",
        type=int,
        default=1,
        metavar="N",
        help="serve agent streams from N processes on the same port (PostgreSQL only; each a replica of its own, "
        "see docs/operator-guide.md; default %(default)s)",
    )
    parser.add_argument(
        "--record",
        type=pathlib.Path,
        metavar="PATH",
        help="record every inbound agent message, sent command and decision to PATH (replay: rasd-sim --replay)",
    )
    parser.add_argument("--log-level", default="info", help="debug|info|warning|error (default %(default)s)")
    parser.add_argument("--version", action="version", version=f"rasd-controller {VERSION}")
    return parser


def load_config(path: pathlib.Path) -> dict[str, Any]:
    """Read and validate controller.toml; every error names the offending key.

    Returns:
        remediation_policy (a RemediationPolicy), quarantine (table), bmc (table or absent),
        leader (LeaderSettings or absent).
    """
    data = tomllib.loads(path.read_text())
    known = ("remediation", "quarantine", "bmc", "leader", "power")
    unknown = set(data) - set(known)
    if unknown:
        raise ValueError(f"unknown table(s) {', '.join(sorted(unknown))} (known: {', '.join(known)})")
    config: dict[str, Any] = {
        "remediation_policy": policy.RemediationPolicy.from_mapping(data.get("remediation", {}), prefix="remediation.")
    }
    quarantine_table = data.get("quarantine", {})
    quarantine.open_quarantine(quarantine_table).close()  # validates the table (names the bad key)
    config["quarantine"] = quarantine_table
    if "bmc" in data:
        bmc.BmcSettings.from_mapping(data["bmc"])
        config["bmc"] = data["bmc"]
    if "leader" in data:
        config["leader"] = leader_mod.LeaderSettings.from_mapping(data["leader"])
    if "power" in data:
        power_loop.PowerSettings.from_mapping(data["power"])  # validates the table (names the bad key)
        config["power"] = data["power"]
    return config


def metrics_bind_address(args: argparse.Namespace) -> str:
    """Where the Prometheus port listens: as asked, else loopback for a plaintext (--insecure) controller.

    A plaintext controller is a loopback demo or a developer's; its metrics (node names, GPU
    uuids, labels) bound to every interface were open to the network the gRPC port refused.
    """
    if args.metrics_addr is not None:
        return str(args.metrics_addr)
    return "127.0.0.1" if args.insecure else "0.0.0.0"  # the cluster's scraper reaches the pod, as before


def settings_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> server.ControllerSettings:
    """The controller's settings from its parsed command line; a bad argument exits through parser.error."""
    try:
        host, _port = net.split_host_port(args.listen)
    except ValueError as exc:
        parser.error(f"--listen: {exc}")
    if args.health_listen is not None:
        try:
            net.split_host_port(args.health_listen)
        except ValueError as exc:
            parser.error(f"--health-listen: {exc}")
    if args.insecure and not net.is_loopback_host(host):
        parser.error(f"--listen: refusing plaintext gRPC on non-loopback address {host!r}")
    try:
        security_settings = security.settings_from_args(args)
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    if not -1 <= args.metrics_port <= 65535:
        parser.error(f"--metrics-port: {args.metrics_port} is not a port")
    try:
        config = load_config(args.config) if args.config else {}
    except (OSError, ValueError, tomllib.TOMLDecodeError) as exc:
        parser.error(f"--config {args.config}: {exc}")
    return server.ControllerSettings(
        listen=args.listen,
        db_url=args.db,
        metrics_port=None if args.metrics_port == -1 else args.metrics_port,
        metrics_addr=metrics_bind_address(args),
        remediation=not args.no_remediation,
        remediation_policy=config.get("remediation_policy", policy.RemediationPolicy()),
        quarantine=config.get("quarantine", {}),
        bmc=config.get("bmc"),
        security=security_settings,
        health_listen=args.health_listen,
        record_path=args.record,
        leader=config.get("leader", leader_mod.LeaderSettings()),
        power=config.get("power"),
        commit_writer=args.commit_writer,
    )


def settings_from_argv(argv: Sequence[str]) -> server.ControllerSettings:
    """`settings_from_args` of a command line (an ingest worker builds its settings from the parent's)."""
    parser = build_parser()
    return settings_from_args(parser, parser.parse_args(argv))


def main(argv: Sequence[str] | None = None) -> int:
    """Run one controller replica (or its ingest workers) until SIGTERM or SIGINT."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    settings = settings_from_args(parser, args)
    rasd_logging.configure(args.log_level)
    gc_policy.configure()
    if args.ingest_workers != 1:
        refused = workers.problem(settings, args.ingest_workers)
        if refused is None:
            return workers.run(settings, args.ingest_workers, log_level=args.log_level,
                               build=(settings_from_argv, argv))  # fmt: skip
        if args.ingest_workers < 1 or settings.db_url.startswith("postgresql"):
            parser.error(refused)
        structlog.get_logger("rasd.controller").warning("ingest_workers_ignored", reason=refused, workers=1)
    try:
        return asyncio.run(workers.serve(settings))
    except ValueError as exc:  # e.g. a malformed --db URL, raised before anything listens
        parser.error(str(exc))


if __name__ == "__main__":
    sys.exit(main())
