"""rasd-controller's settings as one typed model: controller.toml, ``RASD_*`` variables and flags.

Precedence, per key: flags > environment > controller.toml > defaults. Environment names are
``RASD_<KEY>`` for the top-level keys (``RASD_DB``, ``RASD_LISTEN``, ``RASD_LOG_LEVEL`` ...) and
``RASD_<TABLE>__<KEY>`` below (``RASD_LEADER__LEASE_S``, ``RASD_REMEDIATION__ESCALATION__MAX_ATTEMPTS_RESET_GPU``).

`ControllerConfig` is the model: its tables are made from the settings dataclasses the controller
takes (`settings.model_of`), so a key exists in the file, the environment, the chart's schema and the
code at once. `load` checks the merged sources in one go and raises `ConfigError` listing every bad
key (its path, its source, the type or the allowed values) before anything is used; then the
semantic checks of each table run (ranges between keys, URLs), the same way.

`chart_config_schema` is the Helm chart's ``config`` in its values.schema.json (helm/generate_schema.py
puts it there).
"""

from __future__ import annotations

import os
import pathlib
import re
import tomllib
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal

import pydantic

from rasd.common import settings
from rasd.controller import stragglers
from rasd.controller.core.power import policy as power_policy
from rasd.controller.core.remediation import policy
from rasd.controller.executors import bmc, quarantine
from rasd.controller.power import loop as power_loop
from rasd.controller.replication import leader

TABLES = ("remediation", "quarantine", "bmc", "leader", "power", "stragglers")
"""The tables of controller.toml (and of the chart's ``config``)."""


class ConfigError(ValueError):
    """Bad settings: one line per problem, each naming the key path, its source and what is allowed."""


