"""rasd-agent entry point: arguments and config file → logging → backend → spool → run.

Nothing else lives here. Settings come from /etc/rasd/agent.toml (or --config) with command-line
flags taking precedence; the file is read only here.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import pathlib
import signal
import socket
import sys
import time
import tomllib
from collections.abc import Mapping, Sequence
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, start_http_server

from rasd.agent import actions, gpu, kmsg_source, node_ops, runtime, sources, spool, systemd
from rasd.agent import metrics as agent_metrics
from rasd.agent.gpu import simulated
from rasd.common import VERSION, net, tls
from rasd.common import logging as rasd_logging

DEFAULT_CONFIG = pathlib.Path("/etc/rasd/agent.toml")
BOOT_ID_PATH = pathlib.Path("/proc/sys/kernel/random/boot_id")
TLS_DEFAULTS = {"ca": "/etc/rasd/tls/ca.crt", "cert": "/etc/rasd/tls/agent.crt", "key": "/etc/rasd/tls/agent.key"}
"""Where a systemd agent finds its certificate (README, "Certificates")."""


def build_parser() -> argparse.ArgumentParser:
    """The agent's command line."""
    parser = argparse.ArgumentParser(
        prog="rasd-agent",
        description="rasd node agent: streams GPU telemetry and health events to the controller "
        "and carries out its commands.",
    )
    parser.add_argument("--config", type=pathlib.Path, help=f"TOML settings file (default {DEFAULT_CONFIG} if present)")
    parser.add_argument("--node-id", help="this node's id (default: the hostname)")
    parser.add_argument("--controller", help="controller gRPC address host:port (default 127.0.0.1:7443)")
    parser.add_argument("--backend", choices=gpu.BACKEND_NAMES, help="GPU backend (default nvml)")
    parser.add_argument("--gpus", type=int, help="simulated backend: number of GPUs (default 8)")
    parser.add_argument("--seed", type=int, help="simulated backend: seed (default 0)")
    parser.add_argument(
        "--sim-step-period-s",
        type=float,
        help="simulated backend: training step period (default 2.0; 0 = idle)",
    )
    parser.add_argument(
        "--state-dir", type=pathlib.Path, help="where the event spool lives (default /var/lib/rasd-agent)"
    )
    parser.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="topology label (repeatable)")
    parser.add_argument("--metrics-port", type=int, help="Prometheus exporter port; -1 disables (default 9400)")
    parser.add_argument(
        "--kernel-log",
        choices=("kmsg", "journal", "none"),
        help="kernel log source (default: kmsg with nvml, else none)",
    )
    parser.add_argument(
        "--kmsg-path",
        help="kmsg device, FIFO or file (default /dev/kmsg); a file's plain-text lines are followed by byte offset",
    )
    parser.add_argument("--ib-sysfs-root", help="InfiniBand sysfs root (default /sys/class/infiniband if present)")
    parser.add_argument(
        "--failsafe-power-limit-w", type=int, help="per-GPU cap applied after losing the controller (default off)"
    )
    parser.add_argument("--failsafe-after-s", type=float, help="controller outage before the fail-safe (default 300)")
    parser.add_argument("--sim-scenario", help="simulated backend: TOML file of scripted faults for this node")
    parser.add_argument(
        "--enable-destructive-actions",
        dest="destructive_actions",
        action="store_true",
        default=None,
        help="really restart processes, reset GPUs, reboot and validate (default: dry-run)",
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="plaintext gRPC; allowed only to a loopback controller (default: mutual TLS with the [tls] files)",
    )
    parser.add_argument(
        "--tls-ca", help=f"CA bundle the controller's certificate must chain to (default {TLS_DEFAULTS['ca']})"
    )
    parser.add_argument("--tls-cert", help=f"this node's client certificate (default {TLS_DEFAULTS['cert']})")
    parser.add_argument("--tls-key", help=f"its private key (default {TLS_DEFAULTS['key']})")
    parser.add_argument("--tls-server-name", help="name to verify in the controller's certificate (default: its host)")
    parser.add_argument("--log-level", default=None, help="debug|info|warning|error (default info)")
    parser.add_argument("--version", action="version", version=f"rasd-agent {VERSION}")
    return parser


def _parse_labels(pairs: Sequence[str]) -> dict[str, str]:
    labels = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--label {pair!r} is not KEY=VALUE")
        labels[key] = value
    return labels


