"""Scenario files for rasd-sim: the workload, the faults to inject, scripted operator actions and power.

A scenario is TOML (see sim/scenarios/demo.toml). `load()` validates every field and names the
offending key on bad input. Built-in scenarios ship inside the package (``demo``, and the ladder's
library as ``ladder/<name>``, sim/scenarios/ladder/); any other name is a path. Faults use the
simulated backend's vocabulary (`rasd.agent.gpu.simulated.ScriptedFault`) plus the index of the node
they hit; ``[[action_faults]]`` say what goes wrong with a node's repairs
(`rasd.agent.gpu.simulated.ActionFault`: fails, hangs, a reboot that never comes back, a BMC that does
not answer); ``[expect]`` states the ladder's path and end state the run must show (`Expectation`,
checked by ``report.expectations``).
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import pathlib
import tomllib
from collections.abc import Mapping
from typing import Any

from rasd.agent.gpu import simulated
from rasd.controller import stragglers as stragglers_mod
from rasd.controller.core.power import policy as power_policy
from rasd.controller.core.remediation import policy

OPERATOR_ACTIONS = ("set_power_cap", "accuse_sdc", "quarantine", "release", "pause_automation", "resume_automation")
OPERATOR_KEYS = {
    "set_power_cap": {"power_limit_w"},
    "accuse_sdc": {"node", "gpu", "reason"},
    "quarantine": {"node", "gpu", "reason"},
    "release": {"node", "gpu", "reason", "force"},
    "pause_automation": {"reason"},
    "resume_automation": {"reason"},
}
"""What each `[[operator]]` action takes besides ``at_s`` and ``action``."""
LIBRARIES = ("ladder", "stragglers")
"""Folders of built-in scenarios, loaded as ``<folder>/<name>``."""


class ScenarioError(ValueError):
    """A scenario file is malformed; the message names the key."""


@dataclasses.dataclass(frozen=True)
class Workload:
    """The training job every simulated GPU runs."""

    period_s: float = 2.0
    compute_fraction: float = 0.7
    compute_w: tuple[float, float] = (650.0, 700.0)
    comm_w: tuple[float, float] = (100.0, 150.0)
    start_after_s: float = 0.0
    """Job start, seconds after the fleet is up (idle before)."""
    stop_after_s: float | None = None
    """Job stop, seconds after the fleet is up; None: runs to the end."""
    checkpoint_every_steps: int = 0
    checkpoint_s: float = 0.0


GPU_MODELS = {"h100": simulated.H100_SXM, "b200": simulated.B200}
"""Simulated products a scenario may choose (b200 has power-smoothing hardware, h100 has not)."""


@dataclasses.dataclass(frozen=True)
class BudgetChange:
    """A scripted operator budget change (AdminService SetPowerBudget)."""

    at_s: float
    domain: str
    """"cluster", "row-N", "rack-NN" or "node-NNN" (the names rasd-sim gives its fleet)."""
    budget_w: int


@dataclasses.dataclass(frozen=True)
class LoadChange:
    """The job stops (or resumes) on the first `nodes` nodes: a load change for sloshing."""

    at_s: float
    nodes: int
    running: bool = False


@dataclasses.dataclass(frozen=True)
class PowerScenario:
    """The `[power]` table: run the controller's power loop over a budget tree built for the fleet."""

    cluster_budget_w: float | None = None
    """None: the sum of every GPU's maximum cap (a budget that never binds)."""
    rack_budget_w: float | None = None
    node_budget_w: float | None = None
    gpu_model: str = "h100"
    policy: power_policy.PowerPolicy = dataclasses.field(default_factory=power_policy.PowerPolicy)
    loop: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Scalar settings of the loop (detect_window_s, draw_window_s, ...) passed to `[power]`."""
    budget_changes: tuple[BudgetChange, ...] = ()
    managed: bool = True
    """False: run the same fleet without the power loop (caps and smoothing stay at default)."""
    load_changes: tuple[LoadChange, ...] = ()


POWER_LOOP_KEYS = frozenset(
    {"telemetry_stale_s", "detect_window_s", "bmc_fallback_after_s", "min_step_interval_s", "draw_window_s", "seed"}
)


def parse_power(data: Any, source: str) -> PowerScenario:
    """The `[power]` table of a scenario; errors name the key."""
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: power must be a table")
    known = {
        "cluster_budget_w",
        "rack_budget_w",
        "node_budget_w",
        "gpu_model",
        "policy",
        "budget_changes",
        "managed",
        "load_changes",
    }
    unknown = set(data) - known - POWER_LOOP_KEYS
    if unknown:
        raise ScenarioError(f"{source}: power: unknown key(s) {', '.join(sorted(unknown))}")
    budgets = {
        key: _number(data, key, "power", minimum=1) if key in data else None
        for key in ("cluster_budget_w", "rack_budget_w", "node_budget_w")
    }
    model = data.get("gpu_model", "h100")
    if model not in GPU_MODELS:
        raise ScenarioError(f"power.gpu_model: {model!r} is not one of {', '.join(GPU_MODELS)}")
    try:
        chosen_policy = power_policy.PowerPolicy.from_mapping(data.get("policy", {}))
    except power_policy.PolicyError as exc:
        raise ScenarioError(f"{source}: power.policy.{exc.key}: {exc}") from None
    changes = []
    for index, change in enumerate(data.get("budget_changes", [])):
        where = f"power.budget_changes[{index}]"
        if not isinstance(change, dict) or not isinstance(change.get("domain"), str) or not change["domain"]:
            raise ScenarioError(f"{where}.domain: expected a domain name")
        changes.append(
            BudgetChange(
                at_s=_number(change, "at_s", where),
                domain=change["domain"],
                budget_w=int(_number(change, "budget_w", where, minimum=1)),
            )
        )
    loads = []
    for index, change in enumerate(data.get("load_changes", [])):
        where = f"power.load_changes[{index}]"
        running = change.get("running", False) if isinstance(change, dict) else None
        if not isinstance(running, bool):
            raise ScenarioError(f"{where}.running: expected true or false, got {running!r}")
        loads.append(
            LoadChange(at_s=_number(change, "at_s", where), nodes=int(_number(change, "nodes", where)), running=running)
        )
    managed = data.get("managed", True)
    if not isinstance(managed, bool):
        raise ScenarioError(f"power.managed: expected true or false, got {managed!r}")
    return PowerScenario(
        **budgets,
        gpu_model=model,
        policy=chosen_policy,
        loop={k: v for k, v in data.items() if k in POWER_LOOP_KEYS},
        budget_changes=tuple(sorted(changes, key=lambda c: c.at_s)),
        managed=managed,
        load_changes=tuple(sorted(loads, key=lambda c: c.at_s)),
    )


@dataclasses.dataclass(frozen=True)
class NodeFault:
    """A scripted fault on one simulated node (its index, modulo the fleet size)."""

    node: int
    fault: simulated.ScriptedFault


@dataclasses.dataclass(frozen=True)
class NodeActionFault:
    """What goes wrong with the repairs of one simulated node (its index, modulo the fleet size)."""

    node: int
    fault: simulated.ActionFault


@dataclasses.dataclass(frozen=True)
class Expectation:
    """The `[expect]` table: what the run must show on one node (``report.expectations`` checks it)."""

    node: int = 0
    path: tuple[str, ...] | None = None
    """The ladder's path there: its repair commands in order as "kind:outcome" ("reset_gpu:refused",
    "run_validation:pass"); None: not checked."""
    tickets: tuple[str, ...] | None = None
    """The states of its open tickets at the end, sorted ("watching", "rma_pending"); None: not checked."""
    quarantined: tuple[str, ...] | None = None
    """What stays quarantined there at the end, sorted: "node", "gpu:<index>"; None: not checked."""
    run_s: float = 10.0
    """How long the run must last for it (the library's tests run it that long)."""


_PATH_OUTCOMES = frozenset(
    {"succeeded", "failed", "refused", "timed_out", "not_supported", "dry_run", "cancelled", "pending", "dispatched"}
    | {"pass", "fail", "suspect", "software_drift"}
)


def parse_expectation(data: Any, source: str) -> Expectation:
    """The `[expect]` table; errors name the key."""
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: expect must be a table")
    unknown = set(data) - {f.name for f in dataclasses.fields(Expectation)}
    if unknown:
        raise ScenarioError(f"{source}: expect: unknown key(s) {', '.join(sorted(unknown))}")
    lists: dict[str, tuple[str, ...] | None] = {}
    for key in ("path", "tickets", "quarantined"):
        value = data.get(key)
        if value is not None and (not isinstance(value, list) or not all(isinstance(v, str) for v in value)):
            raise ScenarioError(f"expect.{key}: expected a list of strings, got {value!r}")
        lists[key] = None if value is None else tuple(value)
    for step in lists["path"] or ():
        kind, _, outcome = step.partition(":")
        if kind not in _PATH_KINDS or (outcome and outcome not in _PATH_OUTCOMES):
            raise ScenarioError(
                f"expect.path: {step!r} is not kind[:outcome] with kind one of {', '.join(sorted(_PATH_KINDS))}"
            )
    node = data.get("node", 0)
    if isinstance(node, bool) or not isinstance(node, int) or node < 0:
        raise ScenarioError(f"expect.node: expected a node index ≥ 0, got {node!r}")
    return Expectation(
        node=node,
        path=lists["path"],
        tickets=None if lists["tickets"] is None else tuple(sorted(lists["tickets"])),
        quarantined=None if lists["quarantined"] is None else tuple(sorted(lists["quarantined"])),
        run_s=_number(data, "run_s", "expect", minimum=1.0) if "run_s" in data else 10.0,
    )


_PATH_KINDS = frozenset(
    {"restart_process", "reset_gpu", "reboot_node", "power_cycle_bmc", "run_validation", "open_rma"}
)
"""The commands a ladder's path lists (`Expectation.path`): its rungs, validations and RMA."""


@dataclasses.dataclass(frozen=True)
class OperatorAction:
    """A scripted operator action: a power-cap change, an SDC accusation, a quarantine or release, a pause.

    The power cap is fleet-wide; an accusation names a GPU; a quarantine or release by hand (rasctl's)
    names a GPU or the node; automation is paused or resumed fleet-wide.
    """

    at_s: float
    action: str
    power_limit_w: int = 0
    node: int = 0
    gpu: int | None = 0
    """The GPU's index on its node; None: the node (a quarantine or release of the whole node)."""
    reason: str = ""
    force: bool = False
    """A release without a passing validation (rasctl release --force)."""


@dataclasses.dataclass(frozen=True)
class Scenario:
    """A whole scenario."""

    name: str
    description: str
    workload: Workload
    faults: tuple[NodeFault, ...]
    operator: tuple[OperatorAction, ...]
    remediation: policy.RemediationPolicy = dataclasses.field(default_factory=policy.RemediationPolicy)
    """The controller's remediation policy for this scenario (the `[remediation]` table)."""
    power: PowerScenario | None = None
    """The `[power]` table; None: no power loop (the fleet draws at its default caps)."""
    action_faults: tuple[NodeActionFault, ...] = ()
    """The `[[action_faults]]`: what goes wrong with which node's repairs."""
    expect: Expectation | None = None
    """The `[expect]` table; None: the run is not checked against expectations."""
    stragglers: stragglers_mod.StragglerSettings = dataclasses.field(default_factory=stragglers_mod.StragglerSettings)
    """The controller's straggler watch for this scenario (the `[stragglers]` table, as controller.toml's)."""


def _number(data: Mapping[str, Any], key: str, where: str, *, minimum: float = 0.0) -> float:
    value = data.get(key)
    if not isinstance(value, int | float) or isinstance(value, bool) or value < minimum:
        raise ScenarioError(f"{where}.{key}: expected a number ≥ {minimum:g}, got {value!r}")
    return float(value)


def _pair(data: Mapping[str, Any], key: str, where: str, default: tuple[float, float]) -> tuple[float, float]:
    value = data.get(key, list(default))
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not all(isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 for v in value)
        or value[0] > value[1]
    ):
        raise ScenarioError(f"{where}.{key}: expected [low, high] watts with low ≤ high, got {value!r}")
    return float(value[0]), float(value[1])


