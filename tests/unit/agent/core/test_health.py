"""Counter movements become health observations; unsupported counters never do."""

from __future__ import annotations

import dataclasses

import pytest

from rasd.agent.core import health, model

K = model.EventKind
S = 1_000_000_000


def _counters(t_s: float = 0.0, **fields) -> model.GpuCounters:
    base = {
        "gpu_uuid": "GPU-1",
        "sample_unix_ns": int(t_s * S),
        "enforced_power_limit_w": 700,
        "ecc_sbe_volatile": 0,
        "ecc_dbe_volatile": 0,
        "retired_pages_dbe": 0,
        "retired_pages_pending": False,
        "remapped_rows_pending": False,
        "remapped_rows_failure": False,
        "pcie_replay_count": 0,
        "recovery_action": 0,
        "clock_event_reasons": 0,
        "nvlinks": (model.NvLinkCounters(0, True, 0, 0, 0),),
    }
    base.update(fields)
    return model.GpuCounters(**base)


def _kinds(previous, current, **kwargs):
    return [o.kind for o in health.evaluate(previous, current, **kwargs)]


def test_first_sample_is_a_baseline():
    assert health.evaluate(None, _counters(ecc_dbe_volatile=5)) == ()


@pytest.mark.parametrize(
    ("change", "kind"),
    [
        ({"ecc_dbe_volatile": 1}, K.ECC_DBE),
        ({"ecc_sbe_volatile": 50}, K.ECC_SBE_RATE),
        ({"remapped_rows_pending": True}, K.ROW_REMAP_PENDING),
        ({"remapped_rows_failure": True}, K.ROW_REMAP_FAILURE),
        ({"retired_pages_pending": True}, K.RETIRED_PAGES),
        ({"retired_pages_dbe": 1}, K.RETIRED_PAGES),
        ({"nvlinks": (model.NvLinkCounters(0, False, 0, 0, 0),)}, K.NVLINK_DOWN),
        ({"nvlinks": (model.NvLinkCounters(0, True, 500, 0, 0),)}, K.NVLINK_ERRORS),
        ({"pcie_replay_count": 100}, K.PCIE_REPLAY),
        ({"recovery_action": 2}, K.RECOVERY_ACTION),
        ({"clock_event_reasons": int(model.ClockEventReason.HW_THERMAL_SLOWDOWN)}, K.THERMAL),
    ],
)
def test_each_counter_rule(change, kind):
    assert _kinds(_counters(0), _counters(1, **change)) == [kind]


def test_slow_counter_growth_is_not_a_finding():
    assert _kinds(_counters(0), _counters(10, ecc_sbe_volatile=5, pcie_replay_count=3)) == []


def test_unsupported_counters_never_produce_findings():
    previous = _counters(0, ecc_dbe_volatile=None, remapped_rows_pending=None)
    assert _kinds(previous, _counters(1, ecc_dbe_volatile=3, remapped_rows_pending=True)) == []


def test_a_counter_reset_after_reboot_is_not_an_error():
    assert _kinds(_counters(0, ecc_dbe_volatile=4), _counters(1, ecc_dbe_volatile=0)) == []


def test_recovery_action_reboot_is_fatal_and_named():
    (finding,) = health.evaluate(_counters(0), _counters(1, recovery_action=2))
    assert finding.severity is model.Severity.FATAL
    assert "Node Reboot Required" in finding.message


def test_power_excursion_is_reported_when_it_starts_not_while_it_lasts():
    previous, current = _counters(0), _counters(1)
    assert _kinds(previous, current, power_w=900.0, previous_power_w=650.0) == [K.POWER_EXCURSION]
    assert _kinds(previous, current, power_w=900.0, previous_power_w=910.0) == []
    assert _kinds(previous, current, power_w=720.0, previous_power_w=650.0) == []


def test_findings_carry_the_gpu_and_the_sample_time():
    (finding,) = health.evaluate(_counters(0), _counters(2.5, ecc_dbe_volatile=1))
    assert finding.gpu_uuid == "GPU-1" and finding.observed_unix_ns == int(2.5 * S)
    assert dataclasses.asdict(finding)["source"] == "nvml_counters"
