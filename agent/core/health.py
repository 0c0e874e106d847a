"""Counter-derived health findings: compare two samples of one GPU and say what changed. Pure.

NVML's event set reports XIDs and some ECC events as they happen; most RAS signals, though, only
show as counters moving between two samples. `evaluate()` turns those movements into observations
with the same vocabulary as the kernel log and the event set, so the controller sees one stream.

Rules (previous → current, per GPU; None on either side means unsupported: no finding):

| signal | finding | severity |
|---|---|---|
| ecc_dbe_volatile rises | ECC_DBE | FATAL |
| ecc_sbe_volatile rises faster than sbe_rate_per_s | ECC_SBE_RATE | WARNING |
| remapped_rows_pending false → true | ROW_REMAP_PENDING | ERROR |
| remapped_rows_failure false → true | ROW_REMAP_FAILURE | FATAL |
| retired_pages_pending false → true, or retired DBE pages rise | RETIRED_PAGES | ERROR |
| an NVLink goes active → inactive | NVLINK_DOWN | ERROR |
| a link's CRC+replay+recovery errors rise faster than nvlink_errors_per_s | NVLINK_ERRORS | WARNING |
| pcie_replay_count rises faster than pcie_replays_per_s | PCIE_REPLAY | WARNING |
| recovery_action changes to non-zero | RECOVERY_ACTION | FATAL for reboot, ERROR otherwise |
| thermal slowdown clock reason appears | THERMAL | WARNING |
| draw above the enforced cap by more than excursion_ratio | POWER_EXCURSION | WARNING |

Example: previous ecc_dbe_volatile=0, current ecc_dbe_volatile=2 → (Observation(kind=ECC_DBE,
message="volatile DBE count 0 → 2", severity=FATAL),).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

from rasd.agent.core import model

_THERMAL = model.ClockEventReason.SW_THERMAL_SLOWDOWN | model.ClockEventReason.HW_THERMAL_SLOWDOWN
_RECOVERY_NAMES = {1: "GPU Reset Required", 2: "Node Reboot Required", 3: "Drain P2P", 4: "Drain and Reset"}


@dataclasses.dataclass(frozen=True)
class HealthThresholds:
    """Rates above which a rising counter becomes a finding."""

    sbe_rate_per_s: float = 1.0
    """Corrected ECC errors per second worth reporting."""
    nvlink_errors_per_s: float = 10.0
    """CRC + replay + recovery errors per second on one link."""
    pcie_replays_per_s: float = 5.0
    """PCIe replays per second."""
    excursion_ratio: float = 0.10
    """Draw above enforced cap × (1 + ratio) is an excursion."""


def _rose(before: int | None, after: int | None) -> int:
    if before is None or after is None or after <= before:
        return 0
    return after - before


@dataclasses.dataclass(frozen=True)
class _Change:
    """One GPU's two samples, and what `evaluate` was given with them: what every rule reads."""

    previous: model.GpuCounters
    current: model.GpuCounters
    interval_s: float
    """Seconds between the two samples (at least 1 ms)."""
    power_w: float | None
    previous_power_w: float | None
    thresholds: HealthThresholds

    def finding(
        self, kind: model.EventKind, severity: model.Severity, message: str, **attributes: str
    ) -> model.Observation:
        """An observation about this GPU at the current sample's time."""
        current = self.current
        return model.Observation(
            kind, current.sample_unix_ns, message, "nvml_counters", current.gpu_uuid, None, severity, attributes
        )


def evaluate(
    previous: model.GpuCounters | None,
    current: model.GpuCounters,
    *,
    power_w: float | None = None,
    previous_power_w: float | None = None,
    thresholds: HealthThresholds = HealthThresholds(),
) -> tuple[model.Observation, ...]:
    """Findings from one GPU's counters moving between two samples (the first sample is a baseline).

    power_w and previous_power_w are the draws at the two samples; an excursion is reported when it
    starts, not on every sample while it lasts. Findings come in the order of the table above.
    """
    if previous is None:
        return ()
    change = _Change(
        previous=previous,
        current=current,
        interval_s=max((current.sample_unix_ns - previous.sample_unix_ns) / 1e9, 1e-3),
        power_w=power_w,
        previous_power_w=previous_power_w,
        thresholds=thresholds,
    )
    return tuple(finding for rule in _RULES for finding in rule(change))


def _ecc(change: _Change) -> Iterator[model.Observation]:
    previous, current = change.previous, change.current
    dbe = _rose(previous.ecc_dbe_volatile, current.ecc_dbe_volatile)
    if dbe:
        yield change.finding(
            model.EventKind.ECC_DBE,
            model.Severity.FATAL,
            f"volatile DBE count {previous.ecc_dbe_volatile} → {current.ecc_dbe_volatile}",
            delta=str(dbe),
        )
    sbe_per_s = _rose(previous.ecc_sbe_volatile, current.ecc_sbe_volatile) / change.interval_s
    if sbe_per_s > change.thresholds.sbe_rate_per_s:
        yield change.finding(
            model.EventKind.ECC_SBE_RATE,
            model.Severity.WARNING,
            f"{sbe_per_s:.1f} corrected ECC errors/s",
            ecc_sbe_rate_per_s=f"{sbe_per_s:.3f}",
        )


