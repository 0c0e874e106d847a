"""The agent's exposition as operators who run dcgm-exporter expect it (issue #38 item 5), read from the
NVML double: dcgm-exporter's labels with its meanings, counters as `_total`, one series per clock event
reason, build info, no `_created`, per-link NVLink series opt-in, the series count docs/metrics.md
states, promtool's check, and a PromQL join with dcgm-exporter-shaped series."""

from __future__ import annotations

import dataclasses
import pathlib
import re
import shutil
import subprocess

import fake_nvml
import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rasd.agent import metrics
from rasd.agent.core import model
from rasd.common import VERSION, exposition

REPO = pathlib.Path(__file__).resolve().parents[4]
HOSTNAME = "gpu-host-7"
NODE = "gpu-node-7"
DCGM_LABELS = ("gpu", "UUID", "pci_bus_id", "Hostname", "modelName")


def _exposition(backend, nvlink_per_link: bool = False, counters=None) -> str:
    """The agent's exposition over an open backend's inventory, one counter read and one power read."""
    power = {r.gpu_uuid: r for r in backend.read_power(1)}
    latest = {c.gpu_uuid: c for c in counters} if counters is not None else {
        c.gpu_uuid: c for c in backend.read_counters(1)
    }  # fmt: skip
    stats = {"spool_depth": 0, "connected": 1.0, "power_samples": 3, "failsafe_applied": 0}
    registry = CollectorRegistry()
    exposition.prepare_registry(registry)
    registry.register(
        metrics.AgentCollector(
            NODE, HOSTNAME, backend.inventory(), lambda: power, lambda: latest, lambda: stats, dict, nvlink_per_link
        )
    )
    return generate_latest(registry).decode()


def _families(text: str) -> dict[str, object]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def _series(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


@pytest.fixture
def eight_h100(install_fake, open_backend):
    install_fake(fake_nvml.FakeNvml([fake_nvml.h100_sxm5(i) for i in range(8)]))
    return open_backend(watch_events=False, nvlink_interval_s=0)


def test_per_gpu_series_carry_dcgm_exporters_labels_with_its_meanings(install_fake, open_backend):
    # NVML's index order differs from PCI bus order here: `gpu` must be the NVML index all the same.
    gpus = [fake_nvml.h100_sxm5(1), fake_nvml.h100_sxm5(0)]
    install_fake(fake_nvml.FakeNvml(gpus))
    backend = open_backend(watch_events=False)
    power = _families(_exposition(backend))["rasd_gpu_power_watts"]
    labels = sorted((s.labels for s in power.samples), key=lambda labels: labels["gpu"])
    assert labels == [
        {"node": NODE, "gpu": str(index), "UUID": gpu.uuid, "pci_bus_id": gpu.pci_bus_id, "Hostname": HOSTNAME,
         "modelName": "NVIDIA H100 80GB HBM3"}
        for index, gpu in enumerate(gpus)
    ]  # fmt: skip
    assert [g.pci_bus_id for g in backend.inventory()] == sorted(g.pci_bus_id for g in gpus)


def test_counter_like_values_are_counters_with_total_and_states_are_gauges(eight_h100):
    text = _exposition(eight_h100)
    families = _families(text)
    counters = {"rasd_gpu_energy_joules", "rasd_gpu_ecc_errors", "rasd_gpu_remapped_rows", "rasd_gpu_pcie_replays",
                "rasd_gpu_nvlink_errors", "rasd_agent_power_samples", "rasd_agent_failsafe_applied"}  # fmt: skip
    assert {name for name, family in families.items() if family.type == "counter"} >= counters
    assert all(s.name.endswith("_total") for name in counters for s in families[name].samples)
    for gauge in ("rasd_gpu_power_watts", "rasd_gpu_temperature_celsius", "rasd_gpu_remapped_rows_pending"):
        assert families[gauge].type == "gauge"
    assert "_created" not in text
    ecc = {(s.name, s.labels["type"], s.labels["scope"]) for s in families["rasd_gpu_ecc_errors"].samples}
    assert ("rasd_gpu_ecc_errors_total", "dbe", "aggregate") in ecc


def test_one_zero_or_one_series_per_clock_event_reason(eight_h100):
    counters = eight_h100.read_counters(1)
    first = counters[0].gpu_uuid
    reasons = model.ClockEventReason.SW_POWER_CAP | model.ClockEventReason.HW_THERMAL_SLOWDOWN | 0x1000
    with_reasons = [dataclasses.replace(c, clock_event_reasons=int(reasons)) if c.gpu_uuid == first else c
                    for c in counters]  # fmt: skip
    family = _families(_exposition(eight_h100, counters=with_reasons))["rasd_gpu_clock_event_reason"]
    assert family.type == "gauge"
    on_first = {s.labels["reason"]: s.value for s in family.samples if s.labels["UUID"] == first}
    assert on_first == {
        "gpu_idle": 0, "applications_clocks_setting": 0, "sw_power_cap": 1, "hw_slowdown": 0, "sync_boost": 0,
        "sw_thermal_slowdown": 0, "hw_thermal_slowdown": 1, "hw_power_brake_slowdown": 0,
        "display_clock_setting": 0, "other": 1,
    }  # fmt: skip
    assert len(family.samples) == 8 * len(on_first)


def test_build_info_is_one_series_with_the_version(eight_h100):
    build = _families(_exposition(eight_h100))["rasd_build_info"]
    assert [(s.labels, s.value) for s in build.samples] == [({"version": VERSION}, 1.0)]


def test_per_link_nvlink_series_are_opt_in_and_the_sums_always_there(eight_h100):
    default = _families(_exposition(eight_h100))
    assert "rasd_gpu_nvlink_link_errors" not in default and "rasd_gpu_nvlink_link_active" not in default
    active = {s.labels["UUID"]: s.value for s in default["rasd_gpu_nvlinks_active"].samples}
    assert sorted(set(active.values())) == [18.0]
    per_link = _families(_exposition(eight_h100, nvlink_per_link=True))
    assert len(per_link["rasd_gpu_nvlink_link_active"].samples) == 8 * 18
    link_errors = per_link["rasd_gpu_nvlink_link_errors"].samples
    for error_type in ("crc", "replay", "recovery"):
        summed = sum(s.value for s in default["rasd_gpu_nvlink_errors"].samples if s.labels["type"] == error_type)
        assert summed == sum(s.value for s in link_errors if s.labels["type"] == error_type)


def test_the_series_count_per_8_gpu_node_is_the_one_the_metrics_page_states(eight_h100):
    """docs/metrics.md states the count measured here; a change to the exposition must update it."""
    default = len(_series(_exposition(eight_h100)))
    per_link = len(_series(_exposition(eight_h100, nvlink_per_link=True)))
    page = (REPO / "docs" / "metrics.md").read_text()
    stated = re.search(r"8 H100s.*?: \*\*(\d[\d,]*)\*\* series.*?\*\*(\d[\d,]*)\*\* with", page, re.S)
    assert stated is not None, "docs/metrics.md no longer states the series count per 8-GPU node"
    assert (int(stated[1].replace(",", "")), int(stated[2].replace(",", ""))) == (default, per_link)


def test_every_agent_series_is_on_the_metrics_page_with_its_type(eight_h100):
    page = (REPO / "docs" / "metrics.md").read_text()
    rows = dict(re.findall(r"^\| `(rasd_[a-z0-9_]+)` \| (gauge|counter|histogram) \|", page, re.M))
    families = _families(_exposition(eight_h100, nvlink_per_link=True))
    families.pop("rasd_build_info")  # a line of its own on the page
    missing = {name: family.type for name, family in families.items() if rows.get(name) != family.type}
    assert missing == {}  # counters are listed without `_total`, as the client library names them


def _promtool() -> str:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus; .ci/run installs it)")
    return promtool