def _parse_workload(workload_data: Any, source: str) -> Workload:
    """The `[workload]` table (defaults for what it leaves out); errors name the key."""
    if not isinstance(workload_data, dict):
        raise ScenarioError(f"{source}: workload must be a table")
    workload = Workload(
        period_s=_number(workload_data, "period_s", "workload", minimum=0.05) if "period_s" in workload_data else 2.0,
        compute_fraction=(
            _number(workload_data, "compute_fraction", "workload") if "compute_fraction" in workload_data else 0.7
        ),
        compute_w=_pair(workload_data, "compute_w", "workload", (650.0, 700.0)),
        comm_w=_pair(workload_data, "comm_w", "workload", (100.0, 150.0)),
        start_after_s=_number(workload_data, "start_after_s", "workload") if "start_after_s" in workload_data else 0.0,
        stop_after_s=_number(workload_data, "stop_after_s", "workload") if "stop_after_s" in workload_data else None,
        checkpoint_every_steps=(
            int(_number(workload_data, "checkpoint_every_steps", "workload"))
            if "checkpoint_every_steps" in workload_data
            else 0
        ),
        checkpoint_s=_number(workload_data, "checkpoint_s", "workload") if "checkpoint_s" in workload_data else 0.0,
    )
    extra = set(workload_data) - {f.name for f in dataclasses.fields(Workload)}
    if extra:
        raise ScenarioError(f"{source}: workload: unknown key(s) {', '.join(sorted(extra))}")
    if not 0 < workload.compute_fraction < 1:
        raise ScenarioError(f"workload.compute_fraction: must be in (0, 1), got {workload.compute_fraction}")
    return workload


