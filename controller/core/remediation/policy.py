"""Remediation settings: thresholds, windows, budgets and limits, as frozen dataclasses.

Groups, one per core module, plus `RemediationPolicy` that holds them all:

- `ClassificationPolicy` (``classify``): counter thresholds, IB flap detection, XID overrides;
- `CorrelationPolicy` (``correlate``): dedupe, secondary and sticky windows;
- `EscalationPolicy` (``escalation``): the ladder's windows, per-rung attempt budgets, timeouts;
- `DisruptionPolicy` (``blast_radius``): disruption budget, circuit breaker, storm cooldown;
- `SdcPolicy` (``sdc``): rolling sweeps; `LostNodePolicy` (``lost_nodes``): when a silent node is lost.

Each has defaults that are safe for a fleet of 8-GPU nodes, and ``from_mapping`` that builds it
from a plain dict (a parsed TOML table), checks every key and value, and raises `PolicyError`
naming the offending key (``"escalation.max_attempts_reset_gpu: must be >= 0, got -1"``).
Durations are seconds (``_s``), percentages are 0-100 (``_pct``), rates are per second
(``_per_s``).

Pure: no file or environment access; ``main.py`` reads the TOML and passes the dict in.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from typing import Any, Literal, Self

from rasd.common import settings


class PolicyError(ValueError):
    """A policy mapping has an unknown key or a bad value; the message starts with the key path."""


def _build(cls: type[Any], data: Mapping[str, Any], prefix: str) -> Any:
    """Build dataclass ``cls`` from ``data``, naming any unknown key or bad value."""
    obj = cls(**settings.typed_values(cls, data, prefix, PolicyError))
    obj.validate(prefix)
    return obj


def _require(ok: bool, path: str, message: str, value: Any) -> None:
    if not ok:
        raise PolicyError(f"{path}: {message}, got {value!r}")


ActionWord = Literal["none", "restart_process", "reset_gpu", "reboot_node", "rma", "contact_support", "investigate"]
"""The actions an Xid override may recommend (the settings layer refuses any other word, listing these)."""


@dataclasses.dataclass(frozen=True)
class ClassificationPolicy:
    """Thresholds that turn counters and events into a component, severity and recommended action."""

    ecc_sbe_rate_warn_per_s: float = 10.0
    """Corrected ECC errors per second at or above which the GPU gets a warning (DCGM's limit is 10)."""
    remapped_rows_uncorrectable_rma: int = 512
    """Uncorrectable remapped rows at or above which the GPU goes to RMA (DCGM: 512)."""
    retired_pages_rma: int = 63
    """Retired pages at or above which the GPU goes to RMA (DCGM_LIMIT_MAX_RETIRED_PAGES = 63)."""
    nvlink_crc_rate_per_s: float = 100.0
    """NVLink CRC errors per second at or above which the link needs a GPU reset (DCGM: 100/s)."""
    pcie_replay_rate_per_s: float = 10.0
    """PCIe replays per second at or above which a person must look (reseat); set per fleet."""
    ib_flap_state_changes: int = 6
    """IB port state changes within ``ib_flap_window_s`` that make a flap storm (6 = 3 down/up)."""
    ib_flap_window_s: float = 600.0
    """Window for counting IB port state changes."""
    ib_flap_isolation: Literal["node", "port"] = "node"
    """What a flap storm isolates: "node" (quarantine the node) or "port" (only that port)."""
    xid_action_overrides: Mapping[int, ActionWord] = dataclasses.field(default_factory=dict)
    """Per-Xid recommended action replacing the catalog's (TOML: ``[classification.xid_action_overrides]
    "13" = "reset_gpu"``). Values: none, restart_process, reset_gpu, reboot_node, rma,
    contact_support, investigate."""

    def validate(self, prefix: str = "") -> None:
        """Check ranges; raise PolicyError naming the key."""
        for name in (
            "ecc_sbe_rate_warn_per_s",
            "nvlink_crc_rate_per_s",
            "pcie_replay_rate_per_s",
            "ib_flap_window_s",
        ):
            value = getattr(self, name)
            _require(value > 0, f"{prefix}{name}", "must be > 0", value)
        for name in ("remapped_rows_uncorrectable_rma", "retired_pages_rma"):
            value = getattr(self, name)
            _require(value >= 1, f"{prefix}{name}", "must be >= 1", value)
        _require(
            self.ib_flap_state_changes >= 2,
            f"{prefix}ib_flap_state_changes",
            "must be >= 2 (one flap is two state changes)",
            self.ib_flap_state_changes,
        )

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, prefix: str = "classification.") -> Self:
        """Build from a dict (a TOML table); unknown keys and bad values raise PolicyError.

        Example: ``from_mapping({"retired_pages_rma": 0})`` raises
        ``PolicyError("classification.retired_pages_rma: must be >= 1, got 0")``.
        """
        return _build(cls, data, prefix)


