"""agent.toml's keys as pydantic models, and `load`'s checking against them (see `rasd.agent.settings.load`).

Imported only when settings are loaded from agent.toml, flags and ``RASD_*``: the running agent
works on the frozen dataclasses of `rasd.agent.settings` and needs no pydantic.
"""

from __future__ import annotations

import logging
import pathlib
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal, NoReturn

import pydantic

from rasd.agent import gpu
from rasd.agent.settings import (
    FLAGS,
    IB_SYSFS_ROOT,
    TLS_DEFAULTS,
    ActionSettings,
    AgentSettings,
    CommandSettings,
    FailsafeSettings,
    GpuSettings,
    HostDefaults,
    IbSettings,
    KernelLogSettings,
    KernelLogSource,
    KeyPath,
    LinkSettings,
    MetricsSettings,
    SamplingSettings,
    SettingsError,
    SpoolSettings,
    TlsSettings,
)
from rasd.common import net, tls
from rasd.common import settings as settings_layer

_NonEmpty = Annotated[str, pydantic.Field(min_length=1)]
_HostName = Annotated[str, pydantic.Field(min_length=1, max_length=253)]
_Argv = Annotated[tuple[_NonEmpty, ...], pydantic.Field(min_length=1)]
# Any name the logging module knows, in any case (`load` checks it); the chart's schema says the same.
_LogLevel = Annotated[
    str,
    pydantic.Field(
        json_schema_extra={"pattern": "^(?i:" + "|".join(sorted(logging.getLevelNamesMapping())).lower() + ")$"}
    ),
]