def parse(data: Mapping[str, Any], *, source: str) -> Scenario:
    """Validate a parsed TOML mapping into a Scenario."""
    unknown = set(data) - {
        "name",
        "description",
        "workload",
        "faults",
        "operator",
        "remediation",
        "power",
        "action_faults",
        "expect",
        "stragglers",
    }
    if unknown:
        raise ScenarioError(f"{source}: unknown key(s) {', '.join(sorted(unknown))}")
    workload = _parse_workload(data.get("workload", {}), source)
    faults = []
    for index, fault in enumerate(data.get("faults", [])):
        where = f"faults[{index}]"
        node = fault.get("node", 0)
        if not isinstance(node, int) or node < 0:
            raise ScenarioError(f"{where}.node: expected a node index ≥ 0, got {node!r}")
        try:
            faults.append(NodeFault(node, simulated.parse_fault(fault, where)))
        except ValueError as exc:
            raise ScenarioError(str(exc)) from None
    operator = [_operator_action(action, f"operator[{index}]") for index, action in enumerate(data.get("operator", []))]
    try:
        remediation = policy.RemediationPolicy.from_mapping(data.get("remediation", {}), prefix="remediation.")
    except policy.PolicyError as exc:
        raise ScenarioError(f"{source}: {exc}") from None
    try:
        stragglers = stragglers_mod.StragglerSettings.from_mapping(data.get("stragglers", {}))
    except ValueError as exc:
        raise ScenarioError(f"{source}: {exc}") from None
    return Scenario(
        stragglers=stragglers,
        action_faults=_action_faults(data.get("action_faults", [])),
        expect=parse_expectation(data["expect"], source) if "expect" in data else None,
        power=parse_power(data["power"], source) if "power" in data else None,
        remediation=remediation,
        name=str(data.get("name", source)),
        description=str(data.get("description", "")),
        workload=workload,
        faults=tuple(sorted(faults, key=lambda f: f.fault.at_s)),
        operator=tuple(sorted(operator, key=lambda a: a.at_s)),
    )