@dataclasses.dataclass(frozen=True)
class CorrelationPolicy:
    """Windows that fold bursts and sympathetic errors into one incident."""

    dedupe_window_s: float = 180.0
    """The same fault on the same GPU within this long after an incident opened is a duplicate."""
    secondary_window_s: float = 180.0
    """How long after a root fault a secondary (Xid 45, 43, peer 74, 63/64 after 48) folds into it."""
    sticky_window_s: float = 3 * 3600.0
    """How long a sticky fault is remembered: a repeat within it is a recurrence of the same incident."""
    sticky_xids: tuple[int, ...] = (74, 79, 95, 109, 119)
    """Xids whose incidents are sticky (NVSentinel's analyzer list)."""

    def validate(self, prefix: str = "") -> None:
        """Check ranges; raise PolicyError naming the key."""
        for name in ("dedupe_window_s", "secondary_window_s", "sticky_window_s"):
            value = getattr(self, name)
            _require(value > 0, f"{prefix}{name}", "must be > 0", value)
        _require(
            self.sticky_window_s >= self.dedupe_window_s,
            f"{prefix}sticky_window_s",
            "must be >= dedupe_window_s",
            self.sticky_window_s,
        )

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, prefix: str = "correlation.") -> Self:
        """Build from a dict (a TOML table); unknown keys and bad values raise PolicyError."""
        return _build(cls, data, prefix)