@pytest.mark.parametrize("nvlink_per_link", [False, True])
def test_the_exposition_passes_promtool_check_metrics(eight_h100, nvlink_per_link, check_metrics):
    check_metrics(_exposition(eight_h100, nvlink_per_link))


def test_a_rasd_series_joins_dcgm_exporters_on_the_shared_labels(install_fake, open_backend, tmp_path):
    """PromQL, through promtool: rasd's power minus dcgm-exporter's, matched on dcgm-exporter's labels only."""
    gpus = [fake_nvml.h100_sxm5(1), fake_nvml.h100_sxm5(0)]  # NVML order is not PCI order
    install_fake(fake_nvml.FakeNvml(gpus))
    backend = open_backend(watch_events=False)
    rasd_power = _families(_exposition(backend))["rasd_gpu_power_watts"].samples
    # dcgm-exporter's exposition of the same GPUs, from NVML's own facts (index, UUID, bus id, name).
    input_series = [
        {"series": _selector("rasd_gpu_power_watts", {**s.labels, "job": "rasd-agent", "instance": "n7:8455"}),
         "values": f"{s.value}x5"}
        for s in rasd_power
    ] + [
        {"series": _selector("DCGM_FI_DEV_POWER_USAGE", {
            "gpu": str(index), "UUID": gpu.uuid, "pci_bus_id": gpu.pci_bus_id, "device": f"nvidia{index}",
            "modelName": gpu.name, "Hostname": HOSTNAME, "job": "dcgm-exporter", "instance": "n7:9400"}),
         "values": "100x5"}
        for index, gpu in enumerate(gpus)
    ]  # fmt: skip
    on = ", ".join(DCGM_LABELS)
    expected = [
        {"labels": _selector("", {label: s.labels[label] for label in DCGM_LABELS}), "value": s.value - 100}
        for s in rasd_power
    ]
    tests = {
        "tests": [{
            "interval": "1m",
            "input_series": input_series,
            "promql_expr_test": [{
                "expr": f"rasd_gpu_power_watts - on ({on}) DCGM_FI_DEV_POWER_USAGE",
                "eval_time": "2m",
                "exp_samples": expected,
            }],
        }]
    }  # fmt: skip
    path = tmp_path / "join.test.yaml"
    path.write_text(yaml.safe_dump(tests))
    result = subprocess.run([_promtool(), "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(expected) == 2


def _selector(name: str, labels: dict[str, str]) -> str:
    return name + "{" + ", ".join(f'{key}="{value}"' for key, value in sorted(labels.items())) + "}"