class _Table(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", strict=True, frozen=True)


_Name = Annotated[str, pydantic.Field(min_length=1)]
_Watts = Annotated[float, pydantic.Field(gt=0)]


class PowerTreeNode(_Table):
    """A node of the budget tree."""

    name: _Name = pydantic.Field(description="the agent's node id")
    budget_w: _Watts | None = None
    min_w: Annotated[float, pydantic.Field(ge=0)] | None = pydantic.Field(
        default=None, description="normally set from the GPU inventory"
    )


class PowerTreeRack(_Table):
    """A rack of the budget tree."""

    name: _Name
    budget_w: _Watts | None = None
    nodes: Annotated[tuple[PowerTreeNode, ...], pydantic.Field(min_length=1)]


class PowerTreeRow(_Table):
    """A row of the budget tree."""

    name: _Name
    budget_w: _Watts | None = None
    racks: Annotated[tuple[PowerTreeRack, ...], pydantic.Field(min_length=1)]


class PowerTreeTable(_Table):
    """[power.tree]: cluster -> rows -> racks -> nodes (rasd.controller.core.power.tree).

    The controller checks every budget against the minimum caps under it.
    """

    name: _Name = "cluster"
    budget_w: _Watts
    rows: Annotated[tuple[PowerTreeRow, ...], pydantic.Field(min_length=1)]


PowerPolicyModel = settings.model_of(power_policy.PowerPolicy)


class PowerTable(settings.model_of(power_loop.PowerSettings, frozenset({"tree", "policy"}))):  # type: ignore[misc]
    """[power]: the power loop; absent, no power management (rasd.controller.power.loop.PowerSettings)."""

    tree: PowerTreeTable = None  # type: ignore[assignment]  # required when [power] is there: checked with the tree
    policy: PowerPolicyModel = pydantic.Field(default_factory=PowerPolicyModel)  # type: ignore[valid-type]


RemediationModel = settings.model_of(policy.RemediationPolicy)
QuarantineModel = settings.model_of(quarantine.QuarantineSettings)
BmcModel = settings.model_of(bmc.BmcSettings)
LeaderModel = settings.model_of(leader.LeaderSettings)
StragglersModel = settings.model_of(stragglers.StragglerSettings)


class ControllerConfig(_Table):
    """rasd-controller's settings; the tables are controller.toml's."""

    listen: str = "127.0.0.1:7443"
    db: str = "sqlite:///rasd.db"
    metrics_port: Annotated[int, pydantic.Field(ge=-1, le=65535)] = 9464
    metrics_addr: str | None = None
    health_listen: str | None = None
    no_remediation: bool = False
    commit_writer: Literal["process", "thread"] = "process"
    ingest_workers: int = 1
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    remediation: RemediationModel = pydantic.Field(default_factory=RemediationModel)  # type: ignore[valid-type]
    quarantine: QuarantineModel = pydantic.Field(default_factory=QuarantineModel)  # type: ignore[valid-type]
    bmc: BmcModel = pydantic.Field(default_factory=BmcModel)  # type: ignore[valid-type]
    leader: LeaderModel = pydantic.Field(default_factory=LeaderModel)  # type: ignore[valid-type]
    power: PowerTable = None  # type: ignore[assignment]  # absent: no power loop
    stragglers: StragglersModel = pydantic.Field(default_factory=StragglersModel)  # type: ignore[valid-type]


FLAG_KEYS = tuple(key for key in ControllerConfig.model_fields if key not in TABLES)
"""The top-level keys, each also a flag (``--db`` ...) and a variable (``RASD_DB`` ...)."""


def flags_of(args: Any) -> dict[str, Any]:
    """The settings flags of a parsed command line (argparse.Namespace); None: not given."""
    return {key: getattr(args, key, None) for key in FLAG_KEYS}


def flag_name(key: str) -> str:
    """The flag of a top-level key: db → --db, no_remediation → --no-remediation."""
    return "--" + key.replace("_", "-")


def load(
    *,
    file: pathlib.Path | None = None,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> tuple[ControllerConfig, dict[str, Any]]:
    """The settings from controller.toml, the environment and the flags given (not their defaults).

    Returns:
        The checked model, and the tables that were set (plain data, as controller.toml has them)
        with `remediation_policy`, `leader` and `stragglers` built.

    Raises:
        ConfigError: every problem, one per line; nothing is returned half-checked.
    """
    layers = settings.Layers()
    if file is not None:
        try:
            table = tomllib.loads(file.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{file}: {exc}") from None
        layers.add(table, lambda path: str(file))
    layers.add(settings.env_table(ControllerConfig, os.environ if environ is None else environ),
               lambda path: f"env {settings.env_name(path)}")  # fmt: skip
    layers.add({k: v for k, v in (flags or {}).items() if v is not None}, lambda path: flag_name(path[0]))
    checked, problems = settings.validate(ControllerConfig, layers.data)
    if checked is None:
        raise ConfigError("\n".join(f"{p.dotted()} ({layers.source_of(p.path)}): {p.message}" for p in problems))
    return checked, _built_tables(checked, layers)


def _built_tables(checked: ControllerConfig, layers: settings.Layers) -> dict[str, Any]:
    """The tables set, run through their builders (the semantic checks); every failure collected."""
    tables = {
        key: getattr(checked, key).model_dump(exclude_unset=True) for key in TABLES if key in checked.model_fields_set
    }
    builders: dict[str, Callable[[Any], Any]] = {
        "remediation": lambda t: policy.RemediationPolicy.from_mapping(t, prefix="remediation."),
        "quarantine": lambda t: quarantine.open_quarantine(t).close(),
        "bmc": bmc.BmcSettings.from_mapping,
        "leader": leader.LeaderSettings.from_mapping,
        "power": power_loop.PowerSettings.from_mapping,
        "stragglers": stragglers.StragglerSettings.from_mapping,
    }
    built: dict[str, Any] = {
        "remediation_policy": policy.RemediationPolicy(),
        "leader": leader.LeaderSettings(),
        "stragglers": stragglers.StragglerSettings(),
    }
    problems = []
    for key, table in tables.items():
        try:
            value = builders[key](table)
        except ValueError as exc:
            for line in str(exc).splitlines():
                where, _, what = line.partition(":")
                path = [part for part in re.split(r"[.\[\]]+", where) if part and not part.isdigit()]
                problems.append(f"{where} ({layers.source_of(path)}):{what}")
            continue
        if key == "remediation":
            built["remediation_policy"] = value
        elif key in ("leader", "stragglers"):
            built[key] = value
        else:
            built[key] = table
    if problems:
        raise ConfigError("\n".join(problems))
    return built


def chart_config_schema() -> dict[str, Any]:
    """The JSON Schema of the chart's ``config``: controller.toml's tables.

    No defaults: the chart renders only the keys a user sets.
    """
    full = settings.schema_of(ControllerConfig)
    config = {
        "type": "object",
        "additionalProperties": False,
        "description": "controller.toml, table for table and key for key (generated: python helm/generate_schema.py)",
        "properties": {key: full["properties"][key] for key in TABLES},
    }
    for table in config["properties"].values():
        table.pop("default", None)
    return config