@dataclasses.dataclass(frozen=True)
class EscalationPolicy:
    """The repair ladder: windows, per-rung attempt budgets, timeouts and optional rungs."""

    recurrence_window_s: float = 6 * 3600.0
    """After a repair, the same target faulting again within this long climbs one rung."""
    attempt_budget_window_s: float = 7 * 24 * 3600.0
    """Attempts per rung are counted over this window; an exhausted rung is skipped."""
    max_attempts_restart_process: int = 2
    """Process restarts per GPU within the budget window."""
    max_attempts_reset_gpu: int = 2
    """GPU resets per GPU within the budget window."""
    max_attempts_reboot_node: int = 2
    """Reboots per node within the budget window."""
    max_attempts_power_cycle_bmc: int = 1
    """BMC power cycles per node within the budget window."""
    bmc_power_cycle_enabled: bool = False
    """Whether the out-of-band power-cycle rung exists (needs a configured BMC hook)."""
    restart_process_timeout_s: float = 300.0
    """How long after dispatch a process restart may take before it counts as timed out."""
    reset_gpu_timeout_s: float = 600.0
    """How long after dispatch a GPU reset may take."""
    reboot_node_timeout_s: float = 1800.0
    """How long after dispatch a reboot may take (until the agent reports back)."""
    power_cycle_bmc_timeout_s: float = 1800.0
    """How long after dispatch a BMC power cycle may take."""
    validation_timeout_s: float = 3600.0
    """How long after dispatch a validation run may take."""
    validation_retries: int = 1
    """Re-runs after a "suspect" verdict or a validation that did not finish, before it counts as failed."""
    validate_after_restart: bool = False
    """Whether a process restart is followed by validation (the GPU itself was not touched)."""
    restart_grace_s: float = 30.0
    """SIGTERM-to-SIGKILL grace of a process restart."""
    counter_hold_s: float = 5.0
    """A memory error seen first in a counter (the DBE count, a pending row remap) waits this long for the
    kernel log's Xid that names it (48, 94, 95), whose catalog entry then decides the repair: Xid 94 restarts
    the application where the counter alone would reset the GPU. Counters are read about once a second."""
    post_repair_suite: str = "post-repair"
    """Validation suite run after a reset or reboot, and before an operator release."""
    accusation_suite: str = "accusation"
    """Validation suite run when a GPU is accused of silent data corruption or a result is suspect."""
    sdc_confirm_runs: int = 3
    """An accused GPU's failure counts as reproducible when ``sdc_confirm_fails`` of this many
    accusation-suite runs fail (``sdc.judge_accusation``)."""
    sdc_confirm_fails: int = 2
    sdc_hot_retest_suite: str = "post-repair"
    """The longer, hot suite that decides a one-off failure (sustained and pulsed stress included)."""
    sdc_watch_s: float = 14 * 86400.0
    """After an accused GPU is cleared, a second accusation within this long quarantines it at once."""
    drain_before: tuple[Literal["reset_gpu", "reboot_node", "power_cycle_bmc"], ...] = ()
    """Repairs preceded by a drain of the node's workload (``DrainNode``): any of "reset_gpu",
    "reboot_node", "power_cycle_bmc". Empty (the default): none, as with a scheduler that cannot evict
    (record only, Slurm, whose quarantine is a drain already); the Helm chart's Kubernetes install
    sets all three."""
    drain_pods: Literal["gpu", "all"] = "gpu"
    """What a drain evicts: "gpu" (pods using a GPU) or "all" (every pod but DaemonSets' and static ones)."""
    drain_deadline_s: float = 600.0
    """How long a drain may wait for disruption budgets (429 answers are retried with a backoff)."""
    drain_on_timeout: Literal["operator", "escalate"] = "operator"
    """A drain not finished by its deadline: "operator" (the ticket waits for a person, AWAITING_OPERATOR,
    with a notice naming the pods and the budget) or "escalate" (the repair goes ahead anyway, with a
    notice: the fault outranks the budget)."""

    @property
    def drain_node_timeout_s(self) -> float:
        """A drain's ladder timeout: its deadline and a minute for the last round and the answer."""
        return self.drain_deadline_s + 60.0

    def max_attempts(self, rung_name: str) -> int:
        """The attempt budget of a rung by its action word ("reset_gpu", ...)."""
        return int(getattr(self, f"max_attempts_{rung_name}"))

    def timeout_s(self, action_kind: str) -> float:
        """The timeout of a pending command by action kind ("reboot_node", "run_validation", ...)."""
        if action_kind == "run_validation":
            return self.validation_timeout_s
        return float(getattr(self, f"{action_kind}_timeout_s"))

    def validate(self, prefix: str = "") -> None:
        """Check ranges; raise PolicyError naming the key."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_s"):
                _require(value > 0, f"{prefix}{f.name}", "must be > 0", value)
            elif f.name.startswith("max_attempts_") or f.name == "validation_retries":
                _require(value >= 0, f"{prefix}{f.name}", "must be >= 0", value)
        for name in ("post_repair_suite", "accusation_suite", "sdc_hot_retest_suite"):
            _require(bool(getattr(self, name)), f"{prefix}{name}", "must not be empty", getattr(self, name))
        _require(self.sdc_confirm_fails >= 1, f"{prefix}sdc_confirm_fails", "must be >= 1", self.sdc_confirm_fails)
        _require(
            self.sdc_confirm_runs >= self.sdc_confirm_fails,
            f"{prefix}sdc_confirm_runs",
            f"must be >= sdc_confirm_fails ({self.sdc_confirm_fails})",
            self.sdc_confirm_runs,
        )

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, prefix: str = "escalation.") -> Self:
        """Build from a dict (a TOML table); unknown keys and bad values raise PolicyError.

        Example: ``from_mapping({"max_attempts_reset_gpu": -1})`` raises
        ``PolicyError("escalation.max_attempts_reset_gpu: must be >= 0, got -1")``.
        """
        return _build(cls, data, prefix)


@dataclasses.dataclass(frozen=True)
class DisruptionPolicy:
    """How much automation may take out of service at once, and when it must stop and ask."""

    max_disrupted_nodes: int = 8
    """Nodes that may be out of service by automation at once (rebooting, power-cycling, quarantined)."""
    max_disrupted_nodes_pct: float = 5.0
    """The same cap as a percentage of all nodes; the smaller of the two applies (floored at 1 node)."""
    domain_max_nodes: Mapping[str, int] = dataclasses.field(
        default_factory=lambda: types.MappingProxyType({"rack": 2, "nvlink_domain": 1, "power_feed": 4})
    )
    """Per topology label (a node label naming its rack, NVLink domain, power feed): nodes of one
    domain that may be out of service at once. The budget knows the labels named here or in
    domain_max_pct; a label with no entry here has only the percentage cap."""
    domain_max_pct: Mapping[str, float] = dataclasses.field(
        default_factory=lambda: types.MappingProxyType({"rack": 25.0, "nvlink_domain": 25.0, "power_feed": 10.0})
    )
    """The same per-domain cap as a percentage of the domain's nodes; the smaller of the two
    applies, floored at 1 node so every domain can still repair."""
    breaker_quarantine_pct: float = 10.0
    """The breaker trips when more than this percentage of nodes need a node-level action ..."""
    breaker_window_s: float = 600.0
    """... within this long. It then holds until an operator resumes automation."""
    breaker_min_nodes: int = 3
    """The breaker never trips for fewer nodes than this (a 2-node lab losing one is not a storm)."""
    storm_cooldown_s: float = 600.0
    """After a storm (node actions waiting for the cluster cap) drains, or after a resume, new
    node-level actions wait this long so statuses can settle. A wait for a domain's cap is no storm."""
    in_flight_max_age_s: float = 4 * 3600.0
    """An admitted node-level action whose result never came stops counting after this long."""

    def validate(self, prefix: str = "") -> None:
        """Check ranges; raise PolicyError naming the key."""
        for name in ("max_disrupted_nodes", "breaker_min_nodes"):
            value = getattr(self, name)
            _require(value >= 0, f"{prefix}{name}", "must be >= 0", value)
        for name in ("max_disrupted_nodes_pct", "breaker_quarantine_pct"):
            value = getattr(self, name)
            _require(0 < value <= 100, f"{prefix}{name}", "must be in (0, 100]", value)
        for label, count in self.domain_max_nodes.items():
            _require(count >= 0, f"{prefix}domain_max_nodes.{label}", "must be >= 0", count)
        for label, pct in self.domain_max_pct.items():
            _require(0 < pct <= 100, f"{prefix}domain_max_pct.{label}", "must be in (0, 100]", pct)
        for name in ("breaker_window_s", "in_flight_max_age_s"):
            value = getattr(self, name)
            _require(value > 0, f"{prefix}{name}", "must be > 0", value)
        _require(self.storm_cooldown_s >= 0, f"{prefix}storm_cooldown_s", "must be >= 0", self.storm_cooldown_s)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, prefix: str = "disruption.") -> Self:
        """Build from a dict (a TOML table); unknown keys and bad values raise PolicyError."""
        return _build(cls, data, prefix)