def _row_remap(change: _Change) -> Iterator[model.Observation]:
    previous, current = change.previous, change.current
    remap_attributes = {
        name: str(value)
        for name, value in (
            ("remapped_rows_uncorrectable", current.remapped_rows_uncorrectable),
            ("remapped_rows_correctable", current.remapped_rows_correctable),
        )
        if value is not None
    }
    if current.remapped_rows_pending and previous.remapped_rows_pending is False:
        yield change.finding(
            model.EventKind.ROW_REMAP_PENDING,
            model.Severity.ERROR,
            "row remap pending: a GPU reset applies it",
            **remap_attributes,
        )
    if current.remapped_rows_failure and previous.remapped_rows_failure is False:
        yield change.finding(
            model.EventKind.ROW_REMAP_FAILURE,
            model.Severity.FATAL,
            "row remapping failed",
            **remap_attributes,
        )


def _retired_pages(change: _Change) -> Iterator[model.Observation]:
    previous, current = change.previous, change.current
    retired = _rose(previous.retired_pages_dbe, current.retired_pages_dbe)
    if retired or (current.retired_pages_pending and previous.retired_pages_pending is False):
        yield change.finding(
            model.EventKind.RETIRED_PAGES,
            model.Severity.ERROR,
            f"retired DBE pages {previous.retired_pages_dbe} → {current.retired_pages_dbe}, "
            f"pending {current.retired_pages_pending}",
            retired_pages=str((current.retired_pages_dbe or 0) + (current.retired_pages_sbe or 0)),
            retired_pages_pending=str(bool(current.retired_pages_pending)).lower(),
        )


def _nvlinks(change: _Change) -> Iterator[model.Observation]:
    previous, current = change.previous, change.current
    links_now = current.sample_unix_ns if current.nvlink_sample_unix_ns is None else current.nvlink_sample_unix_ns
    links_before = previous.sample_unix_ns if previous.nvlink_sample_unix_ns is None else previous.nvlink_sample_unix_ns
    link_interval_s = max((links_now - links_before) / 1e9, 1e-3)
    # Links read less often than the other counters repeat their last reading: nothing new to compare.
    if links_now == links_before:
        return
    before_links = {link.link: link for link in previous.nvlinks}
    for link in current.nvlinks:
        old = before_links.get(link.link)
        if old is None:
            continue
        if old.active and not link.active:
            yield change.finding(
                model.EventKind.NVLINK_DOWN, model.Severity.ERROR, f"NVLink {link.link} went down", link=str(link.link)
            )
        errors = sum(
            _rose(getattr(old, name), getattr(link, name))
            for name in ("crc_errors", "replay_errors", "recovery_errors")
        )
        if errors / link_interval_s > change.thresholds.nvlink_errors_per_s:
            yield change.finding(
                model.EventKind.NVLINK_ERRORS,
                model.Severity.WARNING,
                f"NVLink {link.link}: {errors / link_interval_s:.0f} errors/s",
                link=str(link.link),
                nvlink_errors_per_s=f"{errors / link_interval_s:.3f}",
            )


def _pcie_replays(change: _Change) -> Iterator[model.Observation]:
    replays_per_s = _rose(change.previous.pcie_replay_count, change.current.pcie_replay_count) / change.interval_s
    if replays_per_s > change.thresholds.pcie_replays_per_s:
        yield change.finding(
            model.EventKind.PCIE_REPLAY,
            model.Severity.WARNING,
            f"{replays_per_s:.0f} PCIe replays/s",
            pcie_replays_per_s=f"{replays_per_s:.3f}",
        )


def _recovery_action(change: _Change) -> Iterator[model.Observation]:
    action = change.current.recovery_action
    if action and action != change.previous.recovery_action:
        name = _RECOVERY_NAMES.get(action, str(action))
        yield change.finding(
            model.EventKind.RECOVERY_ACTION,
            model.Severity.FATAL if action == 2 else model.Severity.ERROR,
            f"GPU recovery action changed to {name}",
            recovery_action=str(action),
        )


def _thermal(change: _Change) -> Iterator[model.Observation]:
    was_thermal = bool((change.previous.clock_event_reasons or 0) & _THERMAL)
    if (change.current.clock_event_reasons or 0) & _THERMAL and not was_thermal:
        yield change.finding(
            model.EventKind.THERMAL,
            model.Severity.WARNING,
            "thermal slowdown",
            temperature_c=str(change.current.temperature_c),
        )


def _power_excursion(change: _Change) -> Iterator[model.Observation]:
    limit = change.current.enforced_power_limit_w

    def over(draw_w: float | None, cap_w: int | None) -> bool:
        return draw_w is not None and bool(cap_w) and draw_w > cap_w * (1 + change.thresholds.excursion_ratio)  # type: ignore[operator]

    power_w = change.power_w
    if over(power_w, limit) and not over(change.previous_power_w, change.previous.enforced_power_limit_w):
        yield change.finding(
            model.EventKind.POWER_EXCURSION,
            model.Severity.WARNING,
            f"draw {power_w:.0f} W above enforced cap {limit} W",
            power_w=f"{power_w:.1f}",
            power_limit_w=str(limit),
        )


_RULES: tuple[Callable[[_Change], Iterator[model.Observation]], ...] = (
    _ecc,
    _row_remap,
    _retired_pages,
    _nvlinks,
    _pcie_replays,
    _recovery_action,
    _thermal,
    _power_excursion,
)
"""The rules in the module table's order, which is the order of `evaluate`'s findings."""