def _operator_action(action: Mapping[str, Any], where: str) -> OperatorAction:
    """One `[[operator]]` table; errors name the table and the key."""
    kind = action.get("action")
    if kind not in OPERATOR_ACTIONS:
        raise ScenarioError(f"{where}.action: {kind!r} is not one of {', '.join(OPERATOR_ACTIONS)}")
    if unknown := set(action) - {"at_s", "action"} - OPERATOR_KEYS[kind]:
        raise ScenarioError(f"{where}: unknown key(s) for {kind}: {', '.join(sorted(unknown))}")
    at_s = _number(action, "at_s", where)
    if kind == "set_power_cap":
        return OperatorAction(at_s, kind, power_limit_w=int(_number(action, "power_limit_w", where, minimum=1)))
    if kind in ("pause_automation", "resume_automation"):
        return OperatorAction(at_s, kind, reason=str(action.get("reason", "")))
    node = int(_number(action, "node", where))
    if kind == "accuse_sdc":
        gpu = int(_number(action, "gpu", where))
        return OperatorAction(at_s, kind, node=node, gpu=gpu, reason=str(action.get("reason", "loss spike")))
    force = action.get("force", False)
    if not isinstance(force, bool):
        raise ScenarioError(f"{where}.force: expected true or false, got {force!r}")
    gpu_or_node = int(_number(action, "gpu", where)) if "gpu" in action else None
    return OperatorAction(
        at_s, kind, node=node, gpu=gpu_or_node, reason=str(action.get("reason", "by hand")), force=force
    )