@dataclasses.dataclass(frozen=True)
class SdcPolicy:
    """Rolling SDC sweeps of idle nodes and the suspicion score (``[remediation.sdc]``)."""

    sweep_enabled: bool = False
    """Whether idle nodes are swept at all."""
    sweep_suite: str = "quick"
    sweep_interval_s: float = 300.0
    """How often the planner runs."""
    sweep_share_pct: float = 2.0
    """Share of the idle nodes started per pass (at least one when any is due)."""
    sweep_max_concurrent: int = 2
    """Sweeps in flight at once, fleet-wide."""
    sweep_min_interval_s: float = 7 * 86400.0
    """A node is swept at most this often."""
    sweep_reserve_slots: int = 1
    """Disruption-budget slots a sweep never takes: repairs always find room."""
    idle_power_pct: float = 30.0
    """A GPU drawing below this share of its power limit counts as idle."""
    seed_rotation_s: float = 86400.0
    """Sweep seeds change this often, so repeated sweeps test different data."""
    suspicion_half_life_s: float = 30 * 86400.0

    def validate(self, prefix: str = "") -> None:
        """Check ranges; raise PolicyError naming the key."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_s"):
                _require(value > 0, f"{prefix}{f.name}", "must be > 0", value)
        for name in ("sweep_share_pct", "idle_power_pct"):
            value = getattr(self, name)
            _require(0 < value <= 100, f"{prefix}{name}", "must be in (0, 100]", value)
        for name in ("sweep_max_concurrent", "sweep_reserve_slots"):
            _require(getattr(self, name) >= 0, f"{prefix}{name}", "must be >= 0", getattr(self, name))
        _require(bool(self.sweep_suite), f"{prefix}sweep_suite", "must not be empty", self.sweep_suite)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, prefix: str = "sdc.") -> Self:
        """Build from a dict (a TOML table); unknown keys and bad values raise PolicyError."""
        return _build(cls, data, prefix)


MIN_LOST_AFTER_S = 20.0
"""Four of the agent's 5 s heartbeats and of the replicas' 5 s last-seen flushes: any less, and a live node
whose flush came late would be taken for lost."""


@dataclasses.dataclass(frozen=True)
class LostNodePolicy:
    """The lost-node watch (``[remediation.lost_nodes]``, `lost_nodes`): when a silent node is taken for lost."""

    enabled: bool = True
    """False: no node is ever taken for lost here (the scheduler's own NotReady timeout is all there is)."""
    lost_after_s: float = 60.0
    """Silence (no event, summary or heartbeat on any replica) after which an in-service node is lost. Far
    above the agent's 5 s heartbeat and the replicas' 5 s last-seen flush, so a slow flush or an agent
    restart (a few seconds under systemd) is never taken for a dead host; a node that went silent was
    quarantined about this long after, against the 300 s a Kubernetes scheduler waits to evict its pods."""
    check_interval_s: float = 10.0
    """How often the leader reads the nodes' last-seen times (one query)."""
    stalled_lost_after_s: float = 20.0
    """When the straggler watch names a hung job (`core.stall`), the leader checks at once with this
    shorter silence: a dead host hangs the job it runs, so the stall corroborates the silence. At least
    `MIN_LOST_AFTER_S` (a late flush is still no loss); a node named so and heard again is released
    as any lost node is (``release_on_return``)."""
    storm_min_nodes: int = 16
    """Up to this many nodes lost at once are always believed (a rack's PDU trips)."""
    release_on_return: bool = True
    """A lost node heard from again (its agent streams again: a host that rebooted itself, a partition
    healed) is validated and, on a pass, released, as `rasctl release` would; False: it waits for a person."""
    relapse_window_s: float = 86400.0
    """A node back once already within this long is left quarantined for a person when it comes back again."""
    storm_fraction_pct: float = 5.0
    """More than this share of the nodes seen this term lost at once (and more than ``storm_min_nodes``) is
    taken for the controller's own trouble (a partition, a store not taking last-seen writes): no node
    is named; the storm is logged and exported."""

    def validate(self, prefix: str = "") -> None:
        """Check ranges; raise PolicyError naming the key."""
        for name in ("lost_after_s", "stalled_lost_after_s"):
            value = getattr(self, name)
            _require(value >= MIN_LOST_AFTER_S, f"{prefix}{name}", f"must be >= {MIN_LOST_AFTER_S:g}", value)
        for name in ("check_interval_s", "relapse_window_s"):
            _require(getattr(self, name) > 0, f"{prefix}{name}", "must be > 0", getattr(self, name))
        _require(self.storm_min_nodes >= 1, f"{prefix}storm_min_nodes", "must be >= 1", self.storm_min_nodes)
        value = self.storm_fraction_pct
        _require(0 < value <= 100, f"{prefix}storm_fraction_pct", "must be in (0, 100]", value)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, prefix: str = "lost_nodes.") -> Self:
        """Build from a dict (a TOML table); unknown keys and bad values raise PolicyError."""
        return _build(cls, data, prefix)


