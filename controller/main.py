"""rasd-controller entry point: arguments → logging → Controller → run until SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import structlog

from rasd.common import VERSION, gc_policy, net
from rasd.common import logging as rasd_logging
from rasd.controller import config as config_mod
from rasd.controller import server, workers
from rasd.controller.ingest import service as ingest_mod
from rasd.controller.rpc import security


def build_parser() -> argparse.ArgumentParser:
    """The controller's command line."""
    parser = argparse.ArgumentParser(
        prog="rasd-controller",
        description="rasd controller: ingests agent streams, keeps the fleet's state, serves rasctl.",
    )
    # The settings flags default to None (not given): config.load puts them over $RASD_* and controller.toml.
    parser.add_argument("--listen", help="gRPC listen address ($RASD_LISTEN; default 127.0.0.1:7443)")
    parser.add_argument("--db", help="SQLAlchemy URL of the store ($RASD_DB; default sqlite:///rasd.db)")
    parser.add_argument(
        "--metrics-port", type=int, help="Prometheus port; -1 disables ($RASD_METRICS_PORT; default 9464)"
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
    parser.add_argument("--no-remediation", action="store_true", default=None,
                        help="record health events only; never act on them")  # fmt: skip
    parser.add_argument(
        "--commit-writer",
        choices=("process", "thread"),
        help="where the repair ladder's commits run: a writer process (default; deciding and committing use "
        "two cores) or the store thread (an in-memory SQLite store needs thread)",
    )
    parser.add_argument(
        "--ingest-workers",
        type=int,
        metavar="N",
        help="serve agent streams from N processes on the same port (PostgreSQL only; each a replica of its own, "
        "see docs/operator-guide.md; default 1)",
    )
    parser.add_argument(
        "--record",
        type=pathlib.Path,
        metavar="PATH",
        help="record every inbound agent message, sent command and decision to PATH (replay: rasd-sim --replay)",
    )
    parser.add_argument("--log-level", help="debug|info|warning|error ($RASD_LOG_LEVEL; default info)")
    parser.add_argument("--version", action="version", version=f"rasd-controller {VERSION}")
    return parser


def load_config(path: pathlib.Path, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Read and check controller.toml (and the $RASD_* variables over it); every error names its key.

    Returns:
        remediation_policy (a RemediationPolicy), leader (LeaderSettings), stragglers
        (StragglerSettings), and each of the quarantine, bmc and power tables that is set (plain data).
    """
    return config_mod.load(file=path, environ={} if environ is None else environ)[1]


def metrics_bind_address(config: config_mod.ControllerConfig, insecure: bool) -> str:
    """Where the Prometheus port listens: as asked, else loopback for a plaintext (--insecure) controller.

    A plaintext controller is a loopback demo or a developer's; its metrics (node names, GPU
    uuids, labels) bound to every interface were open to the network the gRPC port refused.
    """
    if config.metrics_addr is not None:
        return config.metrics_addr
    return "127.0.0.1" if insecure else "0.0.0.0"  # the cluster's scraper reaches the pod, as before


def config_from_args(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[config_mod.ControllerConfig, dict[str, Any]]:
    """The settings of flags over $RASD_* over --config's file; a bad one exits through parser.error."""
    try:
        return config_mod.load(file=args.config, flags=config_mod.flags_of(args))
    except config_mod.ConfigError as exc:
        parser.error(f"bad settings:\n{exc}")


def settings_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> server.ControllerSettings:
    """The controller's settings from its parsed command line; a bad argument exits through parser.error."""
    return settings_and_config(parser, args)[0]


def settings_and_config(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[server.ControllerSettings, config_mod.ControllerConfig]:
    """`settings_from_args`, with the checked model (log level, ingest workers) beside them."""
    config, tables = config_from_args(parser, args)
    try:
        host, _port = net.split_host_port(config.listen)
    except ValueError as exc:
        parser.error(f"--listen: {exc}")
    if config.health_listen is not None:
        try:
            net.split_host_port(config.health_listen)
        except ValueError as exc:
            parser.error(f"--health-listen: {exc}")
    if args.insecure and not net.is_loopback_host(host):
        parser.error(f"--listen: refusing plaintext gRPC on non-loopback address {host!r}")
    try:
        security_settings = security.settings_from_args(args)
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    return server.ControllerSettings(
        listen=config.listen,
        db_url=config.db,
        metrics_port=None if config.metrics_port == -1 else config.metrics_port,
        metrics_addr=metrics_bind_address(config, args.insecure),
        remediation=not config.no_remediation,
        remediation_policy=tables["remediation_policy"],
        quarantine=tables.get("quarantine", {}),
        bmc=tables.get("bmc"),
        security=security_settings,
        health_listen=config.health_listen,
        record_path=args.record,
        leader=tables["leader"],
        power=tables.get("power"),
        commit_writer=config.commit_writer,
        ingest=ingest_mod.IngestSettings(stragglers=tables["stragglers"]),
    ), config


def settings_from_argv(argv: Sequence[str]) -> server.ControllerSettings:
    """`settings_from_args` of a command line (an ingest worker builds its settings from the parent's)."""
    parser = build_parser()
    return settings_from_args(parser, parser.parse_args(argv))


def main(argv: Sequence[str] | None = None) -> int:
    """Run one controller replica (or its ingest workers) until SIGTERM or SIGINT."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    settings, config = settings_and_config(parser, args)
    rasd_logging.configure(config.log_level)
    gc_policy.configure()
    if config.ingest_workers != 1:
        refused = workers.problem(settings, config.ingest_workers)
        if refused is None:
            return workers.run(settings, config.ingest_workers, log_level=config.log_level,
                               build=(settings_from_argv, argv))  # fmt: skip
        if config.ingest_workers < 1 or settings.db_url.startswith("postgresql"):
            parser.error(refused)
        structlog.get_logger("rasd.controller").warning("ingest_workers_ignored", reason=refused, workers=1)
    try:
        return asyncio.run(workers.serve(settings))
    except ValueError as exc:  # e.g. a malformed --db URL, raised before anything listens
        parser.error(str(exc))


if __name__ == "__main__":
    sys.exit(main())