def _action_faults(tables: Any) -> tuple[NodeActionFault, ...]:
    """The `[[action_faults]]` tables; errors name the table and the key."""
    if not isinstance(tables, list):
        raise ScenarioError(f"action_faults: expected [[action_faults]] tables, got {tables!r}")
    out = []
    for index, table in enumerate(tables):
        where = f"action_faults[{index}]"
        if not isinstance(table, dict):
            raise ScenarioError(f"{where}: expected a table, got {table!r}")
        node = table.get("node", 0)
        if isinstance(node, bool) or not isinstance(node, int) or node < 0:
            raise ScenarioError(f"{where}.node: expected a node index ≥ 0, got {node!r}")
        try:
            out.append(NodeActionFault(node, simulated.parse_action_fault(table, where)))
        except ValueError as exc:
            raise ScenarioError(str(exc)) from None
    return tuple(out)


def builtin_names() -> list[str]:
    """Names of the scenarios shipped with rasd."""
    folder = importlib.resources.files("rasd.sim") / "scenarios"
    return sorted(p.name.removesuffix(".toml") for p in folder.iterdir() if p.name.endswith(".toml"))


def library_names(library: str = "ladder") -> list[str]:
    """Names of the built-in scenarios of a library folder, as `load` takes them ("ladder/restart-ok")."""
    folder = importlib.resources.files("rasd.sim") / "scenarios" / library
    return sorted(f"{library}/{p.name.removesuffix('.toml')}" for p in folder.iterdir() if p.name.endswith(".toml"))


def load(name_or_path: str) -> Scenario:
    """A built-in scenario by name (``demo``, ``ladder/<name>``), or a TOML file by path."""
    builtin = name_or_path in builtin_names() or (
        name_or_path.partition("/")[0] in LIBRARIES and name_or_path in library_names(name_or_path.partition("/")[0])
    )
    if builtin:
        text = (importlib.resources.files("rasd.sim") / "scenarios" / f"{name_or_path}.toml").read_text()
        source = name_or_path
    else:
        path = pathlib.Path(name_or_path)
        if not path.is_file():
            raise ScenarioError(
                f"scenario {name_or_path!r} is neither a built-in ({', '.join(builtin_names())}) nor a file"
            )
        text, source = path.read_text(), str(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{source}: not valid TOML: {exc}") from None
    return parse(data, source=source)