def resolve_settings(args: argparse.Namespace, file_settings: Mapping[str, Any]) -> dict[str, Any]:
    """Merge defaults, the config file and flags (flags win); name the bad key on bad input."""
    known = {
        "node_id", "controller", "backend", "gpus", "seed", "sim_step_period_s", "state_dir",
        "labels", "insecure", "log_level", "metrics_port", "kernel_log", "kmsg_path", "ib_sysfs_root",
        "failsafe_power_limit_w", "failsafe_after_s", "sim_scenario", "destructive_actions", "commands",
        "tls",
    }  # fmt: skip
    unknown = set(file_settings) - known
    if unknown:
        raise ValueError(f"unknown key(s) in agent config: {', '.join(sorted(unknown))}")
    settings: dict[str, Any] = {
        "node_id": socket.gethostname(),
        "controller": "127.0.0.1:7443",
        "backend": "nvml",
        "gpus": 8,
        "seed": 0,
        "sim_step_period_s": 2.0,
        "state_dir": "/var/lib/rasd-agent",
        "labels": {},
        "insecure": False,
        "log_level": "info",
        "metrics_port": 9400,
        "kernel_log": None,
        "kmsg_path": "/dev/kmsg",
        "ib_sysfs_root": "/sys/class/infiniband" if pathlib.Path("/sys/class/infiniband").is_dir() else "",
        "failsafe_power_limit_w": None,
        "failsafe_after_s": 300.0,
        "sim_scenario": None,
        "destructive_actions": False,
        "commands": {},
        "tls": {},
    }
    settings.update(file_settings)
    for key in known - {"labels", "tls"}:
        value = getattr(args, key, None)
        if value not in (None, False):
            settings[key] = value
    settings["labels"] = {**dict(settings["labels"]), **_parse_labels(args.label)}
    settings["tls"] = _tls_table(args, settings["tls"])
    if settings["kernel_log"] is None:
        settings["kernel_log"] = "kmsg" if settings["backend"] == "nvml" else "none"
    if settings["kernel_log"] not in ("kmsg", "journal", "none"):
        raise ValueError(f"kernel_log {settings['kernel_log']!r} is not one of kmsg, journal, none")
    if not isinstance(settings["metrics_port"], int) or not -1 <= settings["metrics_port"] <= 65535:
        raise ValueError(f"metrics_port must be -1..65535, got {settings['metrics_port']!r}")
    limit = settings["failsafe_power_limit_w"]
    if limit is not None and (not isinstance(limit, int) or not 50 <= limit <= 5000):
        raise ValueError(f"failsafe_power_limit_w must be an integer in 50..5000 W, got {limit!r}")
    allowed_commands = {f.name for f in dataclasses.fields(node_ops.HostCommands)} - {"timeout_s"}
    for name, argv in dict(settings["commands"]).items():
        if name not in allowed_commands:
            raise ValueError(f"commands.{name}: unknown (one of {', '.join(sorted(allowed_commands))})")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError(f"commands.{name}: expected a non-empty list of strings")
    if settings["backend"] not in gpu.BACKEND_NAMES:
        raise ValueError(f"backend {settings['backend']!r} is not one of {', '.join(gpu.BACKEND_NAMES)}")
    if not isinstance(settings["gpus"], int) or not 1 <= settings["gpus"] <= 64:
        raise ValueError(f"gpus must be an integer in 1..64, got {settings['gpus']!r}")
    if not settings["node_id"] or len(settings["node_id"]) > 253:
        raise ValueError("node_id must be 1..253 characters")
    return settings


def _tls_table(args: argparse.Namespace, table: object) -> dict[str, str]:
    """The [tls] table with defaults and --tls-* flags applied; unknown keys are named."""
    if not isinstance(table, Mapping):
        raise ValueError("tls: expected a table with ca, cert, key (and optionally server_name)")
    unknown = set(table) - {"ca", "cert", "key", "server_name"}
    if unknown:
        raise ValueError(f"tls.{sorted(unknown)[0]}: unknown key (known: ca, cert, key, server_name)")
    merged = {**TLS_DEFAULTS, "server_name": "", **{k: str(v) for k, v in table.items()}}
    for key in ("ca", "cert", "key", "server_name"):
        flag = getattr(args, f"tls_{key}", None)
        if flag:
            merged[key] = flag
    return merged


def _boot_id() -> str:
    try:
        return BOOT_ID_PATH.read_text().strip()
    except OSError:
        return "unknown"


def open_backend(settings: Mapping[str, Any]) -> gpu.GpuBackend:
    """Build the configured GPU backend."""
    if settings["backend"] == "simulated":
        period_s = float(settings["sim_step_period_s"])
        workload = simulated.StepWorkload(period_s=period_s) if period_s > 0 else None
        faults = simulated.load_faults(settings["sim_scenario"]) if settings["sim_scenario"] else ()
        return simulated.SimulatedBackend(
            settings["node_id"],
            settings["gpus"],
            settings["seed"],
            workload=workload,
            faults=faults,
            clock=time.time_ns,  # the agent's readings use the wall clock too
        )
    # Imported here so that machines without libnvidia-ml never load pynvml.
    from rasd.agent.gpu import nvml

    return nvml.open_nvml_backend()