class _Table(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", strict=True, frozen=True)


class TlsTable(_Table):
    """agent.toml's [tls]: the node's certificate files (read even with insecure, so a bad one is named)."""

    ca: _NonEmpty = TLS_DEFAULTS["ca"]
    cert: _NonEmpty = TLS_DEFAULTS["cert"]
    key: _NonEmpty = TLS_DEFAULTS["key"]
    server_name: str = ""


class CommandsTable(_Table):
    """agent.toml's [commands]: each a non-empty argv replacing the default (`CommandSettings`)."""

    list_compute_apps: _Argv | None = None
    reset_gpu: _Argv | None = None
    restart_unit: _Argv | None = None
    reboot: _Argv | None = None
    validate_: _Argv | None = pydantic.Field(default=None, alias="validate")  # BaseModel has a validate()
    trough_filler: _Argv | None = None


class AgentFile(_Table):
    """agent.toml's keys, each with its type, its range or allowed values, and its default.

    None where the default depends on other keys or on the host (`load` fills it in).
    """

    node_id: _HostName | None = None
    controller: str = LinkSettings.controller_address
    insecure: bool = False
    log_level: _LogLevel = "info"
    backend: Literal[gpu.BACKEND_NAMES] = "nvml"  # type: ignore[valid-type]
    gpus: Annotated[int, pydantic.Field(ge=1, le=64)] = GpuSettings.gpus
    seed: int = GpuSettings.seed
    sim_step_period_s: Annotated[float, pydantic.Field(ge=0)] = GpuSettings.sim_step_period_s
    sim_scenario: str = ""
    state_dir: _NonEmpty = str(SpoolSettings.state_dir)
    kernel_log: KernelLogSource | None = None
    kmsg_path: _NonEmpty = KernelLogSettings.kmsg_path
    ib_sysfs_root: str | None = None
    failsafe_power_limit_w: Annotated[int, pydantic.Field(ge=50, le=5000)] | None = None
    failsafe_after_s: Annotated[float, pydantic.Field(ge=0)] = FailsafeSettings.after_s
    metrics_port: Annotated[int, pydantic.Field(ge=-1, le=65535)] = MetricsSettings.port
    metrics_addr: _HostName | None = None
    metrics_nvlink_per_link: bool = MetricsSettings.nvlink_per_link
    destructive_actions: bool = False
    labels: dict[str, str] = pydantic.Field(default_factory=dict)
    tls: TlsTable = pydantic.Field(default_factory=TlsTable)
    sampling: settings_layer.model_of(SamplingSettings) = pydantic.Field(  # type: ignore[valid-type]
        default_factory=settings_layer.model_of(SamplingSettings)
    )
    commands: CommandsTable = pydantic.Field(default_factory=CommandsTable)


CHART_SETS: tuple[str, ...] = ("node_id", "state_dir", "tls")
"""agent.toml keys the Helm chart sets itself (the Node's name, agent.stateDir, the certificates'
host path), so its ``agent.config`` leaves them out."""


def chart_config_schema() -> dict[str, Any]:
    """The JSON Schema of the chart's ``agent.config``: agent.toml's keys but `CHART_SETS`.

    No defaults: the chart renders only the keys a user sets, and the agent fills in the rest.
    """
    full = settings_layer.schema_of(AgentFile)
    properties = {key: value for key, value in full["properties"].items() if key not in CHART_SETS}
    for value in properties.values():
        value.pop("default", None)
    properties["controller"]["description"] = "host:port; default: this release's Service"
    return {
        "type": "object",
        "additionalProperties": False,
        "description": "agent.toml key for key, except " + ", ".join(CHART_SETS) + " (set by the chart) "
        "(generated: python helm/generate_schema.py)",
        "properties": properties,
    }


def load(
    table: Mapping[str, Any],
    flags: Mapping[str, Any],
    host: HostDefaults,
    *,
    file_name: str = "agent.toml",
    environ: Mapping[str, str] | None = None,
) -> AgentSettings:
    """`rasd.agent.settings.load`: checked with `AgentFile`, every bad setting named."""
    layers = settings_layer.Layers()
    layers.add(table, lambda path: file_name)
    layers.add(settings_layer.env_table(AgentFile, environ or {}), lambda path: f"env {settings_layer.env_name(path)}")
    given, flag_of = _flag_table(flags)
    layers.add(given, lambda path: flag_of.get(path, "--label"))
    checked, problems = settings_layer.validate(AgentFile, layers.data)
    if checked is None:
        raise SettingsError("\n".join(f"{p.dotted()} ({layers.source_of(p.path)}): {p.message}" for p in problems))
    return _settings(checked, host, lambda path, why: _refuse(layers, path, why))


def _refuse(layers: settings_layer.Layers, path: KeyPath, why: str) -> NoReturn:
    raise SettingsError(f"{'.'.join(path)} ({layers.source_of(path)}): {why}")


def _settings(file: AgentFile, host: HostDefaults, refuse: Callable[[KeyPath, str], NoReturn]) -> AgentSettings:
    """The checked keys as the agent's settings; the defaults that depend on others filled in."""
    try:
        host_name, _ = net.split_host_port(file.controller)
    except ValueError:
        refuse(("controller",), f"expected host:port, got {settings_layer.show(file.controller)}")
    # Any name the logging module knows (warn, critical, ...) works, as it did before it was checked.
    if file.log_level.upper() not in logging.getLevelNamesMapping():
        refuse(
            ("log_level",), f"expected one of debug, info, warning, error, got {settings_layer.show(file.log_level)}"
        )
    if file.insecure and not net.is_loopback_host(host_name):
        refuse(("insecure",), f"refusing plaintext gRPC to non-loopback controller {host_name!r}")
    paths = {key: pathlib.Path(getattr(file.tls, key)) for key in TLS_DEFAULTS}
    commands = file.commands.model_dump(by_alias=True, exclude_none=True)
    return AgentSettings(
        node_id=file.node_id or host.hostname,
        labels=dict(file.labels),
        log_level=file.log_level,
        link=LinkSettings(controller_address=file.controller),
        tls=TlsSettings(files=None if file.insecure else tls.TlsFiles(**paths), server_name=file.tls.server_name),
        gpu=GpuSettings(
            backend=file.backend,
            gpus=file.gpus,
            seed=file.seed,
            sim_step_period_s=file.sim_step_period_s,
            sim_scenario=file.sim_scenario or None,
        ),
        sampling=settings_layer.to_dataclass(file.sampling),
        spool=SpoolSettings(state_dir=pathlib.Path(file.state_dir)),
        kernel_log=KernelLogSettings(
            source=file.kernel_log or ("kmsg" if file.backend == "nvml" else "none"), kmsg_path=file.kmsg_path
        ),
        ib=IbSettings(sysfs_root=_ib_sysfs_root(file, host)),
        failsafe=FailsafeSettings(power_limit_w=file.failsafe_power_limit_w, after_s=file.failsafe_after_s),
        metrics=MetricsSettings(
            port=file.metrics_port,
            addr=file.metrics_addr or ("127.0.0.1" if file.insecure else MetricsSettings.addr),
            nvlink_per_link=file.metrics_nvlink_per_link,
        ),
        actions=ActionSettings(destructive_enabled=file.destructive_actions),
        commands=CommandSettings(**commands),
    )


def _ib_sysfs_root(file: AgentFile, host: HostDefaults) -> str:
    """As set ("" reads none), else IB_SYSFS_ROOT where the host has it."""
    if file.ib_sysfs_root is not None:
        return file.ib_sysfs_root
    return IB_SYSFS_ROOT if host.ib_sysfs_present else ""


def _flag_table(flags: Mapping[str, Any]) -> tuple[dict[str, Any], dict[KeyPath, str]]:
    """The flags given as a table like agent.toml's, and the flag that set each key path."""
    table: dict[str, Any] = {}
    flag_of: dict[KeyPath, str] = {}
    for dest, (path, flag) in FLAGS.items():
        value = flags.get(dest)
        if value is None or value is False:  # not given (a switch's False is its absence)
            continue
        node = table
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = str(value) if isinstance(value, pathlib.PurePath) else value
        flag_of[path] = flag
    for pair in flags.get("label") or ():
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SettingsError(f"--label: expected KEY=VALUE, got {settings_layer.show(pair)}")
        table.setdefault("labels", {})[key] = value
    return table, flag_of