@dataclasses.dataclass(frozen=True)
class RemediationPolicy:
    """All remediation settings; the ``[remediation]`` part of ``controller.toml``."""

    classification: ClassificationPolicy = ClassificationPolicy()
    correlation: CorrelationPolicy = CorrelationPolicy()
    escalation: EscalationPolicy = EscalationPolicy()
    disruption: DisruptionPolicy = DisruptionPolicy()
    sdc: SdcPolicy = SdcPolicy()
    lost_nodes: LostNodePolicy = LostNodePolicy()

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, prefix: str = "") -> Self:
        """Build from a dict with optional tables classification, correlation, escalation, disruption, sdc, lost_nodes.

        Example: ``from_mapping({"escalation": {"reboot_node_timeout_s": 900}})`` keeps every other
        default; ``from_mapping({"escalaton": {}})`` raises ``PolicyError("escalaton: unknown
        setting ...")``.
        """
        if not isinstance(data, Mapping):
            raise PolicyError(f"{prefix or '<root>'}: expected a table, got {data!r}")
        groups = {
            "classification": ClassificationPolicy,
            "correlation": CorrelationPolicy,
            "escalation": EscalationPolicy,
            "disruption": DisruptionPolicy,
            "sdc": SdcPolicy,
            "lost_nodes": LostNodePolicy,
        }
        values: dict[str, Any] = {}
        for key, value in data.items():
            group = groups.get(key)
            if group is None:
                raise PolicyError(f"{prefix}{key}: unknown setting (known: {', '.join(sorted(groups))})")
            values[key] = group.from_mapping(value, prefix=f"{prefix}{key}.")
        return cls(**values)