async def _serve(settings: Mapping[str, Any]) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    backend = open_backend(settings)
    state_dir = pathlib.Path(settings["state_dir"])
    state_dir.mkdir(parents=True, exist_ok=True)
    journal = spool.Spool(str(state_dir / "spool.db"))
    agent = runtime.Agent(
        runtime.NodeIdentity(
            node_id=settings["node_id"],
            boot_id=_boot_id(),
            hostname=socket.gethostname(),
            labels=settings["labels"],
        ),
        backend,
        journal,
        runtime.LinkSettings(
            controller_address=settings["controller"],
            failsafe_power_limit_w=settings["failsafe_power_limit_w"],
            failsafe_after_s=float(settings["failsafe_after_s"]),
            tls=None if settings["insecure"] else tls.TlsFiles.from_mapping(settings["tls"]),
            tls_server_name=settings["tls"]["server_name"],
        ),
        ops=_node_ops(settings, backend),
        action_settings=actions.ActionSettings(destructive_enabled=bool(settings["destructive_actions"])),
    )
    if settings["kernel_log"] == "kmsg":
        agent.attach_kernel_log(
            kmsg_source.KmsgFollower(state_dir / "kmsg.cursor", path=settings["kmsg_path"]), source_name="kmsg"
        )
    elif settings["kernel_log"] == "journal":
        agent.attach_kernel_log(kmsg_source.JournalFollower(state_dir / "journal.cursor"), source_name="journal")
    if settings["ib_sysfs_root"]:
        agent.attach_ib_poller(sources.IbPoller(settings["ib_sysfs_root"]))
    metrics_port = None
    if settings["metrics_port"] >= 0:
        registry = CollectorRegistry()
        agent_metrics.register(registry, agent)
        try:
            metrics_server, _ = start_http_server(settings["metrics_port"], registry=registry)
        except OSError as exc:
            raise SystemExit(f"rasd-agent: metrics port {settings['metrics_port']}: {exc.strerror}") from None
        metrics_port = metrics_server.server_port
    notifier = systemd.Notifier()
    watchdog = asyncio.create_task(_pet_watchdog(agent, notifier, stop))
    log = structlog.get_logger("rasd.agent")
    log.info(
        "agent_started",
        node=settings["node_id"],
        backend=backend.name,
        gpus=len(backend.inventory()),
        controller=settings["controller"],
        spool_depth=journal.depth(),
        kernel_log=settings["kernel_log"],
        metrics_port=metrics_port,
        pid=os.getpid(),
    )
    notifier.ready(f"streaming {len(backend.inventory())} GPUs to {settings['controller']}")
    try:
        await agent.run(stop)
    finally:
        notifier.stopping()
        watchdog.cancel()
        backend.close()
        journal.close()
    log.info("agent_stopped", node=settings["node_id"], events_spooled=agent.stats.events_spooled)
    return 0


def _node_ops(settings: Mapping[str, Any], backend: gpu.GpuBackend) -> node_ops.NodeOps:
    """Simulated GPUs get simulated repairs; real ones get the host's commands."""
    if isinstance(backend, simulated.SimulatedBackend):
        return node_ops.SimulatedNodeOps(backend)
    overrides = {name: tuple(argv) for name, argv in dict(settings["commands"]).items()}
    return node_ops.HostNodeOps(node_ops.HostCommands(**overrides))


async def _pet_watchdog(agent: runtime.Agent, notifier: systemd.Notifier, stop: asyncio.Event) -> None:
    """Send WATCHDOG=1 while sampling cycles keep succeeding; stay silent when they stall."""
    interval_s = notifier.watchdog_interval_s
    if interval_s is None:
        return
    while not stop.is_set():
        if time.monotonic() - agent.stats.last_cycle_ok_monotonic < 2 * interval_s:
            notifier.watchdog()
        await asyncio.sleep(interval_s)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the agent until SIGTERM or SIGINT."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config_path = args.config or (DEFAULT_CONFIG if DEFAULT_CONFIG.exists() else None)
        file_settings = tomllib.loads(config_path.read_text()) if config_path else {}
        settings = resolve_settings(args, file_settings)
        host, _ = net.split_host_port(settings["controller"])
    except (OSError, ValueError, tomllib.TOMLDecodeError) as exc:
        parser.error(str(exc))
    if settings["insecure"]:
        if not net.is_loopback_host(host):
            parser.error(f"refusing plaintext gRPC to non-loopback controller {host!r}")
    else:
        try:
            tls.TlsFiles.from_mapping(settings["tls"]).read()
        except (OSError, ValueError) as exc:
            parser.error(f"tls: {exc} (or pass --insecure for plaintext to a loopback controller)")
    rasd_logging.configure(settings["log_level"])
    return asyncio.run(_serve(settings))


if __name__ == "__main__":
    sys.exit(main())
